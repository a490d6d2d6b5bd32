"""`kvpipe plan`: KV-cache and weight bytes from a model's config alone, before any weight loads.

`kvpipe plan [overrides] --memory-budget 24GiB` prints, per cache strategy, what a cached token costs,
the cache at chosen context lengths, and the longest context that fits beside the weights. Each row
is its strategy's own `predict_kv_bytes`, which follows how its transformers cache layers (and
kvpipe's quantized layers) store their tensors, so it equals `kv_cache_bytes` of a real cache
exactly (tests/test_capacity.py runs both).

A context is prompt + new tokens, as the workload check counts it against the model's positions. The
cache then holds context - 1 tokens: the last generated token is never fed back.

`--hardware NAME` adds the floors of TPOT and TTFT on an accelerator of conf/hardware.yaml (kvpipe.predict.speed,
.floors), and fits then counts the transients too; `--hardware local` measures this machine and
calibrates predictions on its runs (kvpipe.predict.calibration). `--json` prints it all as one document.
"""

from __future__ import annotations

import argparse
import json

from kvpipe import cache, model
from kvpipe.cache.accounting import UnpredictableLayers, kv_shape
from kvpipe.config import from_hydra
from kvpipe.errors import ConfigError, KvpipeError, first_line, require_choice
from kvpipe.model.weights import weights
from kvpipe.predict import calibration, hardware, speed
from kvpipe.predict.floors import model_costs, split
from kvpipe.spec import compose, make_spec
from kvpipe.units import human_bytes, parse_bytes


def predict_kv_bytes(spec, kv, prompt_tokens: int, new_tokens: int) -> int:
    """What kv_cache_bytes reports for the spec's cache once new_tokens follow the prompt (all layers)."""
    return spec.strategy.predict_kv_bytes(kv, prompt_tokens, new_tokens)


def variants(spec, shape) -> list[tuple[str, object]]:
    """(label, spec) for every row: each registered strategy's variants of the spec's cache choice, in table order."""
    rows = [row for strategy in cache.registered() for row in strategy.plan_variants(spec.cache_choice, shape)]
    return [(label, spec.with_choice(choice)) for label, choice in rows]


def largest_context(kv_bytes_at, available_bytes: int, cap: int) -> int:
    """Largest context <= cap whose cache (kv_bytes_at(context), growing with it) fits; 0 if none."""
    if available_bytes <= 0 or kv_bytes_at(2) > available_bytes:
        return 0
    low, high = 2, cap  # low always fits
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if kv_bytes_at(middle) <= available_bytes else (low, middle - 1)
    return low


def parse_contexts(text: str) -> list[int]:
    parts = text.replace("_", "").split(",")
    if not all(part.strip().isdigit() and int(part) >= 2 for part in parts):
        raise ConfigError("--context", text, "expected comma-separated token counts of at least 2, e.g. 1024,4096,8192")
    return [int(part) for part in parts]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=hf model.name_or_path=/path")
    parser.add_argument(
        "--memory-budget",
        metavar="SIZE",
        help="memory for weights + KV cache (+ transients, with --hardware, whose memory is the default): 24GiB, 8GB, 1e9",
    )
    parser.add_argument("--context", metavar="N,N", help="contexts to show (default: 1024, 4096, the model's maximum)")
    parser.add_argument("--device", choices=("cpu", "cuda"), help="where it will run; sets model.dtype=auto's dtype")
    parser.add_argument(
        "--hardware",
        metavar="NAME",
        help="floor TPOT and TTFT on an accelerator (" + ", ".join(hardware.names()) + "); local: this machine, "
        "measured, with predictions calibrated on its runs",
    )
    parser.add_argument("--json", action="store_true", help="print the plan as one JSON document, and nothing else")


def run(args: argparse.Namespace) -> int:
    """KV cache and weights from the model's config; loads no weights."""
    for override in args.overrides:
        if "=" not in override:
            raise KvpipeError(f"kvpipe plan: {override!r} is neither a key=value override nor a --flag")
    budget = parse_bytes(args.memory_budget) if args.memory_budget is not None else None
    contexts = parse_contexts(args.context) if args.context else None
    if args.hardware is not None:
        require_choice("--hardware", args.hardware, hardware.names())  # before the config is even composed
    report(_spec(args.overrides), budget, contexts, args.device, args.hardware, args.json)
    return 0


def _spec(overrides: list[str]):
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        return make_spec(compose(overrides), overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        raise KvpipeError(from_hydra(exc) or str(exc)) from exc


def report(spec, budget: int | None, contexts: list[int] | None, device: str | None,
           hardware_name: str | None = None, as_json: bool = False) -> None:  # fmt: skip
    """Print the plan: model, dtype, weights, then one row per strategy variant; with a hardware, the
    floors (and, on local hardware, the calibration) per strategy and context. As JSON: all of it."""
    from rich.console import Console
    from rich.table import Table

    try:
        shape = model.describe(spec.model)
    except OSError as exc:  # a hub id with neither network nor a local copy
        raise KvpipeError(
            f"model.name_or_path={spec.model.name_or_path!r} has no readable config: {first_line(exc)}"
        ) from exc
    rows = variants(spec, shape)
    for _, variant in rows:
        if any(name.startswith("backend.") for name in variant.read_fields()):
            variant.strategy.check()  # the backend settings of the quantized rows, whatever cache= says
    if shape.has_sliding_layers:
        rows = [(label, variant) for label, variant in rows if variant.strategy.supports_sliding_window]
    accelerator = None if hardware_name in (None, hardware.LOCAL) else hardware.get(hardware_name)
    if accelerator is not None:
        if device not in (None, accelerator.device):
            raise ConfigError(
                "--device", device, f"--hardware {hardware_name} runs on {accelerator.device}; omit --device"
            )
        device = accelerator.device
    device = device or (model.resolve_device("auto") if spec.model.device == "auto" else spec.model.device)
    dtype = model.dtype_name(spec.model.dtype, device)
    try:
        kv = kv_shape(shape, spec.workload.batch_size, dtype)
    except UnpredictableLayers as exc:
        raise KvpipeError(f"kvpipe plan: {exc}") from exc
    new_tokens = spec.workload.max_new_tokens
    cap = shape.max_positions or 2**24
    contexts = contexts or sorted({c for c in (1024, 4096) if c < cap} | {cap})
    weight = weights(spec.model, dtype)
    costs = model_costs(spec.model, shape, weight.bytes, dtype, kv.batch_size, device)
    local_runs = None
    if hardware_name == hardware.LOCAL:
        from kvpipe.job.runner import use_threads

        try:
            device = model.resolve_device(device)
        except KvpipeError as exc:  # --device cuda on a machine without one
            raise KvpipeError(
                "--hardware local measures this machine, which has no CUDA GPU; omit --device cuda"
            ) from exc
        threads = use_threads(spec.model, device)  # measured with the threads a run would use
        accelerator = hardware.local(device, dtype)
        local_runs = calibration.read_local_runs(spec, dtype, device, threads)
    if accelerator is not None:
        accelerator.peak_flops(dtype)  # an entry without this dtype: one line, before any table
    memory = budget if budget is not None or accelerator is None else accelerator.memory_bytes
    available = None if memory is None else memory - weight.bytes
    speed_rows = [speed.build_row(label, variant, spec, costs, contexts, cap, accelerator, dtype, memory, local_runs)
                  for label, variant in rows]  # fmt: skip

    # the floors table has ten columns, twelve with predictions
    width = max(Console().width, 120 if accelerator is None else 150 if local_runs is None else 170)
    say = (lambda *_, **__: None) if as_json else Console(width=width).print
    say(f"[bold]kvpipe plan[/bold] · {spec.model.name} · {device} · batch {kv.batch_size}")
    positions = f"{shape.max_positions:,} positions" if shape.max_positions else "no max_position_embeddings"
    say(f"model: {shape.num_layers} layers × {shape.num_kv_heads} KV heads × head_dim {shape.head_dim}, {positions}")
    if shape.has_sliding_layers:
        say(f"layers: {shape.layer_summary()}")
    if spec.model.dtype == "auto":  # only then: what the other device would assume may import torch to say
        other = "cpu" if device == "cuda" else "cuda"
        say(
            f"dtype: {dtype} (model.dtype=auto on {device}; --device {other} would assume {model.dtype_name('auto', other)})"
        )
    else:
        say(f"dtype: {dtype} (model.dtype)")
    say(
        f"weights: {human_bytes(weight.bytes)} ({weight.bytes:,} bytes), {weight.source}",
        style=None if weight.exact else "yellow",
    )
    what = "the KV cache" if accelerator is None else "the KV cache and the transients"
    if memory is None:  # neither --memory-budget nor --hardware: no fits column
        named = ""
    elif budget is not None:
        named = f"budget: {human_bytes(memory)}"
    else:
        named = f"memory: {human_bytes(memory)} ({memory / 1e9:.1f} GB, {hardware_name})"
    if available is not None and available > 0:
        say(f"{named} - weights = {human_bytes(available)} for {what}")
    elif available is not None:
        say(
            f"{named} is less than the weights alone: no context fits; raise "
            "--memory-budget or choose a smaller model.dtype",
            style="bold red",
        )
    say(f"context = prompt + {new_tokens} new tokens (workload.max_new_tokens); the cache holds context - 1 tokens")

    table = Table(header_style="bold")
    per_token = ["KV B/token", "windows"] if shape.has_sliding_layers else ["KV B/token"]
    for column in ["strategy", *per_token] + [f"KV @ {c:,}" + ("*" if c > cap else "") for c in contexts]:
        table.add_column(column, justify="left" if column == "strategy" else "right")
    if available is not None:
        table.add_column("fits up to", justify="right")
    per_token: dict[str, float] = {}
    fits_up_to: dict[str, int | None] = {}
    for (label, variant), row in zip(rows, speed_rows):
        strategy = variant.strategy
        on_device = strategy.device_kv_shape(kv, device)

        def needs_at(context: int, strategy=strategy, on_device=on_device) -> int:
            """Beside the weights: the cache, and with a hardware the larger transient too."""
            if accelerator is None:
                return strategy.predict_kv_bytes(on_device, *split(context, new_tokens))
            cost = costs.at(strategy, *split(context, new_tokens))
            return cost.memory_bytes - cost.weights_bytes

        per_token[label] = strategy.bytes_per_token(on_device)
        cells = [label, f"{per_token[label]:,.0f}"]
        if shape.has_sliding_layers:
            cells.append(human_bytes(strategy.window_bytes(on_device)))
        cells += [human_bytes(at.cost.kv_cache_bytes) for at in row.contexts]
        fits_up_to[label] = None
        if available is not None:
            fit = fits_up_to[label] = largest_context(needs_at, available, cap)
            cells.append("none" if fit == 0 else f"{fit:,}" + (" (model max)" if fit == cap else ""))
        table.add_row(*cells)
    say(table)
    notes = _notes(spec, shape, device, cap, contexts)
    if accelerator is not None:
        notes.append(
            "with --hardware, fits counts weights + KV cache + the larger of the prefill's largest activation and "
            "(quantized) one layer's dequantized copy; without it, weights + KV cache"
        )
    for note in notes:
        say(f"[yellow]note:[/yellow] {note}")
    if accelerator is not None:
        speed.print_floors(say, speed_rows, accelerator, dtype, costs.weights_read(kv.batch_size), memory)
    if local_runs is not None:
        speed.print_calibration(say, speed_rows, local_runs.said)
    if as_json:
        document = {
            "model": spec.model.name, "device": device, "dtype": dtype, "batch_size": kv.batch_size,
            "new_tokens": new_tokens, "max_positions": shape.max_positions or None,
            "weights": {"bytes": weight.bytes, "exact": weight.exact, "source": weight.source},
            "weights_read_bytes_per_step": costs.weights_read(kv.batch_size),
            "memory_bytes": memory,
            "fits_counts": "weights + KV cache" + (" + the larger transient" if accelerator is not None else ""),
            "hardware": accelerator.as_dict() if accelerator is not None else None,
            "calibration": speed.calibration_document(local_runs, speed_rows),
            "rows": [
                {"strategy": row.label, "kv_bytes_per_token": per_token[row.label], "fits_up_to": fits_up_to[row.label],
                 "contexts": [at.as_dict() for at in row.contexts]}
                for row in speed_rows
            ],
            "notes": notes,
        }  # fmt: skip
        print(json.dumps(document, indent=2))


def _notes(spec, shape, device: str, cap: int, contexts: list[int]) -> list[str]:
    notes = [f"* beyond the model's {cap:,} positions: kvpipe would refuse it"] if max(contexts) > cap else []
    if shape.has_sliding_layers:
        notes.append(
            f"KV B/token is what each token adds past the windows (the {shape.full_layers} full-attention "
            + ("layer grows" if shape.full_layers == 1 else "layers grow")
            + ", the sliding ones do not); windows is what the sliding layers hold once full, a fixed cost (quantized "
            "windows: at most, a residual short of its flush). A one-token output pins the whole prompt in them: "
            "transformers keeps a view of it"
        )
    offloading = [s for s in cache.registered() if s.offloading]
    if offloading and device == "cuda" and shape.num_layers > 2:
        kept = (
            "; sliding layers stay on the device where cache.offload_only_non_sliding=true (offloaded_static's default)"
            if shape.has_sliding_layers
            else ""
        )
        notes.append(
            "offloaded rows count the device only (the two largest offloaded layers: the one in use and the next, "
            f"prefetched{kept}); host RAM holds every layer, as dynamic/static"
        )
    elif offloading and device != "cuda":
        notes.append("without CUDA, " + " and ".join(f"{s.name} runs as {s.runs_as_without_cuda}" for s in offloading))
    for strategy in cache.registered():
        notes += strategy.plan_notes(spec.cache_choice, shape)
    return notes
