"""Paired on every node (pair_on_node): which copy of the baseline a job launched in a process of its
own takes turns with, and how compare reads the pair (and refuses raw timings from another machine).
The real sweep is in test_launchers (submitit) and test_ray (a Ray cluster)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from kvpipe.decide import compare, paired
from kvpipe.decide import runs as recorded
from kvpipe.orchestrate import on_node

TINY = ["model=tiny_random", "workload.max_new_tokens=3"]


@pytest.mark.parametrize(
    ("planned", "base"),
    [
        ([["cache=static"], ["cache=dynamic"], ["cache=quantized"]], ["cache=dynamic"]),
        ([["cache=quantized", "backend=hqq"], ["cache=dynamic", "backend=hqq"]], ["cache=dynamic"]),
        ([["backend=quanto", "cache=quantized"], ["backend=hqq", "cache=quantized"]], ["backend=quanto", "cache=quantized"]),
        ([["workload.seed=0"], ["workload.seed=1"]], ["cache=dynamic"]),  # no cache override: the default, dynamic
        ([["cache=dynamic", "press=snapkv"], ["cache=static"]], ["cache=dynamic", "press=snapkv"]),  # a press is no baseline
        (None, ["cache=dynamic"]),  # a search plans no jobs
    ],
)  # fmt: skip
def test_the_baseline_is_the_sweeps_dynamic_cache_else_its_first_jobs(planned, base):
    assert on_node.baseline_strategy(planned) == base


def test_a_copy_runs_the_jobs_own_model_and_workload_with_the_baselines_cache():
    planned = [[*TINY, "cache=dynamic"], [*TINY, "cache=quantized", "backend.nbits=2"]]
    assert on_node.partner_overrides(planned[1], planned) == [*TINY, "cache=dynamic"]
    assert on_node.partner_overrides(planned[0], planned) is None  # the baseline itself is measured alone
    seeds = [["workload.seed=0"], ["workload.seed=1"]]
    assert on_node.partner_overrides(seeds[1], seeds) is None  # the same cache as the baseline's
    press = [["cache=dynamic"], ["cache=dynamic", "press=snapkv", "press.ratio=0.5"]]
    assert on_node.partner_overrides(press[1], press) == ["cache=dynamic"]


def run(label: str, host: str, tpot: list[float], pair: list[float] | None = None, group: str | None = None) -> dict:
    """A run as MLflow returns it, with its calls; `pair`: the calls of its copy of the dynamic cache."""
    row = {
        "run_id": f"{label}-{host}-run",
        "params.cache.strategy": label.split(":")[0],
        "tags.kvpipe.cache.effective": label,
        "tags.kvpipe.host": host,
        "tags.kvpipe.cpu_model": "cpu",
        "metrics.tpot_ms": sum(tpot) / len(tpot),
        "metrics.peak_memory_bytes": 700.0 * 2**20,
        "tags.kvpipe.round_tpot_ms": json.dumps(tpot),
        "tags.kvpipe.call_tpot_ms": json.dumps(tpot),
        "tags.kvpipe.call_keys": "k",
        "tags.kvpipe.round_group": group,
    }
    if pair is not None:
        row |= {"tags.kvpipe.pair.label": "dynamic", "tags.kvpipe.pair.round_tpot_ms": json.dumps(pair),
                "tags.kvpipe.pair.call_tpot_ms": json.dumps(pair), "tags.kvpipe.pair.call_keys": "k"}  # fmt: skip
    return row


BASE_CALLS = [10.0, 11.0, 9.0, 12.0, 10.5, 9.5]


def test_compare_reads_a_jobs_ratio_from_its_own_copy_of_the_baseline_not_another_machines_run():
    slower = [1.5 * t for t in BASE_CALLS]
    frame = recorded.with_derived(pd.DataFrame([
        run("dynamic", "node-a", [20.0] * 6),  # the baseline's own job, on a slower machine
        run("quantized:quanto:int2:kivi", "node-b", slower, pair=BASE_CALLS, group="g1"),
        run("static", "node-c", [8.0] * 6),  # measured alone, on a third machine
    ]))  # fmt: skip
    runs = paired.with_ratios(frame)
    quantized = runs["ratio_tpot_ms"][1]
    assert quantized.paired and quantized.value == pytest.approx(1.5) and quantized.state == paired.SLOWER
    assert runs["ratio_tpot_ms"][2] is None and list(runs["apart"]) == [False, False, True]
    shown = compare.display_table(runs)
    assert list(shown["TPOT vs dynamic"]) == [
        "baseline", quantized.text(), f"– ({compare.APART})",
    ]  # fmt: skip
    assert list(shown["measured on"]) == ["node-a · cpu", "node-b · cpu", "node-c · cpu"]
    assert compare.APART in compare.footnote(runs, shown)
    # each machine's raw timings rank among its own: static's 8 ms on node-c does not push node-a's
    # dynamic off its front (quantized, lossy with no quality pass, is on none)
    assert list(runs["pareto"]) == [True, False, True]


def test_runs_of_one_machine_keep_one_front_and_no_machine_column():
    frame = recorded.with_derived(pd.DataFrame([run("dynamic", "box", [20.0] * 6), run("static", "box", [8.0] * 6)]))
    runs = paired.with_ratios(frame)
    assert list(runs["pareto"]) == [False, True] and list(runs["apart"]) == [False, False]
    assert "measured on" not in compare.display_table(runs)


def test_a_copy_of_another_configuration_is_not_the_named_baseline():
    frame = recorded.with_derived(pd.DataFrame([
        run("static", "box", [8.0] * 6),
        run("quantized:quanto:int2:kivi", "box", [15.0] * 6, pair=BASE_CALLS, group="g"),
    ]))  # fmt: skip
    runs = paired.with_ratios(frame, baseline="static")
    assert runs["baseline"][1] == "static" and not runs["ratio_tpot_ms"][1].paired  # round by round, unpaired


def test_the_ray_launcher_missing_is_one_line_naming_its_install():
    from hydra.errors import MissingConfigException

    from kvpipe.config import from_hydra

    missing = MissingConfigException("In 'hydra/launcher/ray_cluster': Could not find 'hydra/launcher/ray'\n\n"
                                     "Available options in 'hydra/launcher':\n\tbasic\n\tinterleaved")  # fmt: skip
    assert from_hydra(missing).endswith("install them with: make ray")


def test_a_setting_that_is_not_true_or_false_is_one_line_naming_it():
    from kvpipe.config import from_hydra
    from kvpipe.jobspec import compose

    with pytest.raises(Exception) as refused:
        compose(["pair_on_node=maybe"])
    assert from_hydra(refused.value) == "pair_on_node=maybe: expected true or false"
