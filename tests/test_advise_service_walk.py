"""The capacity sweeper's batches without a model: each cache's walk proposes its next load, the caches
still walking are launched together, and what a launched job recorded is told back. Jobs are faked by
writing the result.json a real one would, with figures from a table."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from kvpipe.decide.capacity import Targets
from kvpipe.decide.limits import Limits
from kvpipe.orchestrate.capacity.sweeper import CapacitySettings
from kvpipe.orchestrate.capacity.walker import Walker
from kvpipe.orchestrate.capacity.walks import ConcurrencyWalk, RateWalk
from kvpipe.record.result import Result

from conftest import TINY, spec_for


def fake_launch(sweep_dir: Path, figures_of, batches: list):
    """A launcher whose jobs record figures_of(overrides as a dict) in their result.json."""

    def launch(jobs, first_index):
        batches.append([dict(o.split("=", 1) for o in job) for job in jobs])
        returns = []
        for index, job in enumerate(jobs, start=first_index):
            run_dir = sweep_dir / str(index)
            Result("FINISHED", {}, metrics=figures_of(dict(o.split("=", 1) for o in job))).save(run_dir)
            returns.append(SimpleNamespace(hydra_cfg=SimpleNamespace(hydra=SimpleNamespace(
                runtime=SimpleNamespace(output_dir=str(run_dir))))))  # fmt: skip
        return returns

    return launch


def walked(tmp_path, settings, walks, figures_of, jobs_run_here=False) -> tuple[dict, list]:
    batches: list = []
    spec = spec_for(*TINY, "load=rate")
    walker = Walker(settings, list(walks), [], spec, walks, tmp_path, tmp_path, jobs_run_here)
    walker.run(fake_launch(tmp_path, figures_of, batches))
    return json.loads((tmp_path / "capacity.json").read_text()), batches


THROUGHPUT = {"dynamic": {1: 10.0, 4: 10.2, 16: 30.0}, "paged": {1: 12.0, 4: 30.0, 16: 29.0}}


def test_the_walk_stops_a_cache_at_the_first_level_that_adds_no_throughput(tmp_path):
    walks = {c: ConcurrencyWalk(c, [1, 4, 16], Limits(), "output_tokens_per_s") for c in THROUGHPUT}
    found, batches = walked(tmp_path, CapacitySettings(walk="concurrency"), walks, lambda job: {
        "output_tokens_per_s": THROUGHPUT[job["cache"]][int(job["load.concurrency"])], "tpot_ms": 20.0})  # fmt: skip
    assert found["jobs"] == 5 < 2 * 3  # the grid's six, less dynamic at 16: its walk stopped at 4
    levels = {c["cache"]: c["levels"] for c in found["caches"]}
    assert levels == {"dynamic": [1, 4], "paged": [1, 4, 16]}
    assert "adds no output_tokens_per_s beyond 5%" in found["caches"][0]["stopped"]
    # the caches take turns: each level's batch holds every cache still walking
    assert [[(j["cache"], j["load.concurrency"]) for j in batch] for batch in batches] == [
        [("dynamic", "1"), ("paged", "1")], [("dynamic", "4"), ("paged", "4")], [("paged", "16")]]  # fmt: skip


def test_the_walk_stops_a_cache_at_the_first_level_that_misses_a_limit(tmp_path):
    walks = {"dynamic": ConcurrencyWalk("dynamic", [1, 2, 4, 8], Limits(tpot_ms=50.0), "output_tokens_per_s")}
    found, _ = walked(tmp_path, CapacitySettings(walk="concurrency"), walks, lambda job: {
        "output_tokens_per_s": 10.0 * int(job["load.concurrency"]), "tpot_ms": 20.0 * int(job["load.concurrency"])})  # fmt: skip
    assert found["caches"][0]["levels"] == [1, 2, 4]
    assert found["caches"][0]["stopped"] == "concurrency 4 misses TPOT"


def test_the_rate_search_runs_in_batches_and_finds_each_caches_rate(tmp_path):
    carries = {"dynamic": 2.0, "paged": 5.0}  # requests/s each meets its TTFT target up to
    targets = Targets(max_ttft_ms=1000)
    walks = {c: RateWalk(c, targets, 0.1, 16, 100) for c in carries}

    def figures_of(job):
        if job["load"] == "offline":
            return {"requests_per_s": 8.0}
        rate = float(job["load.rate"])
        return {"ttft_p90_ms": 500.0 if rate <= carries[job["cache"]] else 1500.0, "max_in_flight": 4.0,
                "within_targets": 1.0, "goodput_requests_per_s": rate}  # fmt: skip

    found, batches = walked(tmp_path, CapacitySettings(max_ttft_ms=1000), walks, figures_of, jobs_run_here=True)
    for cache in found["caches"]:
        assert cache["rate"] <= carries[cache["cache"]] < cache["failing_rate"] <= cache["rate"] * 1.1
        assert cache["binds"] == "TTFT" and cache["max_throughput"] == 8.0
    assert [j["load"] for j in batches[0]] == ["offline", "offline"]  # each ceiling first, together
    assert all(j.get("resume") == "true" for batch in batches for j in batch)  # a repeated search reuses them
    assert found["jobs"] == sum(len(batch) for batch in batches)
    # the ceilings warm up and serve every request; each rate point after them, served in this process,
    # skips the warm-up and stops once it has missed at the search's percentile
    assert not any("workload.warmup" in j or "load.stop_when_missed_at" in j for j in batches[0])
    assert all(j["workload.warmup"] == "0" and j["load.stop_when_missed_at"] == "90" for b in batches[1:] for j in b)


def test_a_rate_search_whose_answers_miss_at_two_rates_in_a_row_stops_there_and_says_the_answers_bind(tmp_path):
    # the quantized cache's answers miss the floor whatever the rate; dynamic's miss only at the ceiling's
    # rate (one batch of everything at once answers differently), and it searches on
    targets = Targets(max_ttft_ms=1000, min_accuracy=0.8)
    walks = {c: RateWalk(c, targets, 0.1, 16, None) for c in ("quantized", "dynamic")}

    def figures_of(job):
        if job["load"] == "offline":
            return {"requests_per_s": 8.0}
        rate = float(job["load.rate"])
        right = 0.3 if job["cache"] == "quantized" or rate >= 8.0 else 0.9
        return {"ttft_p90_ms": 500.0 if rate <= 2.0 else 1500.0, "task_accuracy": right, "within_targets": 1.0}

    found, _ = walked(tmp_path, CapacitySettings(max_ttft_ms=1000, min_accuracy=0.8), walks, figures_of)
    quantized, dynamic = found["caches"]
    # 8/s and 4/s missed TTFT too; 2/s and 1/s met it and missed on accuracy alone: no lower rate
    assert quantized["rates"] == [8.0, 4.0, 2.0, 1.0] and quantized["rate"] == 0 and quantized["binds"] == "accuracy"
    assert "the answers, not the traffic, bind" in quantized["why"]
    assert dynamic["rates"][:3] == [8.0, 4.0, 2.0] and dynamic["rate"] > 0 and dynamic["binds"] == "TTFT"


def test_the_rate_search_stops_at_its_job_budget(tmp_path):
    walks = {"dynamic": RateWalk("dynamic", Targets(max_ttft_ms=1000), 0.01, 16, None)}
    found, batches = walked(tmp_path, CapacitySettings(max_ttft_ms=1000, trials=3), walks,
                            lambda job: {"requests_per_s": 8.0, "ttft_p90_ms": 5000.0})  # fmt: skip
    assert found["jobs"] == 3 and len(batches) == 3


def test_the_walk_stops_where_the_workload_has_no_more_requests_than_the_level_keeps_in_flight(tmp_path):
    walks = {"dynamic": ConcurrencyWalk("dynamic", [1, 4, 16], Limits(), "output_tokens_per_s")}
    found, batches = walked(tmp_path, CapacitySettings(walk="concurrency"), walks, lambda job: {
        "output_tokens_per_s": 10.0 * int(job["load.concurrency"]), "served_requests": 4.0, "tpot_ms": 20.0})  # fmt: skip
    assert found["caches"][0]["levels"] == [1, 4] and len(batches) == 2  # 16 would be 4 in flight again
    assert found["caches"][0]["stopped"] == "only 4 requests: concurrency 16 would keep at most 4 in flight"
