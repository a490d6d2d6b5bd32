"""`kvpipe plan --hardware`: per strategy and context, the floors of TPOT and TTFT on an accelerator
(kvpipe.predict.floors), what the job needs in memory, and with `--hardware local` what a calibration
on this machine's runs predicts (kvpipe.predict.calibration); as tables, and as plan's JSON rows."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvpipe.predict import calibration
from kvpipe.predict.calibration import Calibration
from kvpipe.predict.floors import Cost, split
from kvpipe.units import human_bytes


@dataclass(frozen=True)
class AtContext:
    """One strategy at one context: its costs, floors, fit and prediction."""

    cost: Cost
    beyond_positions: bool
    fits: bool | None  # None: no memory to fit in was given
    tpot_floor_ms: float | None = None  # None: no hardware, or traffic that is not counted
    ttft_floor_ms: float | None = None
    ttft_bound: str | None = None  # which term sets the TTFT floor: compute or memory
    tpot_ms: float | None = None  # calibrated predictions
    ttft_ms: float | None = None
    extrapolated: bool = False  # beyond the prompt lengths the calibration was fitted on

    def as_dict(self) -> dict:
        """The JSON of one context: tpot_ms and ttft_ms are the calibrated predictions where there
        are some, else the floors (`basis` says which)."""
        cost, calibrated = self.cost, self.ttft_ms is not None
        basis = "calibrated" if calibrated else "floor" if self.ttft_floor_ms is not None else None
        return {
            "context": cost.context,
            "prompt_tokens": cost.prompt_tokens,
            "new_tokens": cost.new_tokens,
            "kv_cache_bytes": cost.kv_cache_bytes,
            "tpot_ms": self.tpot_ms if calibrated else self.tpot_floor_ms,
            "ttft_ms": self.ttft_ms if calibrated else self.ttft_floor_ms,
            "fits": self.fits,
            "basis": basis,
            "tpot_floor_ms": self.tpot_floor_ms,
            "ttft_floor_ms": self.ttft_floor_ms,
            "ttft_floor_bound": self.ttft_bound,
            "extrapolated": self.extrapolated if calibrated else None,
            "beyond_positions": self.beyond_positions,
            "weights_read_bytes_per_step": cost.weights_read_bytes_per_step,
            "kv_read_bytes_per_step": cost.kv_read_bytes_per_step,
            "decode_bytes_per_step": cost.decode_bytes_per_step,
            "prefill_flops": cost.prefill_flops,
            "prefill_bytes": cost.prefill_bytes,
            "activation_bytes": cost.activation_bytes,
            "dequantized_copy_bytes": cost.dequantized_copy_bytes,
            "memory_bytes": cost.memory_bytes,
        }


@dataclass
class Row:
    """One strategy variant of the plan, at every context asked for."""

    label: str
    variant: object  # its Spec
    contexts: list[AtContext] = field(default_factory=list)
    calibration: Calibration | None = None
    measured_prompts: list[int] = field(default_factory=list)  # with --hardware local: the lengths its runs have
    command: str | None = None  # with --hardware local and too few runs: the sweep that would calibrate it
    traffic_unknown: str | None = None  # why it has no TPOT floor


def at_context(cost: Cost, cap: int, hardware, dtype: str, memory: int | None, extras: bool,
               fitted: Calibration | None) -> AtContext:  # fmt: skip
    """Figures of one context. `extras`: fits counts the transients (with --hardware), else weights + KV."""
    beyond = cost.context > cap
    needs = cost.memory_bytes if extras else cost.weights_bytes + cost.kv_cache_bytes
    fits = None if memory is None else needs <= memory
    if hardware is None:
        return AtContext(cost, beyond, fits)
    floors = dict(tpot_floor_ms=cost.tpot_floor_ms(hardware), ttft_floor_ms=cost.ttft_floor_ms(hardware, dtype),
                  ttft_bound=cost.prefill_bound(hardware, dtype))  # fmt: skip
    if fitted is None or beyond:  # the positions are the model's limit: nothing is predicted past them
        return AtContext(cost, beyond, fits, **floors)
    return AtContext(cost, beyond, fits, **floors, tpot_ms=fitted.tpot_ms(cost),
                     ttft_ms=fitted.ttft_ms(cost), extrapolated=fitted.extrapolated(cost.prompt_tokens))  # fmt: skip


def build_row(label, variant, spec, costs, contexts, cap, accelerator, dtype, memory, local_runs) -> Row:
    """A strategy's figures at each context; with local runs, its calibration or the command that would make one."""
    strategy, new_tokens = variant.strategy, spec.workload.max_new_tokens
    built = Row(label, variant)
    if local_runs is not None:
        found = calibration.points(local_runs.runs, variant, costs) if local_runs.runs is not None else []
        built.calibration = calibration.calibrate(label, found)
        built.measured_prompts = sorted({p.prompt_tokens for p in found})
        if built.calibration is None:
            built.command = calibration.calibrating_command(spec, variant, built.measured_prompts, new_tokens, cap)
    for context in contexts:
        cost = costs.at(strategy, *split(context, new_tokens))
        built.contexts.append(
            at_context(cost, cap, accelerator, dtype, memory, accelerator is not None, built.calibration)
        )
        if accelerator is not None and cost.kv_read_bytes_per_step is None:
            built.traffic_unknown = strategy.traffic_unknown_reason(costs.device)
    return built


def calibration_document(local_runs, rows: list[Row]) -> dict | None:
    if local_runs is None:
        return None
    return {
        "runs": local_runs.said,
        "store": local_runs.store,
        "strategies": [row.calibration.as_dict() for row in rows if row.calibration],
        "uncalibrated": [
            {"strategy": row.label, "measured_prompt_tokens": row.measured_prompts, "command": row.command}
            for row in rows
            if row.command
        ],
    }


def ms(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:,.0f}" if value >= 1000 else f"{value:.3g}"


def print_floors(say, rows: list[Row], hardware, dtype: str, weights_read: int, memory: int) -> None:
    """The floors table: a line per strategy and context."""
    from rich.table import Table

    calibrated = any(row.calibration for row in rows)
    source = "measured on this machine" if hardware.measured else hardware.sources.get("memory_bandwidth_gb_per_s", "")
    say(f"[bold]floors on {hardware.name}[/bold]: {hardware.summary(dtype)} ({source.split(',')[0]})")
    say(
        f"TPOT floor = (weights read {human_bytes(weights_read)} + KV read) per step / bandwidth; TTFT floor = the "
        "larger of prefill FLOPs / peak and prefill bytes / bandwidth. Needs = weights + KV + the larger of the "
        f"prefill's largest activation and (quantized) one layer's dequantized copy; fits in {human_bytes(memory)}"
    )
    table = Table(header_style="bold")
    columns = ["strategy", "context", "KV cache", "KV read/step", "TPOT floor ms", "TTFT floor ms"]
    columns += ["TPOT ms", "TTFT ms"] if calibrated else []
    columns += ["activation", "dequant copy", "needs", "fits"]
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
            dequantized = human_bytes(cost.dequantized_copy_bytes) if cost.dequantized_copy_bytes else "–"
            cells += [human_bytes(cost.activation_bytes), dequantized, human_bytes(cost.memory_bytes),
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


def print_calibration(say, rows: list[Row], said: str) -> None:
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
            tpot, ttft = fit.describe()
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
