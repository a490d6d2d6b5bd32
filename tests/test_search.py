"""kvpipe advise and hydra/sweeper=search: the space from the registries, trials told and reused,
pruning by the plan's prediction, one parent run per search, a killed search resumed, and the answer."""

from __future__ import annotations

import math
import signal
import sqlite3
import subprocess

import pytest
from paused_at import wait_until_paused
from test_resilience import paused, start_cli

from kvpipe.errors import ConfigError
from kvpipe.orchestrate.search import objectives
from kvpipe.orchestrate.search.space import Point, build
from kvpipe.orchestrate.search.study import split_arguments
from kvpipe.orchestrate.search.sweeper import SearchSettings
from kvpipe.orchestrate.search.trials import Search

from conftest import run_cli

# Three points: dynamic, and hqq at 2 and 4 bits; each job a few tokens of tiny_random, quality scored
JOB = ["model=tiny_random", "workload.max_new_tokens=6", "workload.warmup=0", "quality.windows=1",
       "quality.scored_tokens=16", "workload.prompts=[Hi.]"]  # fmt: skip
SPACE = ["cache=dynamic,quantized", "backend=hqq", "backend.nbits=2,4", "axis=per_token",
         "backend.q_group_size=32", "backend.residual_length=0"]  # fmt: skip


def test_the_space_is_what_the_registries_offer_for_this_head_dim():
    from kvpipe.cache import backends

    space = build(head_dim=64, device="cpu")
    labels = {p.label() for p in space.points}
    assert {"cache=dynamic", "cache=static", "cache=static cache.compile=true"} <= labels
    assert not any("offloaded" in label for label in labels)  # off CUDA they run as dynamic and static
    assert any("cache=offloaded " in note for note in space.left_out)
    sizes = {p.get("backend.q_group_size") for p in space.points} - {None}
    assert sizes == {"32", "64"}  # 128 does not divide head_dim 64
    for backend in ("quanto", "hqq"):
        bits = {int(p.get("backend.nbits")) for p in space.points if p.get("backend") == backend}
        assert bits == set(backends.get(backend).nbits_choices)
    quanto = [p for p in space.points if p.get("backend") == "quanto"]
    assert len(quanto) == 2 * 3 * 2 * 4  # nbits x layouts x group sizes x residual lengths
    assert len(build(head_dim=128, device="cpu").points) > len(space.points)


def test_group_sizes_and_residual_lengths_the_user_names_are_searched_even_outside_the_defaults():
    space = build(head_dim=64, device="cpu", restrict={"backend.residual_length": ["0", "16"], "backend": ["quanto"]})
    assert {p.get("backend.residual_length") for p in space.points} == {"0", "16"}
    assert {p.get("backend.q_group_size") for p in build(64, "cpu", {"backend.q_group_size": ["16"]}).points} == {"16"}


def test_a_trials_parameters_decode_to_the_nearest_point_and_every_point_encodes_back():
    space = build(head_dim=64, device="cpu")
    assert all(space.decode(space.encode(point)) == point for point in space.points)
    asked = {**space.encode(space.points[0]), "variant": "cache=quantized", "backend": "quanto", "backend.nbits": "3",
             "axis": "kivi", "backend.q_group_size": "64", "backend.residual_length": "64"}  # fmt: skip
    # quanto has no 3-bit form: the nearest it has (a tie: the smaller)
    assert space.decode(asked).label() == (
        "cache=quantized backend=quanto backend.nbits=2 axis=kivi backend.q_group_size=64 backend.residual_length=64"
    )
    dense = {**asked, "variant": "cache=static cache.compile=true"}
    assert space.decode(dense) == Point.of({"cache": "static", "cache.compile": "true"})  # the rest is ignored


def test_overrides_narrow_the_space_or_stay_fixed_and_a_sweep_elsewhere_is_one_line():
    fixed, restrict = split_arguments([*JOB, *SPACE])
    assert fixed == JOB
    assert restrict["backend.nbits"] == ["2", "4"] and restrict["cache"] == ["dynamic", "quantized"]
    assert [p.label() for p in build(32, "cpu", restrict).points] == [
        "cache=dynamic",
        "cache=quantized backend=hqq backend.nbits=2 axis=per_token backend.q_group_size=32 backend.residual_length=0",
        "cache=quantized backend=hqq backend.nbits=4 axis=per_token backend.q_group_size=32 backend.residual_length=0",
    ]  # a space narrowed to caches and backends leaves the presses out, unless it names one
    assert [p.label() for p in build(32, "cpu", {"press": ["snapkv"]}).points] == [
        f"cache=dynamic press=snapkv press.ratio={ratio}" for ratio in (0.25, 0.5, 0.75)
    ]
    with pytest.raises(ConfigError, match=r"^workload.max_new_tokens=.*a search sweeps only the cache space"):
        split_arguments(["workload.max_new_tokens=4,8"])


def test_constraints_are_the_limits_relative_overshoot_and_unmeasured_is_infeasible():
    from kvpipe.decide.limits import Limits

    run = objectives.row({"peak_memory_bytes": 3e9, "tpot_ms": 20.0, "kl_vs_reference": 0.01, "kv_cache_bytes": 1e6},
                         {"cache.strategy": "quantized"}, {})  # fmt: skip
    limits = Limits(memory_bytes=2e9, tpot_ms=40.0, kl=0.05)
    assert objectives.constraints(run, limits) == pytest.approx([0.5, -0.5, -0.8])
    assert objectives.values(run, "cpu") == [1e6, 20.0, 0.01]  # on CPU the KV bytes, not the process's peak
    assert objectives.values(run, "cuda")[0] == 3e9
    unmeasured = objectives.row({"tpot_ms": 20.0}, {"cache.strategy": "quantized"}, {})
    assert objectives.constraints(unmeasured, Limits(kl=0.05)) == [objectives.INFEASIBLE]
    assert math.isnan(objectives.values(unmeasured, "cpu")[2])
    passkey = objectives.row({"retrieval_accuracy": 0.75, "tpot_ms": 1.0, "kv_cache_bytes": 1.0}, {}, {})
    assert objectives.values(passkey, "cpu")[2] == 0.25


@pytest.mark.slow  # composes a config per point and loads a tokenizer
def test_a_point_the_plan_predicts_over_the_budget_is_pruned_with_its_bytes(tmp_path):
    def search(budget=None):
        settings = SearchSettings(trials=3, memory_budget=budget)
        return Search.start(settings, [*JOB, *SPACE], tmp_path, tmp_path / "sweep")

    probe = search()
    dense, int2, _ = probe.space.points
    between = (probe.predicted_bytes(dense) + probe.predicted_bytes(int2)) // 2
    assert probe.predicted_bytes(int2) < between < probe.predicted_bytes(dense)
    pruning = search(f"{between}")
    pruned = pruning._pruned(dense)
    assert pruned.outcome == "pruned" and "(weights + KV cache) >" in pruned.detail
    assert pruning._pruned(int2) is None
    (record,) = (tmp_path / "sweep" / "pruned").glob("*/result.json")
    assert "pruned: predicted" in record.read_text()


@pytest.mark.slow  # starts a kvpipe process per case
def test_bad_advise_input_is_one_line_with_exit_2(tmp_path):
    for args, field in ((["--trials", "0"], "--trials"), (["--timeout", "soon"], "--timeout"),
                        (["--min-accuracy", "2"], "--min-accuracy"), (["tracking=off"], "tracking")):  # fmt: skip
        proc = run_cli(["advise", *args], cwd=tmp_path)
        assert proc.returncode == 2, (args, proc.stderr)
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith(f"kvpipe: error: {field}")
    assert not (tmp_path / "outputs").exists()  # nothing half-written


def test_durations_read_as_a_user_writes_them():
    from kvpipe.commands.advise import parse_duration

    assert [parse_duration(t) for t in ("20m", "90s", "1h30m", "600", "1.5m")] == [1200, 90, 5400, 600, 90]
    with pytest.raises(ConfigError):
        parse_duration("0")


def test_durations_and_etas_print_one_way_everywhere():
    from kvpipe.units import duration_text, eta_text

    assert [duration_text(s) for s in (0, 45.9, 65, 1200, 5400)] == ["0s", "45s", "1m05s", "20m00s", "90m00s"]
    assert eta_text(10.0, 2, 5) == "15s" and eta_text(10.0, 3, 4) == "4s"  # 3.33 s left: rounded up
    assert eta_text(30.0, 1, 4) == "1m30s" and eta_text(5.0, 4, 4) == eta_text(0.0, 0, 4) == "0s"


# ---- end to end: one advise, asked twice -------------------------------------------------------


@pytest.fixture(scope="module")
def advised(tmp_path_factory, existing_store):
    launch = tmp_path_factory.mktemp("advise")
    existing_store(launch)
    first = run_cli(["advise", *JOB, *SPACE, "--trials", "3"], cwd=launch)
    again = run_cli(["advise", *JOB, *SPACE, "--trials", "3", "--max-tpot-ms", "0.001"], cwd=launch)
    return launch, first, again


def mlflow_children(launch):
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{launch}/outputs/mlflow.db")
    runs = mlflow.search_runs(experiment_names=["kvpipe"], output_format="list")
    return [r for r in runs if r.data.tags.get("kvpipe.status") == "FINISHED" and r.data.metrics]


@pytest.mark.slow  # an advise of three tiny_random jobs, then the same space under other limits
def test_advise_plans_searches_and_recommends_with_the_front_and_the_use_line(advised):
    launch, first, _ = advised
    assert first.returncode == 0, first.stderr[-3000:]
    out = first.stdout
    assert "kvpipe plan" in out and "Pareto front within the limits" in out
    assert "recommend: " in out and "use: python -m kvpipe model=tiny_random" in out and "api.cache_kwargs" in out
    assert "trial 3/3 measured" in first.stderr and "best so far" in first.stderr and "ETA" in first.stderr
    assert len(mlflow_children(launch)) == 3  # one child per trial, under one parent
    (study,) = (launch / "outputs").glob("optuna.db")  # beside the tracking store
    per_study = (
        sqlite3.connect(study)
        .execute("select study_id, count(*) from trials where state = 'COMPLETE' group by study_id order by study_id")
        .fetchall()
    )
    assert [count for _, count in per_study] == [3, 3]  # this advise's study, and the one asked under other limits


@pytest.mark.slow  # reads the advise above
def test_a_second_advise_measures_nothing_again_and_without_an_answer_exits_1_naming_the_closest(advised):
    launch, _, again = advised
    assert again.returncode == 1, again.stderr[-3000:]
    assert again.stderr.count(" reused: ") == 3  # another study (other limits), the same measurements
    assert "no measured run meets the limits" in again.stdout and "closest: " in again.stdout
    assert "misses only TPOT" in again.stdout
    assert len(mlflow_children(launch)) == 3  # no job measured twice


@pytest.mark.slow  # a search killed after its first job, then run again
def test_a_killed_search_resumes_where_it_stopped(tmp_path, existing_store):
    existing_store(tmp_path)
    # stopped as its second job begins: the first is recorded in MLflow and told to the study by then
    second_job = ("kvpipe.orchestrate.task:run_sweep_job", 2)
    search = ["-m", "hydra/sweeper=search", "hydra.sweeper.trials=3", *JOB, *SPACE]
    proc = start_cli(search, tmp_path, pause_at=second_job, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until_paused(proc, paused(tmp_path))
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    done_before = len(mlflow_children(tmp_path))
    assert done_before == 1
    resumed = run_cli(["-m", "hydra/sweeper=search", "hydra.sweeper.trials=3", *JOB, *SPACE], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert len(mlflow_children(tmp_path)) == 3  # each point measured once over both attempts
    assert resumed.stderr.count(" measured: ") == 3 - done_before
    parents = {r.data.tags.get("mlflow.parentRunId") for r in mlflow_children(tmp_path)}
    assert len(parents) == 1  # the resumed search's jobs join the first one's parent


def test_every_trial_scores_as_many_tokens_so_kl_compares_and_the_default_spelled_out_is_the_same_measurement():
    from kvpipe.orchestrate.search.study import _scored_alike

    from conftest import spec_for

    quantized = ["model=tiny_random", "cache=quantized", "backend=hqq"]
    key = spec_for(*quantized, "backend.residual_length=128").measurement_key()
    assert spec_for(*quantized, "backend.residual_length=128", "quality.scored_tokens=160").measurement_key() == key
    assert spec_for(*quantized, "backend.residual_length=128", "quality.scored_tokens=64").measurement_key() != key
    space = build(head_dim=64, device="cpu", restrict={"backend.residual_length": ["0", "256"]})
    spec = spec_for(*quantized)
    assert _scored_alike(["model=tiny_random"], spec, space) == ["model=tiny_random", "quality.scored_tokens=288"]
    assert _scored_alike(["quality.scored_tokens=50"], spec_for("quality.scored_tokens=50"), space) == [
        "quality.scored_tokens=50"
    ]
    assert _scored_alike(["quality=off"], spec_for("quality=off"), space) == ["quality=off"]
