"""Typed schemas for the config groups that no plugin extends: model, axis, quality, tracking.

The `cache`, `backend` and `workload` schemas are the union of what the registered strategies,
backends and workloads read (each declares its own `Settings`): `union` makes one, and
kvpipe.spec.schema, above the registries, assembles them with these into the whole config and
stores it in Hydra's ConfigStore (the first entry of `conf/config.yaml`'s defaults list), so a
misspelt key or a wrong type in any group file or override fails at composition, not silently.
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
# assembled above this module (the unions, kvpipe.spec.schema.KvpipeConfig), which `known` adds.
SCHEMAS: dict[str, type] = {
    schema.__name__: schema for schema in (ModelConfig, AxisConfig, QualityConfig, TrackingConfig)
}


def known(schema: type) -> type:
    """Let from_hydra find a schema defined elsewhere by its class name (a decorator: returns it)."""
    SCHEMAS[schema.__name__] = schema
    return schema


def union(name: str, key: str, options: list, module: str, common: type | None = None) -> type:
    """A dataclass with `key` (the option's name, defaulting to the first option), the `common`
    settings every option reads, and every field any option's Settings declares, with the first
    declaring option's type and default. `module` is where it is kept, by `name`: launchers pickle
    configs by reference to ship them to other processes."""
    found: dict[str, tuple] = {}
    for settings in [*([common] if common else []), *(option.Settings for option in options)]:
        hints = typing.get_type_hints(settings)
        for setting in dataclasses.fields(settings):
            default = (
                field(default_factory=setting.default_factory)
                if setting.default_factory is not dataclasses.MISSING
                else field(default=setting.default)
            )
            found.setdefault(setting.name, (setting.name, hints[setting.name], default))
    schema = dataclasses.make_dataclass(name, [(key, str, field(default=options[0].name)), *found.values()])
    schema.__module__ = module
    return known(schema)


# ---- composition errors -------------------------------------------------------------------------


def from_hydra(exc: BaseException) -> Optional[str]:
    """Turn a Hydra/OmegaConf composition error into one line, or None if it is not one."""
    text = str(exc)
    cause = exc.__cause__ or exc.__context__
    full = text + "\n" + (str(cause) if cause else "")

    missing_option = re.search(r"Could not find '([\w/]+)/([^']+)'", full)
    if missing_option:
        group, option = missing_option.groups()
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

    bad_override = re.search(r"Error parsing override '([^']+)'", full)
    if bad_override:
        return f"could not parse the override {bad_override.group(1)!r}; expected key=value"

    line = next((line for line in text.splitlines() if line.strip()), text)
    return line or None


def _schema_fields(class_name: str) -> list[str]:
    schema = SCHEMAS.get(class_name)
    return [f.name for f in dataclasses.fields(schema)] if schema else []
