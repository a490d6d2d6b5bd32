"""recommend and advise for a service: a setup whose throughput its runs cannot tell from the most's
ties with it, and the tie goes to the cheaper setup, said in one line."""

from __future__ import annotations

import json

from kvpipe.decide.limits import Limits
from kvpipe.decide.service import choose_for_service

from test_compare import fake_runs


def served(*rows: dict, group: str = "g1"):
    """Serving runs of dynamic under load=concurrency: concurrency asked, tok/s, its rounds' tok/s,
    the most in flight, as an interleaved sweep records them (one round group)."""
    runs = fake_runs(*({"cache": row.get("cache", "dynamic"), "peak_mib": row.get("peak_mib", 600),
                        "params": {"load.kind": "concurrency", "load.concurrency": row["asked"]}} for row in rows))  # fmt: skip
    runs["metrics.output_tokens_per_s"] = [row["tok_s"] for row in rows]
    runs["metrics.max_in_flight"] = [row.get("in_flight", row["asked"]) for row in rows]
    runs["metrics.kv_cache_bytes"] = [row.get("kv", 1000.0) for row in rows]
    runs["tags.kvpipe.load"] = [f"concurrency({row['asked']})" for row in rows]
    if all("rounds" in row for row in rows):
        runs["tags.kvpipe.round_output_tokens_per_s"] = [json.dumps(row["rounds"]) for row in rows]
        runs["tags.kvpipe.round_group"] = group
    return runs


def test_a_setup_within_noise_of_the_most_throughput_wins_when_it_asks_for_less_concurrency():
    runs = served({"asked": 16, "in_flight": 4, "tok_s": 55.1, "rounds": [56.0, 51.0, 58.3]},
                  {"asked": 4, "tok_s": 53.4, "rounds": [54.0, 52.5, 53.7]})  # fmt: skip
    chosen, (what, why) = choose_for_service(runs, Limits(), "throughput")
    assert what.startswith("dynamic at concurrency(4): 53.4 tok/s")
    assert (
        "dynamic at concurrency(4) and dynamic at concurrency(16) are within noise (53.4 tok/s vs 55.1 tok/s, 3%" in why
    )
    assert "not yet decided" in why and "): dynamic at concurrency(4) asks for less concurrency" in why
    assert "the next: dynamic at concurrency(16): 55.1 tok/s" in why


def test_a_clearly_higher_throughput_is_taken_whatever_it_costs():
    runs = served({"asked": 16, "tok_s": 80.0, "rounds": [80.0, 79.0, 81.0]},
                  {"asked": 4, "tok_s": 53.4, "rounds": [54.0, 52.5, 53.7]})  # fmt: skip
    chosen, (what, why) = choose_for_service(runs, Limits(), "throughput")
    assert what.startswith("dynamic at concurrency(16): 80.0 tok/s") and "within noise" not in why


def test_without_intervals_only_a_difference_within_two_percent_ties_and_then_less_kv_cache_wins():
    tied = served({"asked": 4, "tok_s": 50.0, "kv": 2000.0}, {"asked": 4, "tok_s": 49.5, "kv": 1000.0})
    chosen, (what, why) = choose_for_service(tied, Limits(), "throughput")
    assert chosen["run_id"] == tied.iloc[1]["run_id"] and "no interval): " in why and "holds less KV cache" in why
    apart = served({"asked": 4, "tok_s": 50.0, "kv": 2000.0}, {"asked": 4, "tok_s": 47.0, "kv": 1000.0})
    chosen, (what, why) = choose_for_service(apart, Limits(), "throughput")
    assert chosen["run_id"] == apart.iloc[0]["run_id"] and "within noise" not in why


# ---- use: lines carry what the chosen cache reads ------------------------------------------------


def with_overrides(runs, *recorded: str):
    runs = runs.copy()
    runs["tags.kvpipe.overrides"] = list(recorded)
    return runs


def test_a_use_line_for_dynamic_drops_the_backend_a_quantized_sweep_gave_every_job():
    from kvpipe.decide.recommend import use_command

    runs = with_overrides(fake_runs({"cache": "dynamic"}), "model=tiny_random cache=dynamic backend=quanto "
                          "backend.nbits=4 axis=kivi hydra.sweep.dir=/tmp/x resume=true")  # fmt: skip
    assert use_command(runs.iloc[0]) == "python -m kvpipe model=tiny_random cache=dynamic"


def test_a_use_line_for_a_quantized_cache_keeps_what_its_backend_reads():
    from kvpipe.decide.recommend import use_command

    quantized = {"cache": "quantized:hqq:int4:kivi", "params": {"backend.name": "hqq", "backend.nbits": 4}}
    runs = with_overrides(fake_runs(quantized), "cache=quantized backend=hqq backend.nbits=4 press=none")
    assert use_command(runs.iloc[0]) == "python -m kvpipe cache=quantized backend=hqq backend.nbits=4"


def test_a_concurrency_above_the_requests_says_so_and_labels_what_was_in_flight():
    from kvpipe import load

    concurrency = load.get("concurrency")(type("Cfg", (), {"concurrency": 16, "requests": None})())
    assert concurrency.in_flight(["a"] * 4) == 4 and concurrency.served_label(["a"] * 4) == "concurrency(4; asked 16)"
    assert concurrency.notes(["a"] * 4) == [
        "load.concurrency=16 but only 4 requests: at most 4 in flight (load.requests sets how many)"]  # fmt: skip
    assert concurrency.served_label(["a"] * 16) == "concurrency(16)" and concurrency.notes(["a"] * 20) == []


def test_goodput_counts_right_answers_where_every_run_weighed_judged_them():
    # at 16 in flight it serves more within the targets, but more of its answers are wrong (a batch of
    # 16 changes the numerics: greedy answers can differ)
    runs = served({"asked": 4, "tok_s": 50.0}, {"asked": 16, "tok_s": 60.0})
    runs["metrics.goodput_requests_per_s"] = [2.0, 3.0]
    runs["metrics.goodput_correct_requests_per_s"] = [1.8, 1.0]
    chosen, (what, why) = choose_for_service(runs, Limits(), "goodput")
    assert what.startswith("dynamic at concurrency(4)") and "the most goodput of right answers" in why
    assert "goodput 2.00 req/s, 1.80 req/s of right answers" in what
    # a run that judged none: latency's goodput for every run, as vLLM's and GuideLLM's count it
    runs.loc[runs.index[1], "metrics.goodput_correct_requests_per_s"] = float("nan")
    chosen, (what, why) = choose_for_service(runs, Limits(), "goodput")
    assert what.startswith("dynamic at concurrency(16)") and why.startswith("the most goodput of the 2 serving runs")


def test_a_use_line_for_a_streaming_run_that_rolled_under_query_agnostic_says_so():
    from kvpipe.decide.recommend import use_command

    params = {"press.name": "streaming", "press.ratio": "0.5", "press.protocol": "query_agnostic"}
    recorded = "workload=passkey press=streaming press.protocol=query_agnostic"  # before press.rolling existed
    rolled = with_overrides(fake_runs({"cache": "dynamic+streaming0.5-query_agnostic", "params": params}), recorded)
    assert use_command(rolled.iloc[0]).endswith("press.protocol=query_agnostic press.rolling=true")
    once = {**params, "press.rolling": "false"}  # compressed once, the default since: logged
    runs = with_overrides(fake_runs({"cache": "dynamic+streaming0.5-query_agnostic", "params": once}), recorded)
    assert "rolling" not in use_command(runs.iloc[0])
