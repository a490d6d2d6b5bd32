"""kvpipe's default sweeper (kvpipe.orchestrate.grid): Hydra's basic grid, each job's config composed once."""

from __future__ import annotations

import json

import pytest

from kvpipe.orchestrate.grid import ComposedOnce

from conftest import run_cli


class CountingLoader:
    def __init__(self):
        self.calls = []
        self.name = "the loader's own attribute"

    def load_sweep_config(self, master_config, sweep_overrides):
        self.calls.append(tuple(sweep_overrides))
        return {"overrides": list(sweep_overrides), "call": len(self.calls)}


def test_the_batch_checks_composition_is_the_one_the_launcher_gets():
    loader = CountingLoader()
    composed = ComposedOnce(loader)
    master = object()
    checked = [
        composed.load_sweep_config(master, ["cache=dynamic"]),
        composed.load_sweep_config(master, ["cache=static"]),
    ]
    launched = [
        composed.load_sweep_config(master, ["cache=dynamic"]),
        composed.load_sweep_config(master, ["cache=static"]),
    ]
    assert launched == checked and launched[0] is checked[0]
    assert loader.calls == [("cache=dynamic",), ("cache=static",)]
    # handed over once: a third call for the same job (a second batch, a rerun) composes afresh
    assert composed.load_sweep_config(master, ["cache=dynamic"])["call"] == 3
    assert composed.load_sweep_config(object(), ["cache=dynamic"])["call"] == 4  # another master config
    assert composed.name == "the loader's own attribute"


@pytest.mark.slow  # two tiny sweeps in this process
@pytest.mark.parametrize("sweeper, compositions", [(None, 2), ("hydra/sweeper=basic", 4)])
def test_a_sweep_composes_each_jobs_config_once_and_hydras_basic_sweeper_twice(
    tmp_path, monkeypatch, sweeper, compositions
):
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    calls = []
    real = ConfigLoaderImpl.load_sweep_config
    monkeypatch.setattr(
        ConfigLoaderImpl, "load_sweep_config", lambda self, *a, **k: calls.append(1) or real(self, *a, **k)
    )
    job = ["model=tiny_random", "workload.max_new_tokens=2", "workload.warmup=0", "quality=off", "tracking=off"]
    proc = run_cli(["-m", "cache=dynamic,static", *job, *([sweeper] if sweeper else [])], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(calls) == compositions
    results = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("outputs/multiruns/*/*/*/result.json"))]
    assert [r["config"]["cache"]["strategy"] for r in results] == ["dynamic", "static"]
    assert {r["status"] for r in results} == {"FINISHED"}


def test_the_loader_travels_to_a_launchers_processes():
    import pickle

    composed = ComposedOnce(CountingLoader())
    composed.load_sweep_config("master", ["cache=static"])
    travelled = pickle.loads(pickle.dumps(composed))
    assert travelled.name == "the loader's own attribute" and travelled._composed == composed._composed


def test_an_install_without_the_grid_sweeper_says_so_in_one_line(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "hydra_plugins.kvpipe_grid", None)  # as an older editable install maps it
    proc = run_cli(["-m", "cache=dynamic,static", "model=tiny_random", "tracking=off"], cwd=tmp_path)
    assert proc.returncode == 2 and not (tmp_path / "outputs").exists()
    assert proc.stderr.strip().splitlines() == [
        "kvpipe: error: this kvpipe install predates one of its Hydra plugins (hydra_plugins.kvpipe_grid is missing): "
        "install it again (make venv, or pip install -e .)"
    ]
