"""Packaged config files parsed once per process (kvpipe.jobspec.parsed_once), in the class that
Hydra's plugin scan registers for `pkg://` sources, which is not the one its module first defined."""

from __future__ import annotations

from hydra import initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode
from omegaconf import OmegaConf

from kvpipe.jobspec import parsed_once, schema


def test_a_sweeps_next_job_parses_no_packaged_file_again(monkeypatch):
    """As a sweep composes each job's config (Hydra's load_sweep_config): the second job reads the
    same files as the first, and parses none of them."""
    schema.register_schemas()
    monkeypatch.setattr(parsed_once, "_PARSED", {})
    parses = []
    load = OmegaConf.load
    monkeypatch.setattr(OmegaConf, "load", lambda *a, **k: parses.append(a) or load(*a, **k))
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="kvpipe.conf", version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        sweep = loader.load_configuration("config", ["model=tiny_random"], RunMode.MULTIRUN)
        first = loader.load_sweep_config(sweep, ["cache=static", "workload.seed=1"])
        assert parses, "the first job after the reset parses the files it reads"
        parses.clear()
        second = loader.load_sweep_config(sweep, ["cache=static", "workload.seed=2"])
    assert parses == []
    assert (first.workload.seed, second.workload.seed, second.hydra.runtime.choices.cache) == (1, 2, "static")
