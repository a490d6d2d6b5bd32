"""Composed config -> validated, typed Plan. Pure Python: no torch, transformers or mlflow.

Every mistake a user can make in a config surfaces here as a one-line ConfigError, in well
under a second, before any heavy import. Checks that need the model's shape (head_dim,
sliding-window layers) live in caches.validate_for_model and run before weights load.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from kvpipe import config as schema
from kvpipe.errors import ConfigError, require_choice


@dataclass(frozen=True)
class Plan:
    """What one job will do: the typed config, validated, plus notes for the user."""

    model: schema.ModelConfig
    cache: schema.CacheConfig
    backend: schema.BackendConfig
    axis: schema.AxisConfig
    workload: schema.WorkloadConfig
    quality: schema.QualityConfig
    tracking: schema.TrackingConfig
    fallback: tuple[str, ...] = ("offloaded",)
    warnings: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("warnings")
        return data

    def measurement_key(self) -> str:
        """Hash of what is measured: equal for configs that measure the same thing (settings the
        strategy ignores, and tracking, are left out). Used to skip duplicates and to resume."""
        import hashlib
        import json

        data = self.as_dict()
        data.pop("tracking"), data.pop("fallback")
        if self.cache.strategy != "quantized":
            data.pop("backend"), data.pop("axis")
        elif self.backend.name == "fp8":
            data.pop("axis"), data["backend"].pop("q_group_size"), data["backend"].pop("residual_length")
        if self.cache.strategy not in ("static", "offloaded_static"):
            data["cache"].pop("max_cache_len"), data["cache"].pop("compile")
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]

    def flat_params(self) -> dict[str, str]:
        """The resolved config flattened to dotted keys, as MLflow params."""
        flat: dict[str, str] = {}

        def walk(prefix: str, value: Any) -> None:
            if isinstance(value, dict):
                for key, sub in value.items():
                    walk(f"{prefix}.{key}" if prefix else key, sub)
            else:
                flat[prefix] = str(value)

        walk("", self.as_dict())
        return flat


def make_plan(cfg: DictConfig | schema.KvpipeConfig, overrides: list[str] = ()) -> Plan:
    """Validate a composed config; raise ConfigError naming the first bad field.

    `overrides` are the user's command-line overrides, used only to warn about settings
    that the chosen strategy ignores."""
    if isinstance(cfg, DictConfig):
        _reject_unknown_keys(cfg)
    typed = OmegaConf.to_object(cfg) if isinstance(cfg, DictConfig) else cfg
    warnings: list[str] = []
    _check_model(typed.model)
    _check_workload(typed.workload)
    overridden = frozenset(o.lstrip("+~").split("=")[0].split(".")[0] for o in overrides)
    warnings += check_cache(typed.cache, typed.backend, typed.axis, typed.workload, overridden)
    _check_quality(typed.quality)
    for index, strategy in enumerate(typed.fallback):
        require_choice(f"fallback[{index}]", strategy, schema.CACHE_STRATEGIES)
    return Plan(
        model=typed.model,
        cache=typed.cache,
        backend=typed.backend,
        axis=typed.axis,
        workload=typed.workload,
        quality=typed.quality,
        tracking=typed.tracking,
        fallback=tuple(typed.fallback),
        warnings=tuple(warnings),
    )


def _reject_unknown_keys(cfg: DictConfig) -> None:
    """`+group.key=...` adds keys past the schema; OmegaConf would drop them silently."""
    for group in fields(schema.KvpipeConfig):
        node = cfg.get(group.name)
        if not isinstance(node, DictConfig):
            continue
        known = {f.name for f in fields(group.type if isinstance(group.type, type) else getattr(schema, group.type))}
        for key in node.keys():
            if key not in known:
                raise ConfigError(f"{group.name}.{key}", node.get(key), "not a known key; " +
                                  "expected one of: " + ", ".join(sorted(known)))


def _check_model(model: schema.ModelConfig) -> None:
    require_choice("model.source", model.source, schema.MODEL_SOURCES)
    require_choice("model.dtype", model.dtype, schema.DTYPES)
    require_choice("model.device", model.device, schema.DEVICES)
    require_choice("model.attn_implementation", model.attn_implementation, schema.ATTN_IMPLEMENTATIONS)
    if model.source == "hf":
        _check_model_location(model.name_or_path)
    if model.device_map is not None:
        require_choice("model.device_map", model.device_map, schema.DEVICE_MAPS)
        if model.source != "hf":
            raise ConfigError("model.device_map", model.device_map, "only for model=hf (a model too big for one GPU)")
    if model.source == "random":
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads"):
            if getattr(model, name) <= 0:
                raise ConfigError(f"model.{name}", getattr(model, name), "expected a positive integer")
        if model.num_attention_heads % model.num_key_value_heads:
            raise ConfigError(
                "model.num_key_value_heads", model.num_key_value_heads,
                f"expected a divisor of model.num_attention_heads={model.num_attention_heads}",
            )


def looks_local(name_or_path: str) -> bool:
    """A hub id is exactly 'org/name' or 'name'; anything path-like is a local folder."""
    return (
        name_or_path.startswith(("/", ".", "~"))
        or name_or_path.count("/") > 1
        or os.sep != "/" and os.sep in name_or_path
        or Path(name_or_path).exists()
    )


def _check_model_location(name_or_path: str | None) -> None:
    if not name_or_path:
        raise ConfigError("model.name_or_path", name_or_path, "expected a local model folder or a hub id like org/name")
    if looks_local(name_or_path):
        folder = Path(name_or_path).expanduser()
        if not folder.is_dir():
            raise ConfigError(
                "model.name_or_path", name_or_path, "no such folder; expected a local model folder holding config.json"
            )
        if not (folder / "config.json").is_file():
            raise ConfigError(
                "model.name_or_path", name_or_path, "the folder has no config.json; expected a transformers model folder"
            )


def _check_workload(workload: schema.WorkloadConfig) -> None:
    require_choice("workload.kind", workload.kind, schema.WORKLOAD_KINDS)
    for name in ("max_new_tokens", "batch_size", "repeats", "prompt_tokens"):
        value = getattr(workload, name)
        if value <= 0:
            raise ConfigError(f"workload.{name}", value, "expected a positive integer")
    if workload.warmup < 0:
        raise ConfigError("workload.warmup", workload.warmup, "expected 0 or more")
    if workload.kind == "chat" and not workload.prompts:
        raise ConfigError("workload.prompts", [], "expected at least one prompt for workload=chat")


def _check_quality(quality: schema.QualityConfig) -> None:
    if quality.scored_tokens < 1:
        raise ConfigError("quality.scored_tokens", quality.scored_tokens, "expected a positive integer")
    if quality.context_tokens <= quality.scored_tokens:
        raise ConfigError("quality.context_tokens", quality.context_tokens,
                          f"expected more than quality.scored_tokens={quality.scored_tokens} (the rest is the prefix)")


def check_cache(
    cache: schema.CacheConfig,
    backend: schema.BackendConfig,
    axis: schema.AxisConfig,
    workload: schema.WorkloadConfig,
    overridden: frozenset[str] = frozenset(),
) -> list[str]:
    """Shape-free cache checks; returns warnings for settings that will be ignored."""
    require_choice("cache.strategy", cache.strategy, schema.CACHE_STRATEGIES)
    warnings: list[str] = []
    if cache.max_cache_len is not None and cache.max_cache_len <= 0:
        raise ConfigError("cache.max_cache_len", cache.max_cache_len, "expected a positive integer or null")
    if cache.compile and cache.strategy != "static":
        raise ConfigError("cache.compile", True, "torch.compile is offered with cache=static only; expected cache=static or cache.compile=false")
    if cache.max_cache_len is not None and cache.strategy not in ("static", "offloaded_static"):
        warnings.append(f"cache.max_cache_len is ignored by cache={cache.strategy}")
    if cache.strategy == "quantized":
        _check_backend(backend, axis)
    elif overridden & {"backend", "axis"}:
        warnings.append(
            f"backend/axis settings apply to cache=quantized only; cache={cache.strategy} ignores them"
        )
    return warnings


# Bit widths each backend's transformers cache layer accepts (QuantoQuantizedLayer, HQQQuantizedLayer).
BACKEND_NBITS = {"quanto": (2, 4), "hqq": (1, 2, 3, 4, 8), "fp8": (8,)}


def _check_backend(backend: schema.BackendConfig, axis: schema.AxisConfig) -> None:
    from kvpipe.axes import VALID_AXES

    require_choice("backend.name", backend.name, schema.BACKENDS)
    require_choice(f"backend.nbits (backend={backend.name})", backend.nbits, BACKEND_NBITS[backend.name])
    if backend.name == "fp8":
        return
    if backend.q_group_size <= 0:
        raise ConfigError("backend.q_group_size", backend.q_group_size, "expected a positive integer")
    if backend.residual_length < 0:
        raise ConfigError("backend.residual_length", backend.residual_length, "expected 0 or more")
    require_choice("axis.layout", axis.layout, schema.AXIS_LAYOUTS)
    for name in ("key", "value"):
        value = getattr(axis, name)
        if value is not None:
            require_choice(f"axis.{name} (backend={backend.name})", value, VALID_AXES[backend.name])
