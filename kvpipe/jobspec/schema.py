"""The whole config's typed schema, assembled from the registries and stored in Hydra's ConfigStore.

The groups that plugins extend (cache, backend, press, workload, load, engine: `PLUGGED`) are each composed
through a permissive schema holding every key any of their options declares (kvpipe.config's
`group_schema`), and the chosen option is then checked against its own typed dataclass
(`option_schema`, in kvpipe.jobspec.options), so adding an option never edits a schema; the other
groups' schemas are kvpipe.config's. `KvpipeConfig` is the first entry of `conf/config.yaml`'s
defaults list (`register_schemas`), so a misspelt key fails at composition. Pure Python: no torch,
transformers or mlflow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from hydra.core.config_store import ConfigStore

from kvpipe import cache, engine, load, workload
from kvpipe.cache import backends, presses

# OmegaConf reads KvpipeConfig's field types by name in this module's namespace: the plain schemas by
# import, the group schemas as rebuilt by register_schemas.
from kvpipe.config import AxisConfig, ModelConfig, QualityConfig, TrackingConfig, group_schema, known
from kvpipe.config import option_schema as _option_schema
from kvpipe.jobspec import composed_once, parsed_once
from kvpipe.registry import Registered, Registry

# Each group that plugins extend: its registry (which names its key) and the settings every option reads.
PLUGGED: dict[str, tuple[Registry, type | None]] = {
    "cache": (cache.CacheStrategy.registry, None),
    "backend": (backends.QuantBackend.registry, None),
    "press": (presses.Press.registry, presses.Common),
    "workload": (workload.Workload.registry, workload.Common),
    "load": (load.Load.registry, load.Common),
    "engine": (engine.Engine.registry, None),
}


def option_schema(plugin: type[Registered]) -> type:
    """The typed config of one option (a registered class), with its group's common settings."""
    return _option_schema(plugin, PLUGGED[plugin.registry.group][1])


def _build_group_schemas() -> None:
    global CacheConfig, BackendConfig, PressConfig, WorkloadConfig, LoadConfig, EngineConfig
    built = {
        group: group_schema(f"{group.capitalize()}Config", registry.key, registry.registered(), __name__, common)
        for group, (registry, common) in PLUGGED.items()
    }
    CacheConfig, BackendConfig, PressConfig = built["cache"], built["backend"], built["press"]
    WorkloadConfig, LoadConfig, EngineConfig = built["workload"], built["load"], built["engine"]


CacheConfig: type
BackendConfig: type
PressConfig: type
WorkloadConfig: type
LoadConfig: type
EngineConfig: type
_build_group_schemas()


@known
@dataclass
class KvpipeConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=lambda: CacheConfig())
    backend: BackendConfig = field(default_factory=lambda: BackendConfig())
    axis: AxisConfig = field(default_factory=AxisConfig)
    press: PressConfig = field(default_factory=lambda: PressConfig())  # eviction (press=none|streaming|knorm|snapkv)
    workload: WorkloadConfig = field(default_factory=lambda: WorkloadConfig())
    quality: QualityConfig = field(default_factory=QualityConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    load: Optional[LoadConfig] = None  # how requests arrive (load=offline|concurrency|rate); null: batch by batch
    engine: EngineConfig = field(
        default_factory=lambda: EngineConfig()
    )  # what generates (engine=transformers|llama_cpp)
    print_table: bool = True
    fallback: List[str] = field(default_factory=list)  # retried in order after out-of-memory (conf/config.yaml)
    resume: bool = False  # multirun: skip jobs already FINISHED in the experiment
    sweep_name: Optional[str] = None  # multirun: the MLflow parent run's name
    interleave: str = (
        "auto"  # multirun: auto|true|false, the jobs measured in shared rounds (kvpipe.orchestrate.interleave)
    )
    # multirun in processes of their own (joblib, submitit, Ray): each job takes turns with a copy of the
    # sweep's baseline in its own process (kvpipe.orchestrate.on_node)
    pair_on_node: bool = True


_stored_for: tuple | None = None  # the registered plugins the stored schema was built from


def _registered_plugins() -> tuple:
    # the classes themselves, not their ids: a class held here cannot be freed and its id reused
    return tuple(option for registry, _ in PLUGGED.values() for option in registry.registered())


def register_schemas() -> None:
    """Store the schema under `kvpipe_schema`, the first entry of conf/config.yaml's defaults; the
    group schemas are rebuilt when plugins were registered since the last store, so they count.
    From now on, packaged config files are parsed once per process (kvpipe.jobspec.parsed_once) and
    each choice of config groups is composed once (kvpipe.jobspec.composed_once)."""
    global _stored_for
    parsed_once.install()
    composed_once.install()
    plugins = _registered_plugins()
    if _stored_for != plugins:
        _build_group_schemas()
        ConfigStore.instance().store(name="kvpipe_schema", node=KvpipeConfig)
        _stored_for = plugins


# compose's results in this process: Hydra reads and merges ~20 YAML files a composition (0.25 s on
# 2 cores), a copy of the result takes 5 ms, and the test suite composes the same configs hundreds of times
_COMPOSED: dict[tuple, object] = {}


def compose(overrides: list[str] | tuple[str, ...] = (), with_hydra: bool = False):
    """Compose conf/config.yaml with overrides, as `python -m kvpipe` would (for tests and benchmarks).
    Each call returns a config of its own; one composed before in this process, with the same overrides
    and the same registered plugins, is copied rather than composed again. A config folder named by
    `hydra.searchpath` is the caller's to change, so those are composed every time."""
    import copy

    key = (tuple(overrides), with_hydra, _registered_plugins())
    searched = any(o.lstrip("+~").startswith("hydra.searchpath") for o in overrides)
    if searched or key not in _COMPOSED:
        composed = _compose(overrides, with_hydra)
        if searched:
            return composed
        _COMPOSED[key] = composed
    return copy.deepcopy(_COMPOSED[key])


def _compose(overrides, with_hydra: bool):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    register_schemas()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module="kvpipe.conf", version_base="1.3"):
            return hydra_compose(config_name="config", overrides=list(overrides), return_hydra_config=with_hydra)
    finally:
        GlobalHydra.instance().clear()
