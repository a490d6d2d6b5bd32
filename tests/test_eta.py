"""A sweep's ETA from what its jobs measured (kvpipe.orchestrate.eta): each job left priced from its
like done jobs, the median where none is like it, skipped jobs and a process's one-off setup left
out; and the planned jobs it prices, which must be Hydra's own."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from kvpipe.orchestrate.eta import DoneJob, Estimate, seconds_left, sweep_estimate
from kvpipe.orchestrate.sweep import STATE_FILE, planned_jobs
from kvpipe.record.result import Result, iter_results

from conftest import run_cli

SWEEP_BEGAN_S = 1_700_000_000.0


def done(cache: str, seconds: float, **more: str) -> DoneJob:
    return DoneJob({"model": "tiny_random", "cache": cache, **more}, seconds)


def left(cache: str, **more: str) -> dict[str, str]:
    return {"model": "tiny_random", "cache": cache, **more}


def test_a_job_left_costs_what_its_like_done_job_took():
    measured = [done("dynamic", 3.0), done("static_compiled", 38.0), done("static", 3.0)]
    estimate = seconds_left(measured, [left("static_compiled"), left("dynamic")])
    assert estimate == Estimate(seconds=41.0, unlike=0)  # not 2 jobs x the mean of 14.7 s


def test_the_most_alike_done_jobs_price_a_job_left_by_their_mean():
    measured = [done("quantized", 4.0, bits="2"), done("quantized", 6.0, bits="4"), done("dynamic", 1.0, bits="4")]
    assert seconds_left(measured, [left("quantized", bits="4")]).seconds == 6.0  # shares 2 values: only one job
    assert seconds_left(measured, [left("quantized", bits="8")]).seconds == 5.0  # shares 1: both quantized ones


def test_a_job_unlike_every_done_one_counts_at_the_median_and_says_so():
    measured = [done("dynamic", 2.0), done("static", 3.0), done("quantized", 10.0)]
    estimate = seconds_left(measured, [left("static_compiled"), left("static")])
    assert estimate == Estimate(seconds=6.0, unlike=1)  # the model all jobs share makes none alike
    assert estimate.text() == "ETA 6s (1 job of an unmeasured kind counted at the median)"
    assert Estimate(65.2, 0).text() == "ETA 1m06s"  # rounded up: 0s means nothing is left


def test_no_eta_before_any_job_has_measured():
    assert seconds_left([], [left("dynamic")]) is None


def test_jobs_side_by_side_share_the_time_left():
    measured = [done("dynamic", 4.0)]
    assert seconds_left(measured, [left("dynamic")] * 3, workers=2).seconds == 6.0
    assert seconds_left(measured, [left("dynamic")], workers=4).seconds == 4.0  # one job left runs alone


def result(cache: str, status: str, took_s: float = 0.0, setup_s: float | None = None, at_s: float = 10.0) -> Result:
    """A result.json of the sweep: FINISHED ones span took_s, ending at_s after the sweep began."""
    iso = lambda s: datetime.fromtimestamp(SWEEP_BEGAN_S + s, timezone.utc).isoformat(timespec="milliseconds")  # noqa: E731
    measured = status == "FINISHED"
    return Result(status=status, config={}, overrides=["model=tiny_random", f"cache={cache}"],
                  started_at=iso(at_s - took_s) if measured else None, finished_at=iso(at_s),
                  process_setup_s=setup_s)  # fmt: skip


PLANNED = [["model=tiny_random", f"cache={cache}"] for cache in ("dynamic", "static", "quantized", "dynamic")]


def test_a_jobs_own_time_leaves_out_its_processs_imports_and_model_load():
    first = result("dynamic", "FINISHED", took_s=7.7, setup_s=4.8)
    estimate = sweep_estimate([first], PLANNED, 3, 4, SWEEP_BEGAN_S)  # the last job, also dynamic
    assert estimate.seconds == pytest.approx(7.7 - 4.8)


def test_skipped_and_failed_jobs_are_neither_pace_nor_left():
    results = [result("dynamic", "FINISHED", took_s=2.0), result("static", "SKIPPED"), result("quantized", "FAILED")]
    estimate = sweep_estimate(results, PLANNED, 3, 4, SWEEP_BEGAN_S)
    assert estimate == Estimate(seconds=2.0, unlike=0)  # the second dynamic job, at the first one's pace


def test_records_older_than_the_sweep_are_not_its_own():
    old = result("dynamic", "FINISHED", took_s=2.0, at_s=-60)  # an earlier run in the same folder
    assert sweep_estimate([old], PLANNED, 1, 4, SWEEP_BEGAN_S) is None


def test_a_searchs_trials_left_count_at_the_median():
    results = [result("dynamic", "FINISHED", took_s=2.0), result("static", "FINISHED", took_s=4.0)]
    assert sweep_estimate(results, None, 2, 5, SWEEP_BEGAN_S) == Estimate(seconds=9.0, unlike=3)


def test_the_planned_jobs_are_hydras_own_in_its_order_for_a_preset_and_command_line_sweeps():
    from omegaconf import open_dict

    from kvpipe.jobspec import compose

    typed = ["+experiment=quant_grid", "model=tiny_random", "backend.nbits=4,2", "workload.warmup=0", "resume=true"]
    config = compose(["+experiment=quant_grid", "model=tiny_random"], with_hydra=True)
    with open_dict(config):
        config.hydra.overrides.task = typed  # as `kvpipe -m` would have it
    jobs = planned_jobs(config)
    # the preset's params first, then the command line's in the order typed; a later value of a key replaces the
    # preset's in its place; the last key varies fastest; a value is written back as Hydra reads it (True)
    assert len(jobs) == 2 * 2 * 3 * 2
    assert jobs[0] == ["backend=quanto", "backend.nbits=4", "axis=per_token", "backend.residual_length=32",
                       "+experiment=quant_grid", "model=tiny_random", "workload.warmup=0", "resume=True"]  # fmt: skip
    assert jobs[1][:4] == ["backend=quanto", "backend.nbits=4", "axis=per_token", "backend.residual_length=128"]
    assert jobs[12][:2] == ["backend=hqq", "backend.nbits=4"] and jobs[6][1] == "backend.nbits=2"


@pytest.mark.slow  # a kvpipe sweep: Hydra composes every job (each refused at once, before any model loads)
def test_a_sweeps_planned_jobs_are_the_overrides_hydra_gave_each_job(tmp_path):
    sweep_dir = tmp_path / "sweep"
    # workload.max_new_tokens=0 is refused by every job: each is recorded SKIPPED with its overrides, in a second
    typed = ["-m", "+experiment=cache_shootout", "model=tiny_random", "backend.nbits=2,4", "workload.max_new_tokens=0",
             "tracking=off", f"hydra.sweep.dir={sweep_dir}"]  # fmt: skip
    proc = run_cli(typed, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    planned = json.loads((sweep_dir / STATE_FILE).read_text())["planned_jobs"]
    given = {int(path.parent.name): result.overrides for path, result in iter_results(sweep_dir)}
    assert len(planned) == 12 and planned == [given[num] for num in range(12)]


@pytest.mark.slow  # a kvpipe process of its own: its first job imports torch and loads the model, as a user's does
def test_the_first_job_alone_pays_for_its_processs_imports_and_model_load(tmp_path):
    sweep_dir = tmp_path / "sweep"
    typed = ["-m", "model=tiny_random", "cache=dynamic,static", "workload.max_new_tokens=2", "workload.warmup=0",
             "workload.prompts=[Hi.]", "quality=off", "tracking=off", "interleave=false", f"hydra.sweep.dir={sweep_dir}"]  # fmt: skip
    proc = run_cli(typed, cwd=tmp_path, process=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, later = (result for _, result in iter_results(sweep_dir))
    assert first.process_setup_s > 0  # importing torch and transformers, loading the model: timed, however long
    assert later.process_setup_s == 0.0  # the same process and model: nothing left to do once
    assert "job 2/2: model=tiny_random cache=static" in proc.stdout + proc.stderr
    assert "· ETA " in proc.stdout + proc.stderr
