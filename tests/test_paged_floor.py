"""The paged row in `kvpipe plan --request-tokens` (Llama-3.1-8B, 1,024-token requests, an H100 SXM),
derived by hand: why its TPOT floor was 61.5 ms where the dynamic cache's was 23.5 at the same 475
requests (a copy of what each step attends to, written and read back), its capacity with that copy
held for every request, and a fixed pool (cache.num_blocks) holding only the requests its blocks take."""

from __future__ import annotations

from kvpipe.jobspec import spec_from
from kvpipe.predict import hardware
from kvpipe.predict.bytes_plan import make_plan
from kvpipe.predict.costs import costs_for
from kvpipe.predict.floors import split

LLAMA_8B = ["model=llama31_8b_instruct"]  # config in the preset: no weights, no network
KV_PER_TOKEN = 32 * 8 * 128 * 2 * 2  # layers x KV heads x head_dim x (key, value) x 2 bytes
CACHED = 1023  # a 1,024-token request's cached tokens: the last generated one is never fed back
WEIGHTS = 16_060_522_496  # Llama-3.1-8B in bfloat16, counted from its config


def rows(*overrides: str) -> dict:
    plan = make_plan(spec_from([*LLAMA_8B, *overrides]), hardware_name="h100_sxm", contexts=[1024], request_tokens=1024)
    return {row.label: row.capacity for row in plan.rows}


def step_ms(requests: int, kv_passes: int) -> float:
    """A decode step over `requests` requests that moves their KV `kv_passes` times, at the H100's bandwidth."""
    weights_read = costs_for(spec_from(LLAMA_8B), "cuda", "bfloat16", requests).weights_read(requests)
    return (weights_read + kv_passes * requests * CACHED * KV_PER_TOKEN) / hardware.get("h100_sxm").memory_bandwidth_bytes_per_s * 1e3  # fmt: skip


def test_the_paged_floor_counts_the_gathered_copy_written_and_read_back():
    # at 475 requests, as plan showed before it counted the copy in capacity: 61.5 against 23.5
    # each step gathers every request's pages (read), writes them as one dense copy, attention reads it
    assert round(step_ms(475, kv_passes=3), 1) == 61.5
    assert round(step_ms(475, kv_passes=1), 1) == 23.5  # the dynamic row's count: its cache read once
    paged = rows()["paged"]
    assert paged.tpot_floor_ms == step_ms(paged.requests, kv_passes=3)


def test_paged_capacity_holds_whole_pages_and_one_layers_gathered_copy_for_every_request():
    pages = 1024 * KV_PER_TOKEN  # 1,023 tokens in whole pages of 32: 1,024 tokens a request
    copy = CACHED * KV_PER_TOKEN // 32  # one layer's keys and values, gathered for attention
    by_hand = (80 * 10**9 - WEIGHTS) // (pages + copy)  # the copy outgrows one request's prefill activation
    paged = rows()["paged"]
    assert paged.requests == by_hand == 461 and paged.needs_bytes == WEIGHTS + 461 * (pages + copy)


def test_at_the_same_requests_the_floors_differ_by_the_copy_alone():
    spec = spec_from(LLAMA_8B)
    prompt, new = split(1024, spec.workload.max_new_tokens)
    at = costs_for(spec, "cuda", "bfloat16", 475)
    paged = at.at(spec.with_choice(spec.cache_choice.with_strategy("paged")).strategy, prompt, new)
    dynamic = at.at(spec.strategy, prompt, new)
    assert paged.weights_read_bytes_per_step == dynamic.weights_read_bytes_per_step
    assert paged.kv_read_bytes_per_step == 3 * dynamic.kv_read_bytes_per_step == 3 * 475 * CACHED * KV_PER_TOKEN


def test_the_floor_reads_what_requests_attend_to_not_the_pool():
    sized = rows("cache=paged", "load=offline", "cache.num_blocks=10000")["paged"]  # a 39 GiB pool
    assert sized.requests == 10000 // 32
    spec = spec_from(LLAMA_8B)
    prompt, new = split(1024, spec.workload.max_new_tokens)
    pooled = spec_from([*LLAMA_8B, "cache=paged", "load=offline", "cache.num_blocks=10000"])
    at = costs_for(spec, "cuda", "bfloat16", sized.requests)
    assert at.at(pooled.strategy, prompt, new).kv_read_bytes_per_step == 3 * sized.requests * CACHED * KV_PER_TOKEN


def test_a_fixed_pool_holds_the_requests_its_blocks_take():
    small = rows("cache=paged", "load=offline", "cache.num_blocks=1000")["paged"]
    assert small.requests == 1000 // 32  # 32 pages of 32 tokens a request of 1,024 tokens
    assert small.tpot_floor_ms == step_ms(small.requests, kv_passes=3)


def test_the_paged_rows_note_says_why_its_floor_is_higher():
    notes = make_plan(spec_from(LLAMA_8B), hardware_name="h100_sxm", contexts=[1024]).notes
    said = next(note for note in notes if note.startswith("paged's KV read/step"))
    assert "3x the KV its requests attend to" in said and "one dense copy every step" in said
    assert "DynamicLayer copies its cache every step too (torch.cat)" in said
