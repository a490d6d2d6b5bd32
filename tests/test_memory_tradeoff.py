"""The line that says why a cache holding fewer KV bytes peaks higher: the measured gap, the
transient plan's accounting counts, the rest, and the context from which the saving would win."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from kvpipe.decide import runs as recorded
from kvpipe.predict import memory_tradeoff
from kvpipe.predict.floors import split
from kvpipe.predict.run_costs import job_costs, job_spec
from kvpipe.units import MIB

DYNAMIC = "model=tiny_random cache=dynamic"
QUANTIZED = "model=tiny_random cache=quantized backend=quanto backend.q_group_size=16 backend.residual_length=4"


def runs_of(*rows: dict) -> pd.DataFrame:
    """Runs as load_runs returns them: overrides, KV bytes and peak per row, one job's shape."""
    records = []
    for i, row in enumerate(rows):
        spec = job_spec(row["overrides"])
        records.append({
            "run_id": f"run{i:03d}", "start_time": pd.Timestamp(2026, 1, 1) + pd.Timedelta(seconds=i),
            **{f"params.{k}": v for k, v in spec.params().items()}, "params.model.name": "tiny_random",
            "params.model.dtype": "float32", "tags.kvpipe.device": "cpu", "tags.kvpipe.overrides": row["overrides"],
            "tags.kvpipe.cache.effective": spec.params()["cache.strategy"],
            "metrics.peak_memory_bytes": row["peak"], "metrics.kv_cache_bytes": row["kv"],
            "metrics.prompt_tokens": float(row.get("prompt", 40)), "metrics.new_tokens": 8.0,
            "metrics.batch_size": 1.0, "metrics.tpot_ms": 5.0, "metrics.ttft_ms": 9.0,
        })  # fmt: skip
    return recorded.with_derived(pd.DataFrame(records))


def test_a_smaller_cache_that_peaks_higher_is_explained_by_plans_accounting():
    runs = runs_of(
        {"overrides": DYNAMIC, "kv": 3 * MIB, "peak": 50 * MIB},
        {"overrides": QUANTIZED, "kv": 1 * MIB, "peak": 53 * MIB},
    )
    dynamic, quantized = runs.iloc[0], runs.iloc[1]
    line = memory_tradeoff.explain(runs, dynamic)
    assert line.startswith(f"{quantized['label']} holds 3.0× fewer KV bytes than dynamic (1.0 MiB vs 3.0 MiB)")
    assert "yet peaks 3.0 MiB higher (53.0 MiB vs 50.0 MiB)" in line

    # the copy, the saving and the rest are plan's own figures at the runs' context (40 + 8 tokens)
    spec_q, spec_d = job_spec(QUANTIZED), job_spec(DYNAMIC)
    costs = job_costs(spec_q, "float32", 1, "cpu")

    def gap(context):
        at = split(context, 8)
        return costs.at(spec_q.strategy, *at).memory_bytes - costs.at(spec_d.strategy, *at).memory_bytes

    show = memory_tradeoff.human_bytes
    quantized_cost, dynamic_cost = costs.at(spec_q.strategy, 40, 8), costs.at(spec_d.strategy, 40, 8)
    copy, saved = quantized_cost.dequantized_copy_bytes, dynamic_cost.kv_cache_bytes - quantized_cost.kv_cache_bytes
    assert copy > 0 and saved > 0
    assert f"counts its decode's {show(copy)} dequantized copy of one layer" in line
    assert f"against {show(saved)} of KV saved" in line
    rest = 3 * MIB - gap(48)
    assert f"the other {show(rest)} is outside it" in line

    # the context it names is the first at which the saving outgrows the gap
    wins_from = int(re.search(r"peak lower from about ([\d,]+) tokens of context \(now 48\)", line)[1].replace(",", ""))
    assert rest + gap(wins_from) < 0 <= rest + gap(wins_from - 1)


def test_a_gap_the_model_never_outgrows_says_so():
    runs = runs_of(
        {"overrides": DYNAMIC, "kv": 3 * MIB, "peak": 500 * MIB},
        {"overrides": QUANTIZED, "kv": 1 * MIB, "peak": 50_000 * MIB},
    )
    line = memory_tradeoff.explain(runs, runs.iloc[0])
    assert "even were that fixed, it would not peak lower within the model's" in line


@pytest.mark.parametrize(
    "quantized",
    [
        {"overrides": QUANTIZED, "kv": 1 * MIB, "peak": 490 * MIB},  # smaller and lower: nothing to explain
        {"overrides": QUANTIZED, "kv": 4 * MIB, "peak": 530 * MIB},  # larger: no trade-off
        {"overrides": QUANTIZED, "kv": 1 * MIB, "peak": 530 * MIB, "prompt": 400},  # another job's length
        {"overrides": QUANTIZED, "kv": 1 * MIB, "peak": 500 * MIB + 568 * 1024},  # higher within noise
        {"overrides": QUANTIZED, "kv": 2.9 * MIB, "peak": 560 * MIB},  # a KV saving within noise
    ],
    ids=["lower", "larger", "other-prompt", "peak-within-noise", "kv-within-noise"],
)
def test_no_line_where_there_is_no_trade_off_between_like_jobs(quantized):
    runs = runs_of({"overrides": DYNAMIC, "kv": 3 * MIB, "peak": 500 * MIB}, quantized)
    assert memory_tradeoff.explain(runs, runs.iloc[0]) is None


def test_the_largest_saving_is_named_and_the_others_counted():
    int2 = QUANTIZED + " backend.nbits=2"
    runs = runs_of(
        {"overrides": DYNAMIC, "kv": 3 * MIB, "peak": 500 * MIB},
        {"overrides": QUANTIZED, "kv": 1 * MIB, "peak": 530 * MIB},
        {"overrides": int2, "kv": 0.5 * MIB, "peak": 540 * MIB},
    )
    line = memory_tradeoff.explain(runs, runs.iloc[0])
    assert line.startswith(runs.iloc[2]["label"] + " holds 6.0× fewer")
    assert line.endswith("; 1 more cache does likewise")


def test_a_run_whose_job_no_longer_composes_keeps_the_measured_part():
    runs = runs_of(
        {"overrides": DYNAMIC, "kv": 3 * MIB, "peak": 500 * MIB},
        {"overrides": QUANTIZED, "kv": 1 * MIB, "peak": 530 * MIB},
    )
    runs.loc[1, "tags.kvpipe.overrides"] = "cache=renamed_since"
    line = memory_tradeoff.explain(runs, runs.iloc[0])
    assert line.endswith("(530.0 MiB vs 500.0 MiB)")


def test_recommend_and_compare_say_why_the_smaller_cache_was_not_the_answer(monkeypatch, capsys):
    from kvpipe import cli
    from kvpipe.commands.compare import _memory_lines

    runs = runs_of(
        {"overrides": DYNAMIC, "kv": 3 * MIB, "peak": 500 * MIB},
        {"overrides": QUANTIZED, "kv": 1 * MIB, "peak": 560 * MIB},
    )
    monkeypatch.setattr(recorded, "load_runs", lambda *args, **kwargs: (runs, None))
    assert cli.subcommand(["recommend", "--memory-budget", "500MiB"]) == 0
    out = capsys.readouterr().out
    line = memory_tradeoff.explain(runs, runs.iloc[0])
    assert "recommend: dynamic" in out and f"\n  memory: {line}\n" in out

    assert cli.subcommand(["recommend", "--memory-budget", "400MiB"]) == 1  # none fits: beside the closest
    assert f"\n  memory: {line}\n" in capsys.readouterr().out
    assert _memory_lines(runs) == [line]


def test_two_sizes_that_differ_read_apart():
    from kvpipe.units import sizes_apart

    assert sizes_apart(1.12 * 2**30, 1.07 * 2**30) == "1.12 GiB vs 1.07 GiB"
    assert sizes_apart(560 * MIB, 500 * MIB) == "560.0 MiB vs 500.0 MiB"
    assert sizes_apart(900 * 1024, 2 * MIB) == "0.9 MiB vs 2.0 MiB"
