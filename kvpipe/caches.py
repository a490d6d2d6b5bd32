"""Cache stage: plan -> a transformers Cache for generate(), and exact KV byte accounting.

Adding a strategy means one YAML file in conf/cache/ and one entry in BUILDERS.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from kvpipe.errors import ConfigError, KvpipeError, first_line
from kvpipe.models import LoadedModel, ModelShape
from kvpipe.plan import Plan

log = logging.getLogger(__name__)


@dataclass
class CacheSetup:
    """What generate() gets: a fresh cache per call, plus generation kwargs."""

    requested: str
    effective: str
    make_cache: Callable[..., Any]  # (capacity=0) -> a fresh Cache holding at least `capacity` tokens
    generate_kwargs: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def validate_for_model(plan: Plan, shape: ModelShape, prompt_tokens: int) -> None:
    """Checks that need the model's shape; run before the weights load."""
    cache, backend = plan.cache, plan.backend
    total = prompt_tokens + plan.workload.max_new_tokens
    if cache.strategy in ("static", "offloaded_static") and cache.max_cache_len is not None:
        if cache.max_cache_len < total:
            raise ConfigError(
                "cache.max_cache_len", cache.max_cache_len,
                f"expected at least prompt + workload.max_new_tokens = {prompt_tokens} + "
                f"{plan.workload.max_new_tokens} = {total}",
            )
    if shape.max_positions and total > shape.max_positions:
        raise ConfigError(
            "workload.max_new_tokens", plan.workload.max_new_tokens,
            f"prompt ({prompt_tokens}) + new tokens exceed the model's {shape.max_positions} positions",
        )
    if cache.strategy != "quantized":
        return
    if shape.has_sliding_layers:
        raise ConfigError(
            "cache.strategy", "quantized",
            "the model has sliding-window layers, which QuantizedCache does not support; use dynamic or static",
        )
    if backend.name != "fp8" and shape.head_dim % backend.q_group_size:
        divisors = [g for g in (16, 32, 64, 128) if shape.head_dim % g == 0]
        raise ConfigError(
            "backend.q_group_size", backend.q_group_size,
            f"must divide the model's head_dim={shape.head_dim}; expected one of: {', '.join(map(str, divisors))}",
        )


def build(plan: Plan, loaded: LoadedModel, longest_prompt: int) -> CacheSetup:
    """Turn the plan's cache choice into a CacheSetup for this model and device.

    Static caches are sized once for the longest prompt, so every call of a job (and of later
    jobs with the same size) shares one shape: torch.compile then compiles once."""
    strategy = plan.cache.strategy
    offload = strategy.startswith("offloaded")
    if offload and loaded.device != "cuda":
        base = "static" if strategy == "offloaded_static" else "dynamic"
        note = (f"cache={strategy} offloads from an accelerator to the host; on {loaded.device} there is "
                f"nothing to offload from, so it runs as cache={base} with offloading off")
        log.warning(note)
        setup = BUILDERS[base](plan, loaded, longest_prompt, offloading=False)
        setup.requested, setup.notes = strategy, [note, *setup.notes]
        return setup
    return BUILDERS[strategy](plan, loaded, longest_prompt, offloading=offload)


def _dynamic(plan: Plan, loaded: LoadedModel, longest_prompt: int, offloading: bool) -> CacheSetup:
    from transformers import DynamicCache

    def make(capacity: int = 0):
        return DynamicCache(config=loaded.model.config, offloading=offloading)

    name = "offloaded" if offloading else "dynamic"
    return CacheSetup(requested=name, effective=name, make_cache=make)


def static_len(plan: Plan, prompt_tokens: int) -> int:
    return plan.cache.max_cache_len or prompt_tokens + plan.workload.max_new_tokens


def _static(plan: Plan, loaded: LoadedModel, longest_prompt: int, offloading: bool) -> CacheSetup:
    from transformers import StaticCache

    max_cache_len = static_len(plan, longest_prompt)

    def make(capacity: int = 0):
        return StaticCache(config=loaded.model.config, max_cache_len=max(max_cache_len, capacity),
                           offloading=offloading)

    name = "offloaded_static" if offloading else "static"
    kwargs: dict = {}
    if plan.cache.compile:
        from transformers import CompileConfig

        # CUDA graphs pay off on GPU only; transformers compiles on CUDA by itself, elsewhere on request.
        mode = "reduce-overhead" if loaded.device == "cuda" else "default"
        compile_config = CompileConfig(mode=mode)
        compile_config._compile_all_devices = True  # transformers' own switch for compiling off CUDA
        kwargs["compile_config"] = compile_config
    else:
        kwargs["disable_compile"] = True  # eager static stays eager on CUDA too, so the two can be compared
    return CacheSetup(requested=name, effective=name + ("+compile" if plan.cache.compile else ""),
                      make_cache=make, generate_kwargs=kwargs)


def _quantized(plan: Plan, loaded: LoadedModel, longest_prompt: int, offloading: bool) -> CacheSetup:
    from transformers import QuantizedCache

    from kvpipe.axes import backend_axes
    from kvpipe.quant_layers import LAYER_CLASSES

    backend = plan.backend
    if backend.name == "fp8":
        _require_fp8()
        options: dict = {}
    else:
        key_axis, value_axis = backend_axes(backend.name, plan.axis.layout, plan.axis.key, plan.axis.value)
        options = dict(nbits=backend.nbits, axis_key=key_axis, axis_value=value_axis,
                       q_group_size=backend.q_group_size, residual_length=backend.residual_length)

    _warm_backend(backend.name, loaded.device, loaded.model.dtype)

    def make(capacity: int = 0):
        cache = QuantizedCache(backend=backend.name, config=loaded.model.config, **options)
        if backend.name in LAYER_CLASSES:
            # kvpipe's layers group as the axis names say at every length (see quant_layers.py)
            cache.layers = [LAYER_CLASSES[backend.name](**options) for _ in cache.layers]
        return cache

    label = f"quantized:{backend.name}" + (f":int{backend.nbits}:{plan.axis.layout}" if options else "")
    return CacheSetup(requested="quantized", effective=label, make_cache=make)


@functools.lru_cache(maxsize=None)
def _warm_backend(name: str, device: str, dtype) -> None:
    """Quantize and dequantize once per process before anything is timed: quanto builds its C++
    extension on first use (tens of seconds), which must never land inside a measured call."""
    import torch

    from kvpipe.quant_layers import LAYER_CLASSES

    if name not in LAYER_CLASSES:
        return
    layer = LAYER_CLASSES[name](nbits=4, axis_key=0, axis_value=0, q_group_size=64, residual_length=0)
    states = torch.randn(1, 1, 8, 64, device=device, dtype=dtype)
    try:
        layer.update(states, states)
        layer._dequantize(layer._quantized_keys)
    except (OSError, RuntimeError, ImportError) as exc:  # e.g. no nvcc to build quanto's CUDA extension
        other = "hqq" if name == "quanto" else "quanto"
        raise KvpipeError(f"backend={name} cannot run on {device}: {type(exc).__name__}: {first_line(exc)}; "
                          f"try backend={other} or backend=fp8") from exc


def _require_fp8() -> None:
    import transformers.cache_utils as cache_utils

    if not hasattr(cache_utils, "Fp8QuantizedLayer"):
        raise KvpipeError(
            f"backend=fp8 needs a transformers with Fp8QuantizedLayer; this one ({_transformers_version()}) has none; "
            "use backend=quanto or backend=hqq"
        )


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


BUILDERS: dict[str, Callable[..., CacheSetup]] = {
    "dynamic": _dynamic,
    "offloaded": _dynamic,
    "static": _static,
    "offloaded_static": _static,
    "quantized": _quantized,
}


# ---- exact KV accounting ----------------------------------------------------------------


def kv_cache_bytes(cache) -> int:
    """Bytes the cache actually holds, found by walking its layers' tensors.

    Dense layers count keys and values (a static layer's whole allocation); quantized layers
    count the packed integers, scales and zero points, and the full-precision residual.
    Each storage is counted once, even when several views share it. Bookkeeping tensors
    (a static layer's position counter) are not KV data and are left out.
    """
    seen: set[tuple[int, int]] = set()
    return sum(_tensor_bytes(getattr(layer, name, None), seen) for layer in cache.layers for name in KV_ATTRIBUTES)


# Where transformers' cache layers keep key/value data: dense or residual states, and quantized states.
KV_ATTRIBUTES = ("keys", "values", "_quantized_keys", "_quantized_values")


def _tensor_bytes(obj, seen: set) -> int:
    import torch

    if isinstance(obj, torch.Tensor):
        if hasattr(obj, "__tensor_flatten__"):  # quanto's QTensor: packed data, scale, shift
            names, _ = obj.__tensor_flatten__()
            return sum(_tensor_bytes(getattr(obj, name), seen) for name in names)
        storage = obj.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if obj.numel() == 0 or key in seen:
            return 0
        seen.add(key)
        return storage.nbytes()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(value, seen) for value in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(value, seen) for value in obj)
    return 0


def cached_tokens(cache) -> int:
    """Tokens held per sequence (the cumulative length for quantized layers)."""
    return int(cache.get_seq_length())


def dense_fp16_bytes(shape: ModelShape, tokens: int, batch_size: int) -> int:
    """What a dense 16-bit cache holds for these tokens: 2 (K and V) x layers x kv_heads x head_dim x tokens x batch x 2 bytes."""
    from kvpipe.capacity import dense_bytes, kv_shape

    return dense_bytes(kv_shape(shape, batch_size, "float16"), tokens)
