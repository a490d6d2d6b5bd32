"""Typed schemas for the config groups that no plugin extends: model, axis, quality, tracking.

The groups that plugins extend (cache, backend, press, workload, load) get two schemas from what
each registered class declares (its `Settings`): `group_schema`, what Hydra composes (every key any
option declares, so a misspelt key fails at composition), and `option_schema`, one dataclass per
option with its own types and defaults, which kvpipe.jobspec checks the chosen option against.
kvpipe.jobspec.schema, above the registries, assembles them with these into the whole config and
stores it in Hydra's ConfigStore (the first entry of `conf/config.yaml`'s defaults list).
Composition errors from Hydra and OmegaConf become one line here (`from_hydra`). Imports no
registry; pure Python: importing this module must not import torch, transformers or mlflow.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from kvpipe.errors import choices

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
ATTN_IMPLEMENTATIONS = ("sdpa", "eager")
MODEL_SOURCES = ("embedded", "random", "hf")
DEVICE_MAPS = ("auto", "balanced", "sequential")


@dataclass
class ModelConfig:
    name: str = "smollm2_135m"
    source: str = "embedded"  # embedded | random | hf
    name_or_path: Optional[str] = None  # source=hf: a local folder or a hub id
    revision: Optional[str] = None
    trust_remote_code: bool = False
    dtype: str = "auto"  # auto: float32 on CPU, bfloat16 on CUDA when supported
    device: str = "auto"  # auto: CUDA when available
    attn_implementation: str = "sdpa"
    # torch threads on CPU while measuring; null: $OMP_NUM_THREADS where set, else the physical cores
    threads: Optional[int] = None
    device_map: Optional[str] = None  # hf only: accelerate's placement for models larger than one GPU
    # hf only: the config.json fields that shape the KV cache and weights, so that `kvpipe plan`
    # answers without the network; a local folder's own config.json wins over it
    architecture: Optional[Dict[str, Any]] = None
    seed: int = 0
    # Only for source=random: the shape of the seeded tiny Llama.
    vocab_size: int = 49152  # the embedded tokenizer's, which random models borrow
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: Optional[int] = None
    max_position_embeddings: int = 4096
    sliding_window: Optional[int] = None  # alone: a Mistral whose every layer slides
    # with sliding_window: a Gemma 3 text model, e.g. [sliding_attention, sliding_attention, full_attention]
    layer_types: Optional[List[str]] = None


# model.* settings only one source reads; every other model.* setting is read by all.
SOURCE_FIELDS = {
    "embedded": (),
    "random": ("seed", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "max_position_embeddings", "sliding_window", "layer_types"),
    "hf": ("name_or_path", "revision", "trust_remote_code", "device_map", "architecture"),
}  # fmt: skip


@dataclass
class AxisConfig:
    layout: str = "kivi"  # per_token | per_channel | kivi
    key: Optional[int] = None  # raw backend axis for keys; overrides layout
    value: Optional[int] = None  # raw backend axis for values; overrides layout


def reads(owned: dict[str, tuple[str, ...]], choice: str | None, name: str) -> bool:
    """Whether a model source (`choice`) reads its group's setting `name`, given
    which settings each choice owns alone (an unknown choice: assume it does)."""
    owners = {field for fields in owned.values() for field in fields}
    return name not in owners or choice not in owned or name in owned[choice]


@dataclass
class QualityConfig:
    enabled: bool = True
    windows: int = 3  # texts scored: each workload's own (kvpipe.workload: Workload.windows)
    scored_tokens: Optional[int] = None  # fed one by one and scored; default max(64, backend.residual_length + 32)

    @staticmethod
    def default_scored_tokens(residual_length: int) -> int:
        """More than a quantized cache's residual (so it re-quantizes at least once while it is
        scored), and at least 64."""
        return max(64, residual_length + 32)


@dataclass
class TrackingConfig:
    enabled: bool = True
    uri: Optional[str] = None  # default: sqlite:///<launch dir>/<store_dir>/mlflow.db
    store_dir: str = "outputs"  # where the default store lives, relative to the launch dir
    experiment: str = "kvpipe"
    run_name: Optional[str] = None


# Every schema by class name, for from_hydra to name a misspelt key's valid ones: these, and those
# assembled above this module (the unions, kvpipe.jobspec.schema.KvpipeConfig), which `known` adds.
SCHEMAS: dict[str, type] = {
    schema.__name__: schema for schema in (ModelConfig, AxisConfig, QualityConfig, TrackingConfig)
}


def known(schema: type) -> type:
    """Let from_hydra find a schema defined elsewhere by its class name (a decorator: returns it)."""
    SCHEMAS[schema.__name__] = schema
    return schema


def group_schema(name: str, key: str, options: list, module: str, common: type | None = None) -> type:
    """What Hydra composes for a group that plugins extend: `key` (the option's name, defaulting to
    the first option), the `common` settings every option reads (typed), and every setting any
    option declares, typed Any and null (unset) by default. Permissive on purpose: a setting of
    another option of the group composes (kvpipe.jobspec warns that it is ignored, as a sweep over the
    options needs), a key no option declares fails, and the chosen option's own types are checked
    by `option_schema`'s dataclass. Kept in `module`, by `name`: launchers pickle configs by reference."""
    fields_ = [(key, str, field(default=options[0].name)), *_typed_fields(common)]
    taken = {entry[0] for entry in fields_}
    for option in options:
        for setting in dataclasses.fields(option.Settings):
            if setting.name not in taken:
                taken.add(setting.name)
                fields_.append((setting.name, Any, field(default=None)))
    schema = dataclasses.make_dataclass(name, fields_)
    schema.__module__ = module
    return known(schema)


class OptionConfig:
    """The typed config of one option of a group (a strategy's, a backend's...): its name, the
    group's common settings and its own `Settings`, each with its own type and default."""

    plugin: typing.ClassVar[type]  # the registered class it configures
    selector: typing.ClassVar[str]  # the field naming the option: cache.strategy's `strategy`
    common: typing.ClassVar[Optional[type]]

    def __reduce__(self):
        # made at run time, so pickled as (plugin, values): a launcher's worker rebuilds the class
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return _restored, (self.plugin, self.common, values)


def _restored(plugin: type, common: Optional[type], values: dict) -> OptionConfig:
    return option_schema(plugin, common)(**values)


_OPTION_SCHEMAS: dict[tuple[type, Optional[type]], type] = {}


def option_schema(plugin: type, common: type | None = None) -> type:
    """The dataclass of one option's config: `plugin.registry.field`'s key (e.g. `strategy`) set to
    its name, then `common`'s fields and its own `Settings`, each with its own type and default.
    One class per plugin: equal configs compare equal, and `retyped` moves between options."""
    cached = _OPTION_SCHEMAS.get((plugin, common))
    if cached is not None:
        return cached
    group, _, key = plugin.registry.field.partition(".")
    fields_ = [(key, str, field(default=plugin.name)), *_typed_fields(common), *_typed_fields(plugin.Settings)]
    title = "".join(part.capitalize() for part in f"{plugin.name}_{group}".split("_"))
    schema = dataclasses.make_dataclass(
        f"{title}Config",
        fields_,
        bases=(OptionConfig,),
        namespace={"plugin": plugin, "selector": key, "common": common},
    )
    schema.__module__ = __name__
    _OPTION_SCHEMAS[(plugin, common)] = schema
    return schema


def retyped(value, schema: type, **changes):
    """`value`, an option's config, as `schema`'s (another option of its group): the fields both
    declare kept, the rest at `schema`'s defaults, then `changes`."""
    declared = {f.name for f in dataclasses.fields(schema)} - {schema.selector}
    kept = {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.name in declared}
    return schema(**{**kept, **changes})


def _typed_fields(settings: type | None) -> list[tuple]:
    """(name, type, field) of a settings dataclass, its string annotations resolved."""
    if settings is None:
        return []
    hints = typing.get_type_hints(settings)
    return [
        (
            setting.name,
            hints[setting.name],
            field(default_factory=setting.default_factory)
            if setting.default_factory is not dataclasses.MISSING
            else field(default=setting.default),
        )
        for setting in dataclasses.fields(settings)
    ]


# ---- composition errors -------------------------------------------------------------------------


# Options an optional install adds (conf/hydra/launcher/ray_cluster.yaml builds on hydra/launcher/ray)
OPTIONAL_PLUGINS = {
    ("hydra/launcher", "ray"): "hydra/launcher=ray and ray_cluster need Ray and Hydra's Ray launcher, not installed "
    "here; install them with: make ray",
}


def from_hydra(exc: BaseException) -> Optional[str]:
    """Turn a Hydra/OmegaConf composition error into one line, or None if it is not one."""
    text = str(exc)
    cause = exc.__cause__ or exc.__context__
    full = text + "\n" + (str(cause) if cause else "")

    missing_option = re.search(r"Could not find '([\w/]+)/([^']+)'", full)
    if missing_option:
        group, option = missing_option.groups()
        if (group, option) in OPTIONAL_PLUGINS:
            return OPTIONAL_PLUGINS[group, option]
        available = re.search(r"Available options in '[\w/]+':\s*((?:\n\s+\S+)+)", full)
        options = available.group(1).split() if available else []
        return f"{group}={option} is not a known option; " + (
            choices(options, given=option) if options else "no options found"
        )

    # Hydra's own hint for a group that the defaults list does not have (experiment=... needs +)
    append = re.search(
        r"Could not override '([^']+)'. No match in the defaults list.\s*To append to your default list use (\S+)",
        full,
    )
    if append:
        return f"{append.group(1)} is not in the defaults list; to add the group, use {append.group(2)}"

    unknown_key = re.search(r"Key '([^']+)' not in '(\w+)'", full)
    full_key = re.search(r"full_key: (\S+)", full)
    if unknown_key:
        key = full_key.group(1) if full_key else unknown_key.group(1)
        valid = _schema_fields(unknown_key.group(2))
        return f"{key} is not a known key; " + (
            choices(valid, given=key.rpartition(".")[2]) if valid else "check the spelling"
        )

    wrong_type = re.search(r"Value '([^']*)' (?:of type '\w+' )?could not be converted to (\w+)", full)
    if wrong_type and full_key:
        return f"{full_key.group(1)}={wrong_type.group(1)!r} has the wrong type; expected {wrong_type.group(2)}"

    missing_value = re.search(r"Missing mandatory value: (\S+)", full)
    if missing_value:
        return f"{missing_value.group(1)} must be set, e.g. {missing_value.group(1)}=/path/to/model"

    wrong_type = re.search(r"Value '([^']*)' (?:is not a valid|could not be converted to) (bool|int|float)", full)
    if wrong_type and full_key:
        value, kind = wrong_type.groups()
        expected = {"bool": "true or false", "int": "a whole number", "float": "a number"}[kind]
        return f"{full_key.group(1)}={value}: expected {expected}"

    bad_override = re.search(r"Error parsing override '([^']+)'", full)
    if bad_override:
        return f"could not parse the override {bad_override.group(1)!r}; expected key=value"

    line = next((line for line in text.splitlines() if line.strip()), text)
    return line or None


def _schema_fields(class_name: str) -> list[str]:
    schema = SCHEMAS.get(class_name)
    return [f.name for f in dataclasses.fields(schema)] if schema else []
