"""Planning stage: KV-cache and weight bytes from a model's config alone, before any weight loads.

`kvpipe plan [overrides] --memory-budget 24GiB` prints, per cache strategy, what a cached token costs,
the cache at chosen context lengths, and the longest context that fits beside the weights. The formulas
follow how each transformers cache layer (and kvpipe's quant_layers) stores its tensors, so they equal
`caches.kv_cache_bytes` of real caches exactly (tests/test_capacity.py runs both).

A context is prompt + new tokens, as `validate_for_model` counts it against the model's positions. The
cache then holds context - 1 tokens: the last generated token is never fed back.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from kvpipe.errors import ConfigError, KvpipeError, first_line
from kvpipe.report import parse_bytes

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# safetensors dtypes; from_pretrained(dtype=...) casts the floating ones and keeps the rest as stored
SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
                     "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
CAST_ON_LOAD = ("F64", "F32", "BF16", "F16")
HQQ_TOKEN_MULTIPLE = 8  # = quant_layers._HQQ_TOKEN_MULTIPLE (that module imports torch; a test keeps them equal)
FP8_SCALE_BYTES = 4  # Fp8QuantizedLayer keeps one float32 scale per tensor
# Raw axis number -> what one group spans, through kvpipe's layers (kvpipe/axes.py)
GROUPING = {("quanto", 0): "token", ("quanto", -1): "channel", ("hqq", 1): "token", ("hqq", 0): "channel"}

@dataclass(frozen=True)
class KvShape:
    """What the KV cache's bytes depend on."""

    layers: int
    kv_heads: int
    head_dim: int
    batch_size: int
    dtype_bytes: int

    @property
    def elements_per_token(self) -> int:
        """K (or V) elements one token adds to one layer, across the batch."""
        return self.batch_size * self.kv_heads * self.head_dim


def kv_shape(shape, batch_size: int, dtype: str) -> KvShape:
    """From models.describe's ModelShape, the workload's batch and the resolved model dtype."""
    return KvShape(shape.num_layers, shape.num_kv_heads, shape.head_dim, batch_size, DTYPE_BYTES[dtype])


def predict_kv_bytes(plan, kv: KvShape, prompt_tokens: int, new_tokens: int) -> int:
    """What caches.kv_cache_bytes reports for plan's cache once new_tokens follow the prompt (all layers)."""
    from kvpipe.caches import static_len

    held = prompt_tokens + new_tokens - 1
    if plan.cache.strategy in ("static", "offloaded_static"):
        return dense_bytes(kv, max(static_len(plan, prompt_tokens), prompt_tokens + new_tokens))
    if plan.cache.strategy != "quantized":
        return dense_bytes(kv, held)
    if plan.backend.name == "fp8":
        return 2 * kv.layers * (held * kv.elements_per_token + FP8_SCALE_BYTES)  # 1 byte an element, no residual
    return quantized_bytes(kv, plan.backend, plan.axis, prompt_tokens, new_tokens)


def bytes_per_token(plan, kv: KvShape) -> float:
    """What one more token costs in the long run (quantized: packed bits plus its share of scales and zeros)."""
    if plan.cache.strategy != "quantized":
        return dense_bytes(kv, 1)
    backend = plan.backend
    if backend.name == "fp8":
        return 2 * kv.layers * kv.elements_per_token
    bits = 3.2 if (backend.name, backend.nbits) == ("hqq", 3) else backend.nbits  # 10 values per int32
    return 2 * kv.layers * kv.elements_per_token * (bits / 8 + 2 * kv.dtype_bytes / backend.q_group_size)


def dense_bytes(kv: KvShape, tokens: int) -> int:
    """DynamicLayer/StaticLayer: keys and values, [batch, kv_heads, tokens, head_dim] each."""
    return 2 * kv.layers * tokens * kv.elements_per_token * kv.dtype_bytes


def flush_schedule(prompt_tokens: int, new_tokens: int, residual_length: int) -> tuple[int, int]:
    """(quantized tokens, full-precision residual tokens) once new_tokens are generated.

    QuantizedLayer.update quantizes the whole prompt on the first call; each later token joins the
    residual, and the call that brings it to residual_length re-quantizes everything and empties it."""
    steps = max(new_tokens - 1, 0)  # the last generated token is never fed back
    window = max(residual_length, 1)  # 0 and 1 both flush on every step
    return prompt_tokens + steps // window * window, steps % window


def quantized_bytes(kv: KvShape, backend, axis, prompt_tokens: int, new_tokens: int) -> int:
    """quanto/hqq: packed keys and values, a scale and zero point per group, and the residual."""
    from kvpipe.axes import backend_axes

    quantized_tokens, residual_tokens = flush_schedule(prompt_tokens, new_tokens, backend.residual_length)
    axes = backend_axes(backend.name, axis.layout, axis.key, axis.value)
    packed = sum(_packed_bytes(kv, backend, GROUPING[backend.name, a], quantized_tokens) for a in axes)
    return kv.layers * (packed + 2 * residual_tokens * kv.elements_per_token * kv.dtype_bytes)


def _packed_bytes(kv: KvShape, backend, grouping: str, tokens: int) -> int:
    size, per_byte = backend.q_group_size, 8 // backend.nbits
    # quant_layers pads the token axis (repeating the last token): per-channel groups need whole groups
    # of tokens and hqq's bit packing a multiple of 8 rows; quanto per-token needs no padding.
    multiple = size if grouping == "channel" else HQQ_TOKEN_MULTIPLE if backend.name == "hqq" else 1
    groups = -(-tokens // multiple) * multiple * kv.elements_per_token // size
    if backend.name == "hqq" and backend.nbits == 3:
        data = -(-groups // 10) * size * 4  # 10 three-bit values per int32, rows padded to 10
    elif backend.name == "quanto" and grouping == "channel":
        data = -(-size // per_byte) * groups  # quanto packs the rows of its (group, groups) view
    else:
        data = -(-groups // per_byte) * size  # the rows of a (groups, group) view, 8 // nbits to a byte
    return data + 2 * groups * kv.dtype_bytes  # scale and zero point, in the model dtype


def variants(plan, head_dim: int) -> list[tuple[str, object]]:
    """(label, plan) for every strategy: dense ones, the configured backend, int4/int2 of quanto and hqq, fp8."""
    cache, backend, axis = plan.cache, plan.backend, plan.axis
    rows = [(name, replace(plan, cache=replace(cache, strategy=name)))
            for name in ("dynamic", "static", "offloaded", "offloaded_static")]
    quantized = replace(cache, strategy="quantized")
    wanted = [(backend.name, backend.nbits, axis)] if backend.name != "fp8" else []
    wanted += [(name, nbits, replace(axis, key=None, value=None)) for name in ("quanto", "hqq") for nbits in (4, 2)]
    if head_dim % backend.q_group_size:
        wanted = []  # _notes says why these rows are missing
    for name, nbits, layout in wanted:
        label = f"{name} int{nbits} {layout.layout}" + (" (raw axes)" if (layout.key, layout.value) != (None, None) else "")
        if label not in dict(rows):
            rows.append((label, replace(plan, cache=quantized, backend=replace(backend, name=name, nbits=nbits), axis=layout)))
    return rows + [("fp8", replace(plan, cache=quantized, backend=replace(backend, name="fp8", nbits=8)))]


def split(context: int, max_new_tokens: int) -> tuple[int, int]:
    """(prompt, new tokens) for a context, generating max_new_tokens where the context allows."""
    new_tokens = max(1, min(max_new_tokens, context - 1))
    return context - new_tokens, new_tokens


def largest_context(kv_bytes_at, available_bytes: int, cap: int) -> int:
    """Largest context <= cap whose cache (kv_bytes_at(context), growing with it) fits; 0 if none."""
    if available_bytes <= 0 or kv_bytes_at(2) > available_bytes:
        return 0
    low, high = 2, cap  # low always fits
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if kv_bytes_at(middle) <= available_bytes else (low, middle - 1)
    return low


# ---- weights -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Weights:
    bytes: int
    exact: bool
    source: str  # where the figure comes from, for the person reading it


def weights(model_cfg, dtype: str) -> Weights:
    """Weight bytes in `dtype` without loading: safetensors headers when present, else the config."""
    from kvpipe import models

    if model_cfg.source == "random":
        count = llama_parameters(models.random_config_dict(model_cfg))
        return Weights(count * DTYPE_BYTES[dtype], True, "counted from the config (source=random builds exactly it)")
    folder = models.local_folder(model_cfg)
    files = safetensors_files(folder) if folder else []
    if files:
        return Weights(safetensors_bytes(files, DTYPE_BYTES[dtype]), True,
                       f"exact: summed from the safetensors headers in {folder}")
    if folder:
        config = json.loads((folder / "config.json").read_text())
    else:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model_cfg.name_or_path, revision=model_cfg.revision,
                                            trust_remote_code=model_cfg.trust_remote_code).to_dict()
    return Weights(llama_parameters(config) * DTYPE_BYTES[dtype], False, "ESTIMATED from the config as a "
                   f"Llama-style decoder (no *.safetensors in {folder or model_cfg.name_or_path})")


def safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():  # a sharded checkpoint: the index names its shards
        return sorted({folder / name for name in json.loads(index.read_text())["weight_map"].values()})
    return sorted(folder.glob("*.safetensors"))


def safetensors_bytes(files: list[Path], dtype_bytes: int) -> int:
    """Tensor bytes from each file's header (8-byte little-endian length, then JSON), floats cast to dtype_bytes."""
    total = 0
    for path in files:
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        for name, info in header.items():
            if name != "__metadata__":
                numel = 1
                for size in info["shape"]:
                    numel *= size
                total += numel * (dtype_bytes if info["dtype"] in CAST_ON_LOAD else SAFETENSORS_BYTES[info["dtype"]])
    return total


def llama_parameters(config: dict) -> int:
    """Parameters of a Llama-style decoder: embeddings, q/k/v/o with grouped KV heads, gated MLP,
    two norms per layer, the final norm, and lm_head unless tied (Llama's default: untied)."""
    config = config.get("text_config", config)
    hidden, heads, intermediate = config["hidden_size"], config["num_attention_heads"], config["intermediate_size"]
    head_dim = config.get("head_dim") or hidden // heads
    q_width, kv_width = heads * head_dim, (config.get("num_key_value_heads") or heads) * head_dim
    attention = 2 * hidden * q_width + 2 * hidden * kv_width
    attention += (q_width + 2 * kv_width + hidden) if config.get("attention_bias") else 0
    mlp = 3 * hidden * intermediate + ((2 * intermediate + hidden) if config.get("mlp_bias") else 0)
    embeddings = config["vocab_size"] * hidden * (1 if config.get("tie_word_embeddings", False) else 2)
    return config["num_hidden_layers"] * (attention + mlp + 2 * hidden) + hidden + embeddings


# ---- command line ------------------------------------------------------------------------------


def parse_contexts(text: str) -> list[int]:
    parts = text.replace("_", "").split(",")
    if not all(part.strip().isdigit() and int(part) >= 2 for part in parts):
        raise ConfigError("--context", text, "expected comma-separated token counts of at least 2, e.g. 1024,4096,8192")
    return [int(part) for part in parts]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, as every kvpipe user error
        raise KvpipeError(f"kvpipe plan: {message}")


def main(argv: list[str]) -> int:
    """`kvpipe plan [overrides] [--memory-budget SIZE] [--context N,N] [--device cpu|cuda]`."""
    parser = _Parser(prog="kvpipe plan", description="KV cache and weights from the model's config; loads no weights.")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=hf model.name_or_path=/path")
    parser.add_argument("--memory-budget", metavar="SIZE", help="accelerator memory for weights + KV cache: 24GiB, 8GB, 1e9")
    parser.add_argument("--context", metavar="N,N", help="context lengths to show (default: 1024, 4096 and the model's maximum)")
    parser.add_argument("--device", choices=("cpu", "cuda"), help="where it will run; sets model.dtype=auto's dtype")
    try:
        args = parser.parse_intermixed_args(argv)
        for override in args.overrides:
            if "=" not in override:
                raise KvpipeError(f"kvpipe plan: {override!r} is neither a key=value override nor a --flag")
        budget = parse_bytes(args.memory_budget) if args.memory_budget is not None else None
        report(_plan(args.overrides), budget, parse_contexts(args.context) if args.context else None, args.device)
    except KvpipeError as exc:
        print(f"kvpipe: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


def _plan(overrides: list[str]):
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from kvpipe.config import CacheConfig, compose
    from kvpipe.errors import from_hydra
    from kvpipe.plan import check_cache, make_plan

    try:
        plan = make_plan(compose(overrides), overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        raise KvpipeError(from_hydra(exc) or str(exc)) from exc
    check_cache(CacheConfig(strategy="quantized"), plan.backend, plan.axis, plan.workload)  # the backend rows' settings
    return plan


def report(plan, budget: int | None, contexts: list[int] | None, device: str | None) -> None:
    """Print the plan: model, dtype, weights, then one row per strategy."""
    from rich.console import Console
    from rich.table import Table

    from kvpipe import models
    from kvpipe.report import human_bytes

    try:
        shape = models.describe(plan.model)
    except OSError as exc:  # a hub id with neither network nor a local copy
        raise KvpipeError(f"model.name_or_path={plan.model.name_or_path!r} has no readable config: "
                          f"{first_line(exc)}") from exc
    if device is None and plan.model.device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = device or plan.model.device
    dtype = plan.model.dtype if plan.model.dtype != "auto" else ("bfloat16" if device == "cuda" else "float32")
    kv, new_tokens = kv_shape(shape, plan.workload.batch_size, dtype), plan.workload.max_new_tokens
    cap = shape.max_positions or 2**24
    contexts = contexts or sorted({c for c in (1024, 4096) if c < cap} | {cap})
    weight = weights(plan.model, dtype)
    available = None if budget is None else budget - weight.bytes

    say = Console(width=max(Console().width, 120)).print
    say(f"[bold]kvpipe plan[/bold] · {plan.model.name} · {device} · batch {kv.batch_size}")
    positions = f"{shape.max_positions:,} positions" if shape.max_positions else "no max_position_embeddings"
    say(f"model: {shape.num_layers} layers × {shape.num_kv_heads} KV heads × head_dim {shape.head_dim}, {positions}")
    other = "cpu" if device == "cuda" else "cuda"
    say(f"dtype: {dtype} " + (f"(model.dtype=auto on {device}; --device {other} would assume "
                              f"{'float32' if other == 'cpu' else 'bfloat16'})" if plan.model.dtype == "auto" else "(model.dtype)"))
    say(f"weights: {human_bytes(weight.bytes)} ({weight.bytes:,} bytes), {weight.source}",
        style=None if weight.exact else "yellow")
    if available is not None and available > 0:
        say(f"budget: {human_bytes(budget)} - weights = {human_bytes(available)} for the KV cache")
    elif available is not None:
        say(f"budget: {human_bytes(budget)} is less than the weights alone: no context fits; raise "
            "--memory-budget or choose a smaller model.dtype", style="bold red")
    say(f"context = prompt + {new_tokens} new tokens (workload.max_new_tokens); the cache holds context - 1 tokens")

    table = Table(header_style="bold")
    for column in ["strategy", "KV B/token"] + [f"KV @ {c:,}" + ("*" if c > cap else "") for c in contexts]:
        table.add_column(column, justify="left" if column == "strategy" else "right")
    if available is not None:
        table.add_column("fits up to", justify="right")
    rows = variants(plan, shape.head_dim)
    for label, variant in rows[:4] if shape.has_sliding_layers else rows:  # QuantizedCache refuses sliding layers
        # Offloading keeps the layer in use and the next (prefetched) on the device; without CUDA
        # kvpipe runs it as dynamic/static, every layer resident.
        on_device = replace(kv, layers=min(2, kv.layers)) if label.startswith("offloaded") and device == "cuda" else kv
        kv_at = lambda context: predict_kv_bytes(variant, on_device, *split(context, new_tokens))  # noqa: E731
        cells = [label, f"{bytes_per_token(variant, on_device):,.0f}"] + [human_bytes(kv_at(c)) for c in contexts]
        if available is not None:
            fit = largest_context(kv_at, available, cap)
            cells.append("none" if fit == 0 else f"{fit:,}" + (" (model max)" if fit == cap else ""))
        table.add_row(*cells)
    say(table)
    for note in _notes(plan, shape, device, cap, contexts):
        say(f"[yellow]note:[/yellow] {note}")


def _notes(plan, shape, device: str, cap: int, contexts: list[int]) -> list[str]:
    notes = [f"* beyond the model's {cap:,} positions: kvpipe would refuse it"] if max(contexts) > cap else []
    if device == "cuda" and shape.num_layers > 2:
        notes.append(f"offloaded rows count the device only (2 of {shape.num_layers} layers: the one in use and "
                     "the next, prefetched); host RAM holds every layer, as dynamic/static")
    elif device != "cuda":
        notes.append("without CUDA, offloaded runs as dynamic and offloaded_static as static")
    if shape.has_sliding_layers:
        return notes + ["sliding-window layers: dense sizes are an upper bound; QuantizedCache refuses such models"]
    if shape.head_dim % plan.backend.q_group_size:
        return notes + [f"quanto and hqq rows left out: backend.q_group_size={plan.backend.q_group_size} does not "
                        f"divide head_dim={shape.head_dim}"]
    return notes + [f"quantized sizes include the full-precision residual (< backend.residual_length="
                    f"{plan.backend.residual_length} tokens) and token padding; KV B/token is the long-run cost. "
                    "Decoding also dequantizes one layer's keys and values at a time (transient, not counted)"]
