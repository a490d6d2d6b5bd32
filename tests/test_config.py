"""Config composition: every group option composes into a valid spec; the schema is strict."""

from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException

from kvpipe.errors import ConfigError

from conftest import REPO, compose_config, spec_for

GROUPS = ("model", "cache", "backend", "axis", "workload", "quality", "tracking", "load")


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (REPO / "conf" / group).glob("*.yaml"))


@pytest.mark.slow  # composes the whole config once per option
@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in group_options(g)])
def test_every_group_option_composes_into_a_plan(group, option):
    overrides = [f"{group}={option}"]
    if option == "hf":
        overrides.append(f"model.name_or_path={REPO}/tests/data/tiny_llama")
    if option == "dataset":
        overrides.append(f"workload.path={REPO}/examples/prompts.jsonl")
    if group == "cache" and option == "paged":  # it serves requests under a load, never batch by batch
        overrides.append("load=concurrency")
    spec = spec_for(*overrides)
    assert spec.workload.max_new_tokens > 0


def test_default_config_is_embedded_model_dynamic_cache_and_sqlite_tracking():
    spec = spec_for()
    assert (spec.model.source, spec.cache.strategy, spec.tracking.enabled) == ("embedded", "dynamic", True)
    assert spec.workload.do_sample is False  # greedy by default
    assert spec.model.trust_remote_code is False


def test_misspelt_key_is_an_error_not_ignored():
    with pytest.raises(ConfigCompositionException, match="max_new_token"):
        compose_config(["workload.max_new_token=5"])


def test_wrong_type_is_an_error():
    with pytest.raises(ConfigCompositionException, match="batch_size"):
        compose_config(["workload.batch_size=two"])


def test_appended_unknown_key_is_rejected_by_the_plan():
    with pytest.raises(ConfigError, match="model.colour"):
        spec_for("+model.colour=red")


def test_params_are_the_settings_the_job_reads_as_plain_text():
    params = spec_for().params()
    assert params["cache.strategy"] == "dynamic" and params["workload.max_new_tokens"] == "32"
    assert params["quality.enabled"] == "true" and params["workload.ignore_eos"] == "true"  # not True
    assert not any(name.startswith(("tracking.", "backend.", "axis.")) for name in params)  # dense: no backend
    assert "workload.prompt_tokens" not in params and "model.hidden_size" not in params  # chat; not random
    assert "None" not in params.values()
    quantized = spec_for("cache=quantized", "workload=long_context", "quality=off").params()
    assert quantized["backend.name"] == "quanto" and quantized["axis.layout"] == "kivi"
    assert quantized["workload.prompt_tokens"] == "1000" and "workload.prompts" not in quantized
    assert "quality.windows" not in quantized  # quality off: its settings were not read
    random = spec_for("model=tiny_random").params()
    assert random["model.hidden_size"] == "64" and random["model.seed"] == "0"


def test_conf_ships_inside_the_package():
    import importlib.resources

    files = importlib.resources.files("kvpipe.conf")
    assert (files / "config.yaml").is_file()
    assert (files / "model" / "smollm2_135m.yaml").is_file()


def test_a_presets_sweep_is_named_and_counted_from_its_own_params_and_the_command_line():
    from omegaconf import OmegaConf, open_dict

    from kvpipe.orchestrate.sweep import count_jobs, sweep_name, swept_values
    from kvpipe.spec import compose

    config = compose(["+experiment=cache_shootout", "model=tiny_random"], with_hydra=True)
    with open_dict(
        config
    ):  # the command line of `kvpipe -m +experiment=cache_shootout model=tiny_random backend.nbits=2,4`
        config.hydra.overrides.task = ["+experiment=cache_shootout", "model=tiny_random", "backend.nbits=2,4"]
    assert OmegaConf.select(config, "hydra.sweeper.params.cache")  # the preset's own sweep
    values = swept_values(config)
    assert values["experiment"] == ["cache_shootout"] and values["model"] == ["tiny_random"]  # no "+" in a key
    assert values["cache"] == ["dynamic", "static", "static_compiled", "offloaded", "offloaded_static", "quantized"]
    assert values["backend.nbits"] == ["2", "4"] and count_jobs(config) == 12
    assert sweep_name(config) == "cache_shootout"
