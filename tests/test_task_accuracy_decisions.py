"""--min-accuracy on a labelled file's task accuracy, end to end: recommend and compare's front over a
real recorded sweep of a labelled file, and advise's front (the search's objectives) over recorded
runs, each judging by task_accuracy where no passkey retrieval was measured."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest
from test_dataset import write_jsonl

from kvpipe.decide import runs as decided_runs
from kvpipe.decide.limits import Limits

from conftest import run_cli

# regex answers that every answer matches (^) or none does ((?!)): task accuracy is 2/3 whatever a
# random-weight model writes, so the limits can be set on either side of it
LABELLED = [
    {"prompt": "What is two plus two?", "answer": "^"},
    {"prompt": "Name a colour.", "answer": "^"},
    {"prompt": "What is the capital of France?", "answer": "(?!)"},
]
SWEEP = [
    "-m",
    "model=tiny_random",
    "workload=dataset",
    "workload.scorer=regex",
    "workload.max_new_tokens=4",
    "workload.warmup=0",
    "workload.repeats=1",
    "quality=on",
    "quality.windows=1",
    "quality.scored_tokens=4",
    "cache=dynamic,quantized",
    "backend.nbits=2",
    "press=none,knorm",
]


@pytest.fixture(scope="module")
def labelled_sweep(tmp_path_factory, existing_store) -> SimpleNamespace:
    """One real sweep of a labelled file, recorded in its own MLflow store: 4 runs."""
    launch_dir = tmp_path_factory.mktemp("labelled_sweep")
    existing_store(launch_dir)
    path = write_jsonl(launch_dir / "questions.jsonl", LABELLED)
    proc = run_cli([*SWEEP, f"workload.path={path}"], cwd=launch_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (sweep_dir,) = (launch_dir / "outputs" / "multiruns").glob("*/*")
    return SimpleNamespace(launch_dir=launch_dir, sweep_dir=sweep_dir, uri=f"sqlite:///{launch_dir}/outputs/mlflow.db")


@pytest.mark.slow  # one real sweep of 4 jobs on the tiny model, shared by these tests
def test_recorded_labelled_runs_are_judged_and_fronted_by_task_accuracy(labelled_sweep):
    runs, _ = decided_runs.load_runs("kvpipe", None, labelled_sweep.uri)
    assert len(runs) == 4 and decided_runs.judged_by(runs).metric.name == "task_accuracy"
    assert list(runs["answer_quality"]) == pytest.approx([2 / 3] * 4)
    assert runs["pareto"].any()
    assert runs["metrics.output_length_ratio"].notna().all()  # every run beside the reference's answers


@pytest.mark.slow  # one real sweep of 4 jobs on the tiny model, shared by these tests
def test_recommend_min_accuracy_chooses_on_task_accuracy(labelled_sweep):
    proc = run_cli(["recommend", "--min-accuracy", "0.6"], cwd=labelled_sweep.launch_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "task accuracy 67% (at least 60%)" in proc.stdout


@pytest.mark.slow  # one real sweep of 4 jobs on the tiny model, shared by these tests
def test_recommend_min_accuracy_above_every_runs_task_accuracy_recommends_none(labelled_sweep):
    proc = run_cli(["recommend", "--min-accuracy", "0.7"], cwd=labelled_sweep.launch_dir)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "no measured run meets the limits" in proc.stdout and "accuracy 67%, below 70%" in proc.stdout


@pytest.mark.slow  # one real sweep of 4 jobs on the tiny model, shared by these tests
def test_compare_shows_task_accuracy_and_draws_its_front_against_kv_bytes(labelled_sweep, tmp_path):
    proc = run_cli(["compare", "--out", str(tmp_path)], cwd=labelled_sweep.launch_dir)
    assert proc.returncode == 0, proc.stderr
    header = next(line for line in (tmp_path / "compare.md").read_text().splitlines() if "TPOT ms" in line)
    assert "task accuracy" in header and "output length vs reference" in header
    assert (tmp_path / "quality_vs_kv_bytes.png").stat().st_size > 5000  # knorm evicted: the front is drawn


def labelled_runs(*rows: tuple[str, float, float, float]) -> pd.DataFrame:
    """Recorded CPU runs of a labelled file: (cache, KV bytes, TPOT ms, task accuracy)."""
    records = [
        {
            "run_id": f"run{i}",
            "params.cache.strategy": cache,
            "params.workload.kind": "dataset",
            "tags.kvpipe.device": "cpu",
            "metrics.kv_cache_bytes": kv_bytes,
            "metrics.tpot_ms": tpot_ms,
            "metrics.peak_memory_bytes": 1e9,
            "metrics.weights_bytes": 5e8,
            "metrics.task_accuracy": accuracy,
        }
        for i, (cache, kv_bytes, tpot_ms, accuracy) in enumerate(rows)
    ]
    return decided_runs.with_derived(pd.DataFrame(records))


def test_the_search_minimises_one_minus_task_accuracy_for_labelled_runs():
    from kvpipe.orchestrate.search import objectives

    runs = labelled_runs(("quantized", 2e6, 30.0, 0.75))
    assert objectives.values(runs.iloc[0], "cpu") == pytest.approx([2e6, 30.0, 0.25])
    assert objectives.axis_names("cpu", decided_runs.judged_by(runs))[2] == "1 - task accuracy"
    assert objectives.constraints(runs.iloc[0], Limits(kl=None, accuracy=0.9)) == pytest.approx([1 - 0.75 / 0.9])


def test_advise_prints_the_front_within_min_accuracy_by_task_accuracy(monkeypatch, capsys):
    from kvpipe.commands import advise

    runs = labelled_runs(("dynamic", 8e6, 40.0, 0.9), ("quantized", 2e6, 30.0, 0.5), ("static", 8e6, 35.0, 0.9))
    monkeypatch.setattr(decided_runs, "load_runs", lambda *args, **kwargs: (runs, None))
    advise.print_front("parent", SimpleNamespace(overrides=[]), Limits(kl=None, accuracy=0.8))
    out = capsys.readouterr().out
    assert "(1 of 3 measured runs; KV cache bytes, TPOT ms, 1 - task accuracy, lower is better)" in out
    assert "static" in out and "quantized" not in out  # int2 misses 80%; static beats dynamic on TPOT
    assert "1 - task accuracy 0.1" in out
