"""Config composition: every group option composes into a valid spec; the schema is strict."""

from __future__ import annotations

import dataclasses

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
    if option == "lm_eval":  # names its tasks: the example's, from its own folder
        overrides += [f"workload.include_path={REPO}/examples/lm_eval", "workload.tasks=[kvpipe_questions]"]
    # served under a load, never batch by batch: paged serves requests, a conversation's turns wait on answers
    if (group, option) in (("cache", "paged"), ("workload", "conversation")):
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

    from kvpipe.jobspec import compose
    from kvpipe.orchestrate.sweep import count_jobs, sweep_name, swept_values

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


# ---- typed options: each option of a group checked against its own types and defaults ----------


@pytest.mark.parametrize(
    "overrides,field,expected",
    [
        (["press=snapkv", "press.window=abc"], "press.window='abc'", "expected int (press=snapkv's type)"),
        (["press=streaming", "press.window=true"], "press.window=True", "expected int or null (press=streaming's"),
        (["load=rate", "load.rate=fast"], "load.rate='fast'", "expected float (load=rate's type)"),
        (["cache=static", "cache.max_cache_len=long"], "cache.max_cache_len='long'", "expected int or null"),
    ],
)
def test_a_wrong_type_for_the_chosen_option_is_refused_in_one_line_naming_its_type(overrides, field, expected):
    with pytest.raises(ConfigError) as refused:
        spec_for("model=tiny_random", *overrides)
    assert str(refused.value).startswith(field) and expected in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_setting_of_another_option_is_a_warning_and_measures_nothing():
    alone = spec_for("model=tiny_random", "load=concurrency")
    given = spec_for("model=tiny_random", "load=concurrency", "load.rate=2")
    assert given.warnings == ("load.rate is ignored by load=concurrency",)
    assert given.measurement_key() == alone.measurement_key() and "rate" not in given.as_dict()["load"]


def test_one_override_serves_a_sweep_over_options_that_read_it_and_options_that_do_not():
    dynamic, static = (spec_for(f"cache={name}", "cache.max_cache_len=512") for name in ("dynamic", "static"))
    assert dynamic.warnings == ("cache.max_cache_len is ignored by cache=dynamic",)
    assert static.strategy.settings.max_cache_len == 512 and static.warnings == ()


def test_a_key_no_option_declares_is_refused_with_a_guess():
    with pytest.raises(
        ConfigError, match=r"cache.max_cache_ln=5 is not valid: not a known key; .*did you mean max_cache_len"
    ):
        spec_for("+cache.max_cache_ln=5")


def test_each_group_holds_only_its_options_own_fields():
    pressed = spec_for("model=tiny_random", "press=knorm")
    assert set(pressed.as_dict()["press"]) == {f.name for f in dataclasses.fields(type(pressed.press))}
    data = spec_for("model=tiny_random", "load=rate", "cache=static").as_dict()
    assert set(data["cache"]) == {"strategy", "max_cache_len", "compile"}
    assert "concurrency" not in data["load"] and "rate" in data["load"]
    assert "context_tokens" not in data["workload"] and "prompts" in data["workload"]  # chat's, not passkey's


def test_an_older_result_config_with_every_options_settings_reads_back_as_the_same_spec():
    """result.json's `config` before options were typed held every option's settings in each group,
    at their defaults: `kvpipe sync` reads it back to the same measurement and no warnings."""
    from omegaconf import OmegaConf

    from kvpipe.jobspec import KvpipeConfig, make_spec
    from kvpipe.jobspec.schema import PLUGGED

    spec = spec_for("model=tiny_random", "cache=quantized", "backend=hqq", "press=snapkv")
    flat = spec.as_dict()
    for group, (registry, _) in PLUGGED.items():
        if group in flat:  # the first option declaring a setting gave it its default
            settings = [f for p in reversed(registry.registered()) for f in dataclasses.fields(p.Settings)]
            flat[group] = {**{f.name: default_of(f) for f in settings}, **flat[group]}
    assert "block_size" in flat["cache"] and "q_group_size" in flat["backend"]
    again = make_spec(OmegaConf.merge(OmegaConf.structured(KvpipeConfig), flat))
    assert again.measurement_key() == spec.measurement_key() and again.warnings == ()
    assert again.as_dict() == spec.as_dict()


def default_of(setting: dataclasses.Field):
    return setting.default_factory() if setting.default is dataclasses.MISSING else setting.default


# ---- a Spec builds its strategy, workload and load once -----------------------------------------


def test_a_spec_keeps_one_strategy_workload_and_load_and_a_replaced_spec_builds_its_own():
    import dataclasses as dc
    import pickle

    spec = spec_for("model=tiny_random", "load=concurrency")
    assert spec.strategy is spec.strategy and spec.bound_workload is spec.bound_workload
    assert spec.bound_load is spec.bound_load
    spec.strategy.noted = "kept"  # state kept on the strategy survives the next access
    assert spec.strategy.noted == "kept"
    other = dc.replace(spec, warnings=())
    assert other.strategy is not spec.strategy and not hasattr(other.strategy, "noted")
    shipped = pickle.loads(pickle.dumps(spec))  # as a launcher ships it to a worker
    assert shipped == spec and shipped.measurement_key() == spec.measurement_key()
    assert shipped.strategy is not spec.strategy and not hasattr(shipped.strategy, "noted")
