"""workload=conversation served on model=tiny_random: each turn re-sends the previous answer, arrives
no sooner than that answer plus the think time, a paged pool's shared blocks serve part of the
prompts only with block sharing on, and a session's kept cache gives the same greedy tokens as
recomputing its history."""

from __future__ import annotations

import json

import pytest

from kvpipe.job.phases import eos_ids
from kvpipe.job.runner import job_for
from kvpipe.schedule import run_rounds
from kvpipe.workload.base import until_eos

from conftest import TINY, run_cli, spec_for

THINK_S = 0.03
SESSIONS = (*TINY, "workload=conversation", "workload.sessions=2", "workload.turns=3",
            f"workload.think_time_s={THINK_S}", "workload.repeats=1", "model.threads=1")  # fmt: skip


def served_job(*overrides: str):
    job = job_for(spec_for(*SESSIONS, *overrides))
    job.prepare()
    run_rounds([job], seed=0, shuffle=False)
    return job


def by_session(job) -> dict[int, list]:
    """Each session position's turns as served, in turn order: (request, served)."""
    turns: dict[int, list] = {}
    for position, _turn, request, served in sorted(job.turns_served(), key=lambda item: item[:2]):
        turns.setdefault(position, []).append((request, served))
    return turns


@pytest.mark.slow  # a real served job (~2 s)
def test_each_turn_re_sends_the_previous_answer_and_arrives_no_sooner_than_it_plus_the_think_time():
    job = served_job("load=concurrency", "load.concurrency=2")
    tokenizer, eos = job.loaded.tokenizer, eos_ids(job.loaded.model)
    turns = by_session(job)
    assert len(turns) == 2 and all(len(session) == 3 for session in turns.values())
    for session in turns.values():
        for (request, served), (next_request, next_served) in zip(session, session[1:]):
            answer = tokenizer.decode(until_eos(served.tokens, eos), skip_special_tokens=True)
            assert answer.strip() and answer in tokenizer.decode(next_request.ids)
            assert next_request.ids[: len(request.ids) - 3] == request.ids[:-3]  # its history, less the assistant's cue
            assert next_served.arrival_s >= served.finished_s + THINK_S
            assert len(next_request.ids) > len(request.ids)
    result = job.result({})
    assert result.metrics["served_requests"] == 6 and result.metrics["max_in_flight"] <= 2
    assert result.metrics["ttft_first_turn_p50_ms"] > 0 and result.metrics["ttft_later_turns_p50_ms"] > 0
    assert "prefix_hit_rate" not in result.metrics  # recomputing every turn: nothing served from a cache


@pytest.mark.slow  # two paged jobs (~3 s)
def test_a_paged_pool_serves_part_of_each_later_turn_from_shared_blocks_only_with_block_sharing():
    overrides = ("cache=paged", "load=offline", "cache.block_size=16")
    sharing, not_sharing = (served_job(*overrides, f"cache.allow_block_sharing={on}") for on in ("true", "false"))
    shared, unshared = sharing.result({}).metrics, not_sharing.result({}).metrics
    assert 0 < shared["prefix_hit_rate"] < 1 and unshared["prefix_hit_rate"] == 0
    assert shared["kv_held_bytes"] > 0
    # each request's own count, in its row: they add up to the job's
    hits = [row["prefix_hit_tokens"] for row in sharing.request_rows]
    prompts = sum(row["prompt_tokens"] for row in sharing.request_rows)
    assert sum(hits) / prompts == pytest.approx(shared["prefix_hit_rate"]) and hits[0] == 0  # a first turn's: none
    assert {row["prefix_hit_tokens"] for row in not_sharing.request_rows} == {0}


@pytest.mark.slow  # two served jobs (~3 s)
def test_a_kept_session_cache_gives_the_same_greedy_tokens_as_recomputing_the_history():
    one_at_a_time = ("load=concurrency", "load.concurrency=1")  # unpadded batches of one, as kept caches run
    recomputed, kept = served_job(*one_at_a_time), served_job(*one_at_a_time, "workload.keep_session_cache=true")
    answers = [[served.tokens for _, served in session] for session in by_session(recomputed).values()]
    assert answers == [[served.tokens for _, served in session] for session in by_session(kept).values()]
    metrics = kept.result({}).metrics
    prompts = sum(len(request.ids) for session in by_session(kept).values() for request, _ in session)
    first_turns = sum(len(session[0][0].ids) for session in by_session(kept).values())
    assert 0 < metrics["prefix_hit_rate"] < (prompts - first_turns) / prompts + 1e-9  # never a first turn's
    assert metrics["session_kv_held_bytes"] > 0
    hits = [row["prefix_hit_tokens"] for row in kept.request_rows]
    assert sum(hits) / prompts == pytest.approx(metrics["prefix_hit_rate"])
    recomputed.result({})
    assert {row["prefix_hit_tokens"] for row in recomputed.request_rows} == {None}  # nothing to count


@pytest.mark.slow  # the model, loaded, and three generate() calls
def test_a_kept_cache_that_differs_from_the_new_prompt_is_cut_back_to_their_common_prefix():
    import torch
    from transformers import DynamicCache

    from kvpipe import model
    from kvpipe.job.kept_caches import KeptCaches
    from kvpipe.job.servers import Request

    loaded = model.load(spec_for(*SESSIONS, "load=offline").model)
    generate = loaded.model.generate

    def answer(ids: list[int], cache) -> list[int]:
        with torch.inference_mode():
            out = generate(input_ids=torch.tensor([ids]), cache=cache, max_new_tokens=4, do_sample=False)
        return out[0, len(ids) :].tolist()

    kept, first = KeptCaches(), Request(list(range(100, 140)), 4, "", session=0, last_turn=False)
    cache = kept.resume(first, DynamicCache)
    kept.keep(first, cache, answer(first.ids, cache))
    rewritten = Request(first.ids[:30] + list(range(300, 320)), 4, "", session=0)  # re-rendered from token 30
    resumed = kept.resume(rewritten, DynamicCache)
    assert resumed is cache and resumed.get_seq_length() == 30 and kept.reused_tokens == 30
    assert answer(rewritten.ids, resumed) == answer(rewritten.ids, DynamicCache())


@pytest.mark.slow  # the command a user types, end to end (~3 s)
def test_the_paged_conversation_command_records_a_prefix_hit_rate(tmp_path):
    proc = run_cli([*SESSIONS, "cache=paged", "cache.allow_block_sharing=true", "load=concurrency"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (result,) = tmp_path.rglob("result.json")
    metrics = json.loads(result.read_text())["metrics"]
    assert metrics["prefix_hit_rate"] > 0 and "prefix hit rate" in proc.stdout
