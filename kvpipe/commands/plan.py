"""`kvpipe plan`: KV-cache and weight bytes from a model's config alone, before any weight loads.

`kvpipe plan [overrides] --memory-budget 24GiB` prints, per cache strategy, what a cached token costs,
the cache at chosen context lengths, and the longest context that fits beside the weights
(kvpipe.predict.bytes_plan computes it); `--hardware NAME` adds the floors of TPOT and TTFT on an
accelerator of conf/hardware.yaml, `--hardware local` this machine's calibrated predictions, and
`--json` prints it all as one document. With `--request-tokens N`, each row's capacity: the most
requests of N tokens in flight at once, an offloaded cache's bounded by host memory too
(`--host-memory`, else the hardware entry's host figure; without either it says host memory was not
counted).
"""

from __future__ import annotations

import argparse
import json

from kvpipe.errors import ConfigError, KvpipeError, require_choice
from kvpipe.predict import hardware
from kvpipe.predict.in_flight import HOST, HOST_NOT_COUNTED
from kvpipe.units import counted, human_bytes, parse_bytes

HELP = "KV-cache and weight bytes from the config alone, before anything loads"


def parse_contexts(text: str) -> list[int]:
    return parse_lengths("--context", text)


def parse_lengths(flag: str, text: str) -> list[int]:
    parts = text.replace("_", "").split(",")
    if not all(part.strip().isdigit() and int(part) >= 2 for part in parts):
        raise ConfigError(flag, text, "expected comma-separated token counts of at least 2, e.g. 1024,4096,8192")
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
    parser.add_argument(
        "--request-tokens",
        type=int,
        metavar="N",
        help="capacity: the most concurrent requests of N tokens each (prompt + new) that fit the memory, and with "
        "--hardware the TPOT floor at that many (needs --memory-budget or --hardware)",
    )
    parser.add_argument(
        "--host-memory",
        metavar="SIZE",
        help="with --request-tokens: the host RAM an offloaded cache's layers live in, which bounds its capacity "
        "too: 256GiB, 1TB (default: the --hardware entry's host figure, where it gives one)",
    )
    parser.add_argument(
        "--calibrate-on",
        metavar="N,N",
        help="with --hardware local: calibrate only on the runs at these prompt lengths, holding the others out "
        "to check the predictions against (benchmarks/predictions.py)",
    )
    parser.add_argument("--json", action="store_true", help="print the plan as one JSON document, and nothing else")


def run(args: argparse.Namespace) -> int:
    """KV cache and weights from the model's config; loads no weights."""
    from kvpipe.jobspec import spec_from
    from kvpipe.predict.bytes_plan import make_plan

    for override in args.overrides:
        if "=" not in override:
            raise KvpipeError(f"kvpipe plan: {override!r} is neither a key=value override nor a --flag")
    budget = parse_bytes(args.memory_budget) if args.memory_budget is not None else None
    host_memory = parse_bytes(args.host_memory, "--host-memory") if args.host_memory is not None else None
    contexts = parse_contexts(args.context) if args.context else None
    if args.hardware is not None:
        require_choice("--hardware", args.hardware, hardware.names())  # before the config is even composed
    if args.request_tokens is not None and args.request_tokens < 2:
        raise ConfigError(
            "--request-tokens", args.request_tokens, "expected 2 or more tokens (prompt + new), e.g. 1024"
        )
    if args.request_tokens is not None and budget is None and args.hardware is None:
        raise ConfigError(
            "--request-tokens", args.request_tokens, "capacity needs a memory: add --memory-budget or --hardware"
        )
    if host_memory is not None and args.request_tokens is None:
        raise ConfigError(
            "--host-memory", args.host_memory, "it bounds capacity: use it with --request-tokens N, e.g. 1024"
        )
    calibrate_on = None
    if args.calibrate_on is not None:
        if args.hardware != hardware.LOCAL:
            raise ConfigError("--calibrate-on", args.calibrate_on, "use it with --hardware local, which calibrates")
        calibrate_on = parse_lengths("--calibrate-on", args.calibrate_on)
    plan = make_plan(
        spec_from(args.overrides), budget, contexts, args.device, args.hardware, args.request_tokens, calibrate_on,
        host_memory,
    )  # fmt: skip
    if args.json:
        print(json.dumps(plan.as_dict(), indent=2))
    else:
        show(plan)
    return 0


def show(plan) -> None:
    """The plan as tables: model, dtype, weights, a row per strategy variant, notes; with a hardware
    the floors (and on local hardware the calibration)."""
    from rich.console import Console
    from rich.table import Table

    from kvpipe import model

    spec, shape, device, dtype = plan.spec, plan.shape, plan.device, plan.dtype
    accelerator, local_runs, memory, available = plan.accelerator, plan.local_runs, plan.memory, plan.available
    # the floors table has ten columns, twelve with predictions
    width = max(Console().width, 120 if accelerator is None else 150 if local_runs is None else 170)
    say = Console(width=width).print
    say(f"[bold]kvpipe plan[/bold] · {spec.model.name} · {device} · batch {plan.kv.batch_size}")
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
    weight = plan.weights
    say(
        f"weights: {human_bytes(weight.bytes)} ({weight.bytes:,} bytes), {weight.source}",
        style=None if weight.exact else "yellow",
    )
    what = "the KV cache" if accelerator is None else "the KV cache and the transients"
    if memory is None:  # neither --memory-budget nor --hardware: no fits column
        named = ""
    elif plan.budget is not None:
        named = f"budget: {human_bytes(memory)}"
    else:
        named = f"memory: {human_bytes(memory)} ({memory / 1e9:.1f} GB, {plan.hardware_name})"
    if available is not None and available > 0:
        say(f"{named} - weights = {human_bytes(available)} for {what}")
    elif available is not None:
        say(
            f"{named} is less than the weights alone: no context fits; raise "
            "--memory-budget or choose a smaller model.dtype",
            style="bold red",
        )
    say(
        f"context = prompt + {plan.new_tokens} new tokens (workload.max_new_tokens); the cache holds context - 1 tokens"
    )

    table = Table(header_style="bold")
    per_token = ["KV B/token", "windows"] if shape.has_sliding_layers else ["KV B/token"]
    for column in ["strategy", *per_token] + [f"KV @ {c:,}" + ("*" if c > plan.cap else "") for c in plan.contexts]:
        table.add_column(column, justify="left" if column == "strategy" else "right")
    if available is not None:
        table.add_column("fits up to", justify="right")
    capacities = [row.capacity for row in plan.rows if row.capacity]
    if capacities:
        table.add_column(f"requests of {capacities[0].context:,}", justify="right")
        if accelerator is not None:
            table.add_column("TPOT floor ms there", justify="right")
    for row in plan.rows:
        cells = [row.label, f"{row.kv_bytes_per_token:,.0f}"]
        if shape.has_sliding_layers:
            cells.append(human_bytes(row.window_bytes))
        cells += [human_bytes(at.cost.kv_cache_bytes) for at in row.figures.contexts]
        if available is not None:
            fit = row.fits_up_to
            cells.append("none" if fit == 0 else f"{fit:,}" + (" (model max)" if fit == plan.cap else ""))
        if row.capacity:
            cells.append(capacity_cell(row.capacity))
            if accelerator is not None:
                cells.append(ms(row.capacity.tpot_floor_ms) if row.capacity.requests else "–")
        table.add_row(*cells)
    say(table)
    for note in plan.notes + capacity_notes(plan):
        say(f"[yellow]note:[/yellow] {note}")
    figures = [row.figures for row in plan.rows]
    if accelerator is not None:
        print_floors(say, figures, accelerator, dtype, plan.costs.weights_read(plan.kv.batch_size), memory)
    if local_runs is not None:
        print_calibration(say, figures, local_runs.said)


def capacity_cell(capacity) -> str:
    """'476'; '2,003 (host)' where host memory bounds it; '7,619 (device only)' where it was not counted."""
    text = f"{capacity.requests:,}" if capacity.requests else "none"
    return text + {HOST: " (host)", HOST_NOT_COUNTED: " (device only)"}.get(capacity.bound, "")


def capacity_notes(plan) -> list[str]:
    """For each row whose requests keep layers in host memory: which bound sets its capacity."""
    notes = []
    for row in plan.rows:
        capacity = row.capacity
        if not capacity or not capacity.host_kv_bytes:  # none offloaded, or none fit
            continue
        held = human_bytes(capacity.host_kv_bytes)
        if capacity.bound == HOST_NOT_COUNTED:
            why = f"--hardware {plan.hardware_name} names none" if plan.accelerator is not None else "none was given"
            notes.append(
                f"{row.label}: {counted(capacity.requests, 'request')} counts the device's memory only; host memory was not "
                f"counted ({why}), and their offloaded layers' KV would take {held} of it: give --host-memory SIZE"
            )
            continue
        bound = "host memory" if capacity.bound == HOST else "the device"
        host = f"{human_bytes(plan.host_memory)} of host memory ({host_source(plan)})"
        also = f"; the device alone would let {capacity.device_requests:,} in" if capacity.bound == HOST else ""
        notes.append(
            f"{row.label}: {counted(capacity.requests, 'request')}, bound by {bound}: their offloaded layers' KV takes {held} "
            f"of the {host}{also}"
        )
    return notes


def host_source(plan) -> str:
    """Where the plan's host memory figure comes from."""
    accelerator = plan.accelerator
    if accelerator is not None and accelerator.host_memory_bytes == plan.host_memory:
        return f"--hardware {plan.hardware_name}: {accelerator.sources[hardware.HOST_MEMORY].split(',')[0]}"
    return "--host-memory"


def ms(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:,.0f}" if value >= 1000 else f"{value:.3g}"


def print_floors(say, rows, hardware, dtype: str, weights_read: int, memory: int) -> None:
    """The floors table: a line per strategy and context."""
    from rich.table import Table

    calibrated = any(row.calibration for row in rows)
    source = "measured on this machine" if hardware.measured else hardware.sources.get("memory_bandwidth_gb_per_s", "")
    say(f"[bold]floors on {hardware.name}[/bold]: {hardware.specs_text(dtype)} ({source.split(',')[0]})")
    say(
        f"TPOT floor = (weights read {human_bytes(weights_read)} + KV read) per step / bandwidth; TTFT floor = the "
        "larger of prefill FLOPs / peak and prefill bytes / bandwidth. Needs = weights + KV + the larger of the "
        f"prefill's largest activation and the layer copy; fits in {human_bytes(memory)}"
    )
    table = Table(header_style="bold")
    columns = ["strategy", "context", "KV cache", "KV read/step", "TPOT floor ms", "TTFT floor ms"]
    columns += ["TPOT ms", "TTFT ms"] if calibrated else []
    columns += ["activation", "layer copy", "needs", "fits"]
    for column in columns:
        table.add_column(column, justify="left" if column == "strategy" else "right")
    for row in rows:
        for index, at in enumerate(row.contexts):
            cost = at.cost
            read = "host link" if cost.kv_read_bytes_per_step is None else human_bytes(cost.kv_read_bytes_per_step)
            cells = [row.label if index == 0 else "", f"{cost.context:,}" + ("*" if at.beyond_positions else ""),
                     human_bytes(cost.kv_cache_bytes), read, ms(at.tpot_floor_ms), ms(at.ttft_floor_ms)]  # fmt: skip
            if calibrated:
                mark = "†" if at.extrapolated else ""
                cells += [ms(at.tpot_ms) + (mark if at.tpot_ms is not None else ""),
                          ms(at.ttft_ms) + (mark if at.ttft_ms is not None else "")]  # fmt: skip
            copy = human_bytes(cost.dequantized_copy_bytes) if cost.dequantized_copy_bytes else "–"
            cells += [human_bytes(cost.activation_bytes), copy, human_bytes(cost.memory_bytes),
                      "yes" if at.fits else "no"]  # fmt: skip
            table.add_row(*cells, end_section=index == len(row.contexts) - 1)
    say(table)
    if calibrated:
        say(
            "TPOT ms, TTFT ms: calibrated on this machine's runs (below); † beyond the prompt lengths they were fitted on"
        )
    for reason in sorted({row.traffic_unknown for row in rows if row.traffic_unknown}):
        say(f"[yellow]note:[/yellow] no TPOT floor where KV read/step is the host link: {reason}")
    memory_bound = sorted({at.cost.context for row in rows for at in row.contexts if at.ttft_bound == "memory"})
    if memory_bound:
        shown = ", ".join(f"{c:,}" for c in memory_bound)
        say(f"[yellow]note:[/yellow] the TTFT floor at {shown} is set by reading the weights, not by FLOPs")


def print_calibration(say, rows, said: str) -> None:
    """The fitted lines and their residuals, then the commands that would calibrate the rest."""
    from rich.table import Table

    say(f"[bold]calibration[/bold]: {said}")
    fitted = [row for row in rows if row.calibration]
    if fitted:
        table = Table(header_style="bold")
        for column in ("strategy", "runs", "prompt tokens", "TPOT fit", "TPOT residuals", "TTFT fit", "TTFT residuals"):
            table.add_column(column, justify="left" if column in ("strategy", "TPOT fit", "TTFT fit") else "right")
        for row in fitted:
            fit = row.calibration
            residuals = fit.residuals()
            tpot, ttft = fit.formulas()
            table.add_row(
                row.label, str(len(residuals)), ", ".join(f"{n:,}" for n in fit.prompt_lengths), tpot,
                _percentages(r["tpot_residual_pct"] for r in residuals), ttft,
                _percentages(r["ttft_residual_pct"] for r in residuals),
            )  # fmt: skip
        say(table)
        say("each fit is a line in the bytes (TPOT) or FLOPs (TTFT) a run's context costs: exact through two prompt "
            "lengths; residuals (fit - measured) / measured per run")  # fmt: skip
    for row in rows:
        if row.command:
            measured = ", ".join(f"{n:,}" for n in row.measured_prompts)
            why = f"runs at prompt length {measured} only" if measured else "no runs"
            say(f"not calibrated: [bold]{row.label}[/bold] ({why}); floors only. To calibrate: {row.command}")


def _percentages(values) -> str:
    return ", ".join("–" if v is None else f"{v:+.1f}%" for v in values)
