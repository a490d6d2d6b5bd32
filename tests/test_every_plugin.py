"""Every registered plugin (each cache strategy, quantization backend, press, load and workload),
read from the registries: it composes as `group=name` plus its own `test_overrides` into a valid
Spec, and a short real job on model=tiny_random produces the core metrics (and the workload's own).
A plugin added tomorrow is tested here with no line of this file changed."""

from __future__ import annotations

import pytest

from kvpipe.jobspec import spec_from
from kvpipe.jobspec.schema import PLUGGED

from conftest import REPO

QUICK = ("model=tiny_random", "workload.max_new_tokens=4", "workload.warmup=0", "workload.repeats=1",
         "tracking=off", "quality=off")  # fmt: skip
CORE_METRICS = ("ttft_ms", "tpot_ms", "kv_cache_bytes")  # what every job measures, batch by batch or served

PLUGINS = [(group, plugin) for group, (registry, _) in PLUGGED.items() for plugin in registry.registered()]


def plugin_id(case) -> str:
    group, plugin = case
    return f"{group}={plugin.name}"


@pytest.fixture(autouse=True)
def from_the_repository_root(monkeypatch):
    monkeypatch.chdir(REPO)  # test_overrides name files as a user in the repository would (examples/...)


def overrides_of(group: str, plugin) -> list[str]:
    return [*QUICK, f"{group}={plugin.name}", *plugin.test_overrides]


@pytest.mark.parametrize("case", PLUGINS, ids=plugin_id)
def test_every_plugin_composes_into_a_valid_spec_from_its_own_declarations(case):
    group, plugin = case
    spec = spec_from(overrides_of(group, plugin))
    chosen = getattr(spec, group)  # None: the option that means "none" (press=none)
    assert chosen is None or type(chosen).plugin is plugin
    assert spec.warnings == (), "its test_overrides set only what it reads"


@pytest.mark.slow  # a real job each (~1 s; the first loads the model)
@pytest.mark.parametrize("case", PLUGINS, ids=plugin_id)
def test_every_plugin_runs_a_short_job_with_its_core_metrics(case):
    from kvpipe.job.runner import run_job

    group, plugin = case
    spec = spec_from(overrides_of(group, plugin))
    if spec.bound_engine is not None and spec.bound_engine.missing():
        pytest.skip(spec.bound_engine.missing())  # an engine's server not built here (make engines)
    metrics = run_job(spec).metrics
    for name in CORE_METRICS:
        assert metrics[name] > 0, name
    # a workload that scores its own way, on its own quick job (another group's may run one it scores nothing of)
    for metric in spec.bound_workload.metrics if group == "workload" else ():
        assert metric.name in metrics, metric.name


@pytest.mark.parametrize("case", PLUGINS, ids=plugin_id)
def test_every_plugins_config_is_its_name_the_groups_common_settings_and_its_own_with_their_defaults(case):
    import dataclasses

    from kvpipe.jobspec.schema import option_schema

    group, plugin = case
    registry, common = PLUGGED[group]
    config = option_schema(plugin)()
    own = [*(dataclasses.fields(common) if common else ()), *dataclasses.fields(plugin.Settings)]
    assert [f.name for f in dataclasses.fields(config)] == [registry.key, *(f.name for f in own)]
    assert getattr(config, registry.key) == plugin.name
    for setting in own:
        default = setting.default_factory() if setting.default is dataclasses.MISSING else setting.default
        assert getattr(config, setting.name) == default, setting.name
