"""Multirun: one process reuses the model, MLflow parent/child runs, skips, failures, resume.

Every test here reads a `python -m kvpipe -m` run: slow. The first four read the session's shared
sweep (conftest.tiny_sweep, also read by test_compare and test_recommend): a cache x backend.nbits
grid in which dense caches ignore backend.nbits and hqq has no 5-bit form. The last two read a sweep
with a failing job (failed_sweep), which the last one then resumes."""

from __future__ import annotations

import json

import pytest

from conftest import REPO, run_cli

pytestmark = pytest.mark.slow  # each sweep is a kvpipe process: start-up, jobs, MLflow, compare

TINY = ["model=tiny_random", "workload.max_new_tokens=3", "workload.warmup=0", "quality=off", "workload.prompts=[Hi.]"]


def sweep_results(launch_dir) -> list[dict]:
    """The result.json of every job of the launch dir's one sweep (the first, if a resume made a second)."""
    sweep_dir = min((launch_dir / "outputs" / "multiruns").glob("*/*"))
    return [
        json.loads(p.read_text()) for p in sorted(sweep_dir.glob("*/result.json"), key=lambda p: int(p.parent.name))
    ]


def child_runs(launch_dir):
    """The one parent run of the launch dir's first sweep, and its children."""
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{launch_dir}/outputs/mlflow.db")
    sweep_dir = min((launch_dir / "outputs" / "multiruns").glob("*/*")).resolve()
    parents = mlflow.search_runs(
        experiment_names=["kvpipe"],
        filter_string=f"tags.`kvpipe.sweep` = 'true' and tags.`kvpipe.sweep_dir` = '{sweep_dir}'",
        output_format="list",
    )
    assert len(parents) == 1
    children = mlflow.search_runs(
        experiment_names=["kvpipe"],
        output_format="list",
        filter_string=f"tags.`mlflow.parentRunId` = '{parents[0].info.run_id}'",
    )
    return parents[0], children


def test_sweep_runs_every_combination_and_skips_duplicates(tiny_sweep):
    proc = tiny_sweep.proc
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = sweep_results(tiny_sweep.launch_dir)
    statuses = [r["status"] for r in results]
    assert len(statuses) == 9  # cache x backend.nbits: 3 x 3
    assert statuses.count("FINISHED") == 4  # dynamic, static, quantized x 2 valid bit widths
    assert statuses.count("SKIPPED") == 5  # 4 duplicates, 1 invalid combination
    duplicates = [r for r in results if "measures the same as job" in r.get("reason", "")]
    assert len(duplicates) == 4 and {r["config"]["cache"]["strategy"] for r in duplicates} == {"dynamic", "static"}
    assert "4 finished, 5 skipped, 0 failed" in proc.stdout


def test_invalid_combination_is_skipped_with_its_reason(tiny_sweep):
    results = sweep_results(tiny_sweep.launch_dir)
    quantized = {r["config"]["backend"]["nbits"]: r for r in results if r["config"]["cache"]["strategy"] == "quantized"}
    assert [quantized[nbits]["status"] for nbits in (2, 4, 5)] == ["FINISHED", "FINISHED", "SKIPPED"]
    assert "backend.nbits" in quantized[5]["reason"]
    assert tiny_sweep.proc.returncode == 0


def test_sweep_jobs_are_children_of_one_parent_run(tiny_sweep):
    parent, children = child_runs(tiny_sweep.launch_dir)
    assert parent.info.status == "FINISHED"
    measured = [c for c in children if c.data.tags["kvpipe.status"] == "FINISHED"]
    assert len(measured) == 4 and all(c.info.status == "FINISHED" for c in children)
    assert parent.data.metrics["jobs_finished"] == 4


def test_parent_is_named_by_its_sweep_and_logs_the_swept_values(tiny_sweep):
    parent, _ = child_runs(tiny_sweep.launch_dir)
    assert parent.info.run_name == "sweep over cache × backend.nbits"
    assert parent.data.params["cache"] == "dynamic,static,quantized"
    assert parent.data.params["backend.nbits"] == "2,4,5"
    assert parent.data.params["model"] == "tiny_random"  # fixed overrides too: the whole sweep, as typed


def test_skipped_jobs_are_child_runs_that_say_why(tiny_sweep):
    _, children = child_runs(tiny_sweep.launch_dir)
    skipped = [c for c in children if c.data.tags["kvpipe.status"] == "SKIPPED"]
    assert len(skipped) == 5 and all(c.info.run_name.startswith("skipped · ") for c in skipped)
    reasons = [c.data.tags["kvpipe.skipped"] for c in skipped]
    assert sum("measures the same as job" in r for r in reasons) == 4
    (invalid,) = [c for c in skipped if "backend.nbits" in c.data.tags["kvpipe.skipped"]]
    assert "backend.nbits=5" in invalid.info.run_name and not invalid.data.metrics


def test_a_child_run_logs_what_the_job_used_and_what_produced_it(tiny_sweep):
    _, children = child_runs(tiny_sweep.launch_dir)
    by_name = {c.info.run_name: c for c in children}
    dynamic = by_name["dynamic · tiny_random · chat 3"]
    params = dynamic.data.params
    assert params["model.dtype"] == "float32" and params["model.device"] == "cpu"  # resolved, not auto
    assert params["model.num_hidden_layers"] == "2" and params["model.head_dim"] == "64"
    assert params["quality.scored_tokens"] == "16" and params["workload.prompts"] == '["Hi."]'
    assert not any(k.startswith(("tracking.", "backend.", "axis.")) for k in params)  # dense: no backend
    assert "workload.prompt_tokens" not in params  # a chat workload does not read it
    assert "None" not in params.values() and not any(v.startswith(("(", "[")) and "'" in v for v in params.values())
    quantized = next(c for c in children if c.info.run_name.startswith("quantized:hqq:int4"))
    assert quantized.data.params["backend.name"] == "hqq" and quantized.data.params["axis.layout"] == "kivi"
    tags = dynamic.data.tags
    assert "cache=dynamic,static,quantized" in tags["kvpipe.command"] and "-m" in tags["kvpipe.command"]
    assert "cache=dynamic" in tags["kvpipe.overrides"].split()
    (dataset,) = dynamic.inputs.dataset_inputs
    assert dataset.dataset.name == "chat prompts"
    result = next(r for r in sweep_results(tiny_sweep.launch_dir) if r.get("mlflow_run_id") == dynamic.info.run_id)
    assert result["params"] == params and result["command"] == tags["kvpipe.command"]


def test_sweep_loads_the_model_once(tiny_sweep):
    proc = tiny_sweep.proc
    assert (proc.stdout + proc.stderr).count("loaded tiny_random") == 1


# config.json but no weights: the spec is valid, the load fails
FAILING = ["model=hf,tiny_random", f"model.name_or_path={REPO}/tests/data/tiny_llama"]


@pytest.fixture(scope="module")
def failed_sweep(tmp_path_factory, existing_store):
    """A sweep whose first job fails and second finishes; test_resume resumes it."""
    launch_dir = tmp_path_factory.mktemp("failed_sweep")
    existing_store(launch_dir)
    return launch_dir, run_cli(["-m", *TINY, *FAILING], cwd=launch_dir)


def test_failed_job_becomes_a_failed_run_and_the_sweep_goes_on_with_nonzero_exit(failed_sweep):
    from mlflow.tracking import MlflowClient

    launch_dir, proc = failed_sweep
    assert proc.returncode == 1
    assert [r["status"] for r in sweep_results(launch_dir)] == ["FAILED", "FINISHED"]
    assert "1 finished, 0 skipped, 1 failed" in proc.stdout
    parent, children = child_runs(launch_dir)
    assert parent.info.status == "FAILED"
    (failed,) = [c for c in children if c.info.status == "FAILED"]
    assert "tiny_llama" in failed.data.tags["kvpipe.error"]
    artifacts = {a.path for a in MlflowClient().list_artifacts(failed.info.run_id)}
    assert "traceback.txt" in artifacts


def test_resume_skips_jobs_already_finished(failed_sweep):
    launch_dir, first = failed_sweep
    assert first.returncode == 1 and "1 finished" in first.stdout  # its tiny_random job (dynamic cache)
    # That job's settings again (every model setting is part of what a job measures, even one that
    # tiny_random does not read), with one more cache
    again = ["model=tiny_random", FAILING[1], "cache=dynamic,static"]
    second = run_cli(["-m", *TINY, *again, "resume=true"], cwd=launch_dir)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "1 finished, 1 skipped" in second.stdout
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{launch_dir}/outputs/mlflow.db")
    jobs = mlflow.search_runs(
        experiment_names=["kvpipe"], output_format="list", filter_string="tags.`kvpipe.status` = 'FINISHED'"
    )
    assert len(jobs) == 2  # no duplicates: tiny_random's dynamic and static once each


def test_the_jobs_take_turns_in_shared_rounds(tiny_sweep):
    finished = [r for r in sweep_results(tiny_sweep.launch_dir) if r["status"] == "FINISHED"]
    assert {r["tags"]["measured_order"] for r in finished} == {"interleaved"}
    assert len({r["tags"]["round_group"] for r in finished}) == 1  # their rounds pair
    assert all(len(json.loads(r["tags"]["round_tpot_ms"])) == 3 for r in finished)  # workload.repeats
    # warmup=0: each job's first round ran as it was prepared, where an out-of-memory error can fall back
    (group,) = json.loads((tiny_sweep.sweep_dir / "rounds.json").read_text())
    assert len(group["jobs"]) == 4 and len(group["seconds"]) == 2
    assert all(sorted(order) == [0, 1, 2, 3] for order in group["orders"])
    assert group["drift"][0] == 0
    parent, _ = child_runs(tiny_sweep.launch_dir)
    assert parent.data.tags["kvpipe.measured_order"] == "interleaved" and "round_drift" in parent.data.metrics
    assert not list(tiny_sweep.sweep_dir.glob("*/pending.json"))


@pytest.mark.slow  # kvpipe compare in a process of its own
def test_compare_weighs_each_run_against_dynamic_and_refuses_a_baseline_it_has_not(tiny_sweep):
    shown = run_cli(["compare"], cwd=tiny_sweep.launch_dir)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "TPOT vs dynamic" in shown.stdout and "baseline" in shown.stdout
    refused = run_cli(["compare", "--baseline", "fastest"], cwd=tiny_sweep.launch_dir)
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert "--baseline='fastest'" in lines[0] and "dynamic" in lines[0] and "static" in lines[0]


@pytest.mark.slow  # a small sweep under Hydra's basic launcher
def test_a_launcher_that_cannot_interleave_measures_one_after_another_and_says_so(tmp_path):
    proc = run_cli(["-m", *TINY, "tracking=off", "cache=dynamic,static", "hydra/launcher=basic"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    said = [line for line in (proc.stdout + proc.stderr).splitlines() if "one after another" in line]
    assert len(said) == 1 and "hydra/launcher=basic" in said[0]
    results = sweep_results(tmp_path)
    assert {r["tags"]["measured_order"] for r in results} == {"sequential"}
    assert "hydra/launcher=basic" in results[0]["tags"]["order_reason"]
    assert not (min((tmp_path / "outputs" / "multiruns").glob("*/*")) / "rounds.json").exists()


@pytest.mark.slow  # a small sweep over two models
def test_jobs_on_different_models_take_turns_within_their_models_group(tmp_path):
    overrides = ["-m", *TINY, "tracking=off", "model=tiny_random,tiny_sliding", "cache=dynamic,static"]
    proc = run_cli(overrides, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = sweep_results(tmp_path)
    models = [r["config"]["model"]["name"] for r in results]
    assert models == ["tiny_random", "tiny_random", "tiny_sliding", "tiny_sliding"]  # in the sweep's order
    groups = [r["tags"]["round_group"] for r in results]
    assert groups[0] == groups[1] != groups[2] == groups[3]  # one model in memory at a time
    rounds = json.loads((min((tmp_path / "outputs" / "multiruns").glob("*/*")) / "rounds.json").read_text())
    assert [group["jobs"] for group in rounds] == [["#0", "#1"], ["#2", "#3"]]


@pytest.mark.slow  # a served sweep: two caches under one load, recorded in MLflow, read back
def test_a_served_sweep_takes_turns_in_shared_rounds_and_its_ratios_are_paired(tmp_path, existing_store, monkeypatch):
    from kvpipe.decide import paired
    from kvpipe.decide.runs import load_runs
    from kvpipe.measure import contention

    # Whether a call counts as contended turns on what the other test worker does at that moment, and
    # three rounds whose calls were left out in turn leave no pair; here none is, so that the pairing
    # is what is tested (the leaving out is, with a machine of its own, in test_call_turns).
    monkeypatch.setattr(contention, "call_contended", lambda *args, **kwargs: False)
    existing_store(tmp_path)
    served = ["cache=dynamic,paged", "load=concurrency", "load.concurrency=2", "load.requests=2"]
    proc = run_cli(["-m", *TINY, *served], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = sweep_results(tmp_path)
    assert {r["tags"]["measured_order"] for r in results} == {"interleaved"}
    assert len({r["tags"]["round_group"] for r in results}) == 1  # their rounds pair
    assert all(len(json.loads(r["tags"]["round_tpot_ms"])) == 3 for r in results)  # workload.repeats passes
    (group,) = json.loads((min((tmp_path / "outputs" / "multiruns").glob("*/*")) / "rounds.json").read_text())
    assert len(group["jobs"]) == 2 and len(group["seconds"]) == 3
    runs, _ = load_runs("kvpipe", None, f"sqlite:///{tmp_path}/outputs/mlflow.db", whole_experiment=True)
    paged = paired.with_ratios(runs).set_index("label").loc["paged"]
    assert paged["baseline"] == "dynamic" and paged["ratio_tpot_ms"].paired and paged["ratio_ttft_ms"].paired
    shown = run_cli(["compare"], cwd=tmp_path)
    assert shown.returncode == 0 and "TPOT vs dynamic" in shown.stdout, shown.stderr[-2000:]
    row = next(line for line in shown.stdout.splitlines() if "│ paged " in line)
    assert "×" in row and "†" not in row  # a ratio, paired round by round


@pytest.mark.slow  # a real two-job sweep, recorded and compared
def test_the_sweeps_baseline_is_the_dynamic_cache_wherever_it_stands_and_compare_names_the_same(
    tmp_path, existing_store, monkeypatch
):
    from kvpipe.measure import contention

    # the pairing is under test, not the leaving out of calls (a machine of its own, test_call_turns)
    monkeypatch.setattr(contention, "call_contended", lambda *args, **kwargs: False)
    existing_store(tmp_path)
    proc = run_cli(["-m", *TINY, "cache=static,dynamic"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (group,) = json.loads((min((tmp_path / "outputs" / "multiruns").glob("*/*")) / "rounds.json").read_text())
    assert (group["baseline"], group["baseline_cache"]) == ("#1", "dynamic")  # not the first job
    shown = run_cli(["compare"], cwd=tmp_path)
    assert shown.returncode == 0 and "TPOT vs dynamic" in shown.stdout, shown.stderr[-2000:]
    row = next(line for line in shown.stdout.splitlines() if "│ static " in line)
    assert "×" in row and "†" not in row  # static has its ratio, paired call by call


@pytest.mark.slow  # a real two-job sweep whose calls are mostly left out
def test_with_most_calls_left_out_every_figure_lies_inside_its_own_interval(tmp_path, monkeypatch):
    import dataclasses

    from kvpipe.job import runner
    from kvpipe.schedule import loop

    # A neighbour that slows every judged call but one fourfold (and is seen there): the calls left
    # out are the slow ones, as on a busy machine, so figures and intervals from different calls disagree
    made = iter(range(10_000))
    slowed = []  # per call made

    def generate(*args, **kwargs):
        call = measured_generate(*args, **kwargs)
        index = next(made)
        slowed.append(index >= 8 and index != 9)  # each job's first round (no warm-up) is not judged
        if not slowed[-1]:
            return call
        timing = call.timing
        slow = dataclasses.replace(timing, ttft_ms=4 * timing.ttft_ms, e2e_ms=4 * timing.e2e_ms,
                                   itl_ms=[4 * t for t in timing.itl_ms])  # fmt: skip
        return dataclasses.replace(call, timing=slow)

    measured_generate = runner.measured_generate
    monkeypatch.setattr(runner, "measured_generate", generate)
    # the guard leaves out each call of a turn that the neighbour slowed (here every one but one)
    monkeypatch.setattr(loop, "left_out_of_turn",
                        lambda jobs, samples: [i for (i, _, _), s in zip(samples, slowed[-len(samples):]) if s])  # fmt: skip
    overrides = ["-m", *TINY[:-1], "tracking=off", "cache=static,dynamic", "workload.repeats=8"]
    proc = run_cli(overrides, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for result in sweep_results(tmp_path):
        metrics = result["metrics"]
        assert metrics["calls_excluded"] >= 27  # of 28 judged: 4 prompts x 7 rounds after the first
        for name in ("ttft_ms", "tpot_ms", "decode_tokens_per_s"):
            low, high = metrics.get(f"{name}_ci_low"), metrics.get(f"{name}_ci_high")
            has_interval = low is not None and high is not None and low == low and high == high
            assert not has_interval or low <= metrics[name] <= high, (name, low, metrics[name], high)
