"""advise and capacity find their sweep wherever hydra.sweep.dir puts it, name that folder, and answer;
they record every job and their parent run in the store the user names (tracking.uri=, or the
environment's MLFLOW_TRACKING_URI), none in ./outputs; a second identical service advise measures
nothing; every use: line carries only what its cache reads."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from kvpipe.errors import ConfigError
from kvpipe.orchestrate.search.launch import sweep_dir_of

from conftest import TINY, run_cli

JOB = [o for o in TINY if o != "tracking=off"] + ["workload.repeats=1"]
# given to every job of the walk; cache=dynamic reads none of it, so no use: line may carry it
BACKEND = ["backend=quanto", "backend.nbits=4"]


def test_the_sweep_folder_is_the_one_given_its_interpolations_resolved_once():
    assert sweep_dir_of(["model=tiny_random"], "advise").parts[:2] == ("outputs", "advise")
    assert str(sweep_dir_of(["hydra.sweep.dir=/a", "hydra.sweep.dir=/tmp/b"], "advise")) == "/tmp/b"
    assert re.fullmatch(r"/tmp/x/\d\d", str(sweep_dir_of(["hydra.sweep.dir=/tmp/x/${now:%H}"], "capacity")))
    with pytest.raises(ConfigError, match=r"hydra.sweep.dir='/tmp/\$\{nope:x\}' is not valid: expected a folder"):
        sweep_dir_of(["hydra.sweep.dir=/tmp/${nope:x}"], "advise")  # no such resolver: refused before any job


def _use(out: str) -> str:
    return out.split("use: ")[1].splitlines()[0]


@pytest.mark.slow  # two walks of dynamic at concurrency 1 and 2 on tiny_random (the second reuses both)
def test_service_advise_in_a_given_folder_answers_and_asked_again_measures_nothing(tmp_path, existing_store):
    existing_store(tmp_path)
    folder = tmp_path / "elsewhere" / "advise"
    args = ["advise", "--objective", "throughput", "--concurrency", "1,2", *JOB, "cache=dynamic", *BACKEND,
            f"hydra.sweep.dir={folder}"]  # fmt: skip
    first = run_cli(args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert f"trials in {folder}" in first.stdout and (folder / "capacity.json").is_file()
    assert "advise: the walk took 2 jobs of the grid's 2: 2 measured, 0 reused" in first.stdout
    assert "recommend: dynamic at concurrency(" in first.stdout and "advise: done in" in first.stdout
    assert _use(first.stdout).startswith("python -m kvpipe model=tiny_random") and "backend" not in _use(first.stdout)
    again = run_cli(args, cwd=tmp_path)  # the same folder, as the same command line gives it
    assert again.returncode == 0, again.stderr[-3000:]
    assert "advise: the walk took 2 jobs of the grid's 2: 0 measured, 2 reused" in again.stdout
    answer = [line for line in first.stdout.splitlines() if line.startswith(("recommend: ", "  use: "))]
    assert answer == [line for line in again.stdout.splitlines() if line.startswith(("recommend: ", "  use: "))]
    parent = first.stdout.split("kvpipe compare --parent ")[1].split("`")[0]
    asked = run_cli(["recommend", "--objective", "throughput", "--parent", parent], cwd=tmp_path)
    assert asked.returncode == 0 and _use(asked.stdout) == _use(first.stdout)


def runs_in(db: Path) -> list:
    import mlflow

    return mlflow.MlflowClient(f"sqlite:///{db}").search_runs(
        [e.experiment_id for e in mlflow.MlflowClient(f"sqlite:///{db}").search_experiments()]
    )


@pytest.mark.slow  # a search of two trials (dynamic, static) on tiny_random
def test_advise_search_in_a_given_folder_answers_into_the_store_the_environment_names(tmp_path, existing_store):
    from conftest import kvpipe_here

    mine = existing_store(tmp_path, "stores/mine.db")  # the user's store, named by MLFLOW_TRACKING_URI
    folder = tmp_path / "search"
    args = ["advise", "--trials", "2", *[o for o in JOB if o != "quality=off"], "quality.windows=1",
            "quality.scored_tokens=16", "cache=dynamic,static", f"hydra.sweep.dir={folder}"]  # fmt: skip
    said = kvpipe_here(args, tmp_path, env={**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{mine}"})
    assert said.returncode == 0, said.stderr[-3000:]
    assert f"trials in {folder}" in said.stdout and (folder / "multirun.yaml").is_file()
    assert "recommend: " in said.stdout and "has no MLflow parent run" not in said.stderr
    # every trial and their parent in the user's store, nothing in ./outputs
    assert len(runs_in(mine)) == 3 and not (tmp_path / "outputs" / "mlflow.db").exists()


@pytest.mark.slow  # capacity of dynamic on tiny_random within generous targets
def test_capacity_in_a_given_folder_and_store_answers_with_a_use_line_of_what_its_cache_reads(tmp_path, existing_store):
    mine = existing_store(tmp_path, "stores/mine.db")  # the user's store, named by tracking.uri
    folder = tmp_path / "capacity"
    said = run_cli(["capacity", *JOB, "cache=dynamic", *BACKEND, "--max-ttft-ms", "60000", "--max-tpot-ms", "60000",
                    "--requests", "4", f"hydra.sweep.dir={folder}", f"tracking.uri=sqlite:///{mine}"], cwd=tmp_path)  # fmt: skip
    assert said.returncode == 0, said.stderr[-3000:]
    assert f"points in {folder}" in said.stdout and (folder / "capacity.json").is_file()
    # every point and their parent in the user's store, nothing in ./outputs
    jobs = json.loads((folder / "capacity.json").read_text())["jobs"]
    assert len(runs_in(mine)) == jobs + 1 and not (tmp_path / "outputs" / "mlflow.db").exists()
    use = _use(said.stdout)
    assert "cache=dynamic load=rate load.rate=" in use and "backend" not in use and "hydra." not in use


def test_a_folder_with_a_comma_space_or_quote_reaches_hydra_as_one_value():
    from kvpipe.orchestrate.search.launch import _hydra_quoted, _parsed

    for folder in ("/tmp/a b,c", "/tmp/it's", "/tmp/plain-1.2_x"):
        (override,) = _parsed([f"hydra.sweep.dir={_hydra_quoted(Path(folder))}"])
        assert override.value() == folder and not override.is_sweep_override()
