"""`kvpipe capacity` as a user runs it: bad input refused in one line before anything loads, and a
search on the tiny model that answers per cache, then reuses its points when asked again."""

from __future__ import annotations

import json

import pytest

from kvpipe.record.result import Result

from conftest import REPO, TINY, run_cli

JOB = [o for o in TINY if o != "tracking=off"] + ["workload.repeats=1"]
LABELLED = ["workload=dataset", f"workload.path={REPO / 'examples' / 'questions.jsonl'}"]


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--max-ttft-ms", "0"], "--max-ttft-ms=0.0 is not valid: expected a positive number of milliseconds"),
        (["--max-tpot-ms", "-5"], "--max-tpot-ms=-5.0 is not valid: expected a positive number of milliseconds"),
        ([], "expected a target: --max-ttft-ms and/or --max-tpot-ms"),
        (["--max-tpot-ms", "80", "--percentile", "95"], "--percentile=95 is not valid: expected one of 50, 90, 99"),
        (["--max-tpot-ms", "80", "--min-goodput", "2"], "--min-goodput=2.0 is not valid: expected the share"),
        (["--max-tpot-ms", "80", "--resolution", "0"], "--resolution=0.0 is not valid"),
        (["--max-tpot-ms", "abc"], "argument --max-tpot-ms: invalid float value: 'abc'"),
        (["--max-tpot-ms", "80", "load=concurrency"], "load='concurrency' is not valid: the walk sets the load"),
        (["--max-tpot-ms", "80", "--memory-budget", "lots"], "--memory-budget='lots' is not valid"),
        (["--max-tpot-ms", "80", "cache=nope"], "cache=nope is not a known option"),
        (["--max-tpot-ms", "80", "--min-accuracy", "0"], "--min-accuracy=0.0 is not valid: expected the share of"),
        # the default chat workload carries no answers to judge: said before any model loads
        (["--max-tpot-ms", "80", "--min-accuracy", "0.8"], "--min-accuracy=0.8 is not valid: workload=chat judges"),
        (["--max-tpot-ms", "80", "--max-accuracy-drop", "1"], "--max-accuracy-drop=1.0 is not valid: expected the"),
        (["--max-tpot-ms", "80", "--max-accuracy-drop", "0.1"], "workload=chat does not judge full precision's"),
        # pass keys are judged, but not beside full precision's answers: --min-accuracy is theirs
        (["--max-tpot-ms", "80", "--max-accuracy-drop", "0.1", "workload=passkey"], "workload=passkey does not judge"),
        (["--max-tpot-ms", "80", "--max-accuracy-drop", "0.1", *LABELLED, "cache=paged"], "expected a cache whose"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_anything_is_written(tmp_path, flags, says):
    said = run_cli(["capacity", *JOB, *flags], cwd=tmp_path)
    assert said.returncode == 2, said.stderr[-2000:]
    assert said.stderr.startswith("kvpipe: error:") and said.stderr.count("\n") == 1 and says in said.stderr
    assert not (tmp_path / "outputs").exists()


def test_tracking_off_is_refused_as_capacity_reuses_its_points_from_the_store(tmp_path):
    said = run_cli(["capacity", *TINY, "--max-tpot-ms", "80"], cwd=tmp_path)
    assert said.returncode == 2 and "tracking='off' is not valid" in said.stderr


@pytest.mark.slow  # two tiny caches' searches (about 10 served jobs) recorded in MLflow, then asked again
def test_capacity_answers_per_cache_and_reuses_its_points_when_asked_again(tmp_path, existing_store):
    existing_store(tmp_path)
    args = ["capacity", *JOB, "cache=dynamic,paged", "--max-ttft-ms", "2000", "--max-tpot-ms", "0.5",
            "--requests", "4", "--resolution", "0.3"]  # fmt: skip
    first = run_cli(args, cwd=tmp_path)
    assert first.returncode == 1, first.stderr[-3000:]  # no CPU decodes a token in half a millisecond
    for cache in ("dynamic", "paged"):
        row = next(line for line in first.stdout.splitlines() if line.startswith(f"{cache} "))
        assert " none " in row and " TPOT " in row  # nothing carried; TPOT binds
        assert f"{cache}: TPOT binds: misses even at " in first.stdout
    assert "capacity: batch 1: dynamic at every request at once, paged at every request at once" in first.stderr
    assert "no cache meets TTFT p90 ≤ 2000 ms · TPOT p90 ≤ 0.5 ms at any rate tried" in first.stdout
    jobs = int(first.stdout.split("capacity: done in ")[1].split(": ")[1].split(" jobs")[0])
    again = run_cli(args, cwd=tmp_path)
    assert f": {jobs} jobs ({jobs} reused)" in again.stdout, again.stdout[-2000:]


@pytest.mark.slow  # two tiny caches' searches, served jobs recorded in MLflow
def test_capacity_within_targets_the_tiny_model_meets_names_the_cache_that_carries_most(tmp_path, existing_store):
    existing_store(tmp_path)
    said = run_cli(["capacity", *JOB, "cache=dynamic,paged", "--max-ttft-ms", "60000", "--max-tpot-ms", "60000",
                    "--requests", "4"], cwd=tmp_path)  # fmt: skip
    assert said.returncode == 0, said.stderr[-3000:]
    assert said.stdout.count(" throughput binds: meets the targets at ") == 2  # each met at its ceiling
    use = said.stdout.split("use: kvpipe ")[1].splitlines()[0]
    assert "load=rate load.rate=" in use and "load.max_ttft_ms=60000" in use
    assert "carries the most:" in said.stdout
    found = json.loads(next(tmp_path.glob("outputs/capacity/*/*/capacity.json")).read_text())
    for cache in found["caches"]:  # the cache's peak at the rate carried, over the requests in flight there
        points = tmp_path.glob("outputs/capacity/*/*/*/result.json")
        carried = Result.load(next(p for p in points if _carried(p, cache))).metrics
        held = carried.get("kv_held_bytes", carried["kv_cache_bytes"])
        assert cache["kv_bytes_per_request"] == pytest.approx(held / carried["max_in_flight"])


def _carried(result_json, cache: dict) -> bool:
    """Whether a point's result is the cache's at the rate it carries."""
    overrides = json.loads(result_json.read_text())["overrides"]
    return f"cache={cache['cache']}" in overrides and f"load.rate={cache['rate']:g}" in overrides


@pytest.mark.parametrize("command", ["capacity", "advise", "plan"])
def test_a_subcommand_that_launches_jobs_keeps_tracking_uri_among_its_overrides(monkeypatch, command):
    # `kvpipe capacity tracking.uri=...` once dropped the setting before its jobs were composed, and
    # every point was recorded in ./outputs/mlflow.db instead of the store the user named
    import importlib

    from kvpipe import cli

    seen = {}
    monkeypatch.setattr(
        importlib.import_module(f"kvpipe.commands.{command}"), "run", lambda args: seen.setdefault("a", args) and 0
    )
    cli._run_subcommand([command, "model=tiny_random", "tracking.uri=sqlite:////tmp/given.db", "cache=dynamic"])
    assert "tracking.uri=sqlite:////tmp/given.db" in seen["a"].overrides


def test_a_subcommand_that_reads_a_store_takes_tracking_uri_as_its_store(monkeypatch):
    import importlib

    from kvpipe import cli

    seen = {}
    monkeypatch.setattr(
        importlib.import_module("kvpipe.commands.compare"), "run", lambda args: seen.setdefault("a", args) and 0
    )
    cli._run_subcommand(["compare", "tracking.uri=sqlite:////tmp/given.db"])
    assert seen["a"].tracking_uri == "sqlite:////tmp/given.db"


@pytest.mark.slow  # one tiny cache's search over labelled prompts, served jobs recorded in MLflow
def test_an_accuracy_floor_binds_where_the_answers_are_wrong_at_every_rate(tmp_path, existing_store):
    existing_store(tmp_path)
    # a regex that only an empty answer matches: the tiny model's answers are all wrong, at any rate
    (tmp_path / "q.jsonl").write_text(
        '{"prompt": "Say nothing.", "answer": "^$"}\n{"prompt": "Hush.", "answer": "^$"}\n'
    )
    labelled = ["workload=dataset", "workload.path=q.jsonl", "workload.scorer=regex"]
    said = run_cli(["capacity", *JOB, *labelled, "cache=dynamic", "--max-ttft-ms", "60000", "--max-tpot-ms", "60000",
                    "--min-accuracy", "0.5", "--requests", "4"], cwd=tmp_path)  # fmt: skip
    assert said.returncode == 1, said.stderr[-3000:]  # latency met everywhere; accuracy nowhere
    row = next(line for line in said.stdout.splitlines() if line.startswith("dynamic "))
    assert " none " in row and " accuracy " in row
    assert "dynamic: accuracy binds: misses even at " in said.stdout and "accuracy 0% (" in said.stdout
    assert "no cache meets TTFT p90 ≤ 60000 ms · TPOT p90 ≤ 60000 ms · accuracy ≥ 50% at any rate" in said.stdout


def test_where_answers_are_judged_the_verdict_gives_goodput_of_right_answers_beside_latencys(tmp_path, existing_store):
    existing_store(tmp_path)
    # "." is right for any answer but an empty one, "^$" for an empty one only: one right, one wrong
    (tmp_path / "q.jsonl").write_text(
        '{"prompt": "Say something.", "answer": "."}\n{"prompt": "Hush.", "answer": "^$"}\n'
    )
    labelled = ["workload=dataset", "workload.path=q.jsonl", "workload.scorer=regex", "workload.max_new_tokens=3"]
    said = run_cli(["capacity", *JOB, *labelled, "cache=dynamic", "--max-ttft-ms", "60000", "--max-tpot-ms", "60000",
                    "--min-accuracy", "0.2", "--requests", "4", "--resolution", "0.5"], cwd=tmp_path)  # fmt: skip
    assert said.returncode == 0, said.stderr[-3000:]
    header = next(line for line in said.stdout.splitlines() if line.startswith("cache "))
    assert "goodput there" in header and "right answers' goodput" in header and "accuracy there" in header
    (found,) = json.loads(next((tmp_path / "outputs" / "capacity").glob("*/*/capacity.json")).read_text())["caches"]
    # every request met the targets; half of them answered right
    assert found["goodput_correct_requests_per_s"] == pytest.approx(found["goodput_requests_per_s"] / 2)
    row = next(line for line in said.stdout.splitlines() if line.startswith("dynamic "))
    assert (
        f"{found['goodput_correct_requests_per_s']:.3g} req/s" in row and "right answers' goodput: those" in said.stdout
    )
