"""`kvpipe plan --hardware`: per strategy and context, the floors of TPOT and TTFT on an accelerator
(kvpipe.predict.floors), what the job needs in memory, and with `--hardware local` what a calibration
on this machine's runs predicts (kvpipe.predict.calibration); as plan's rows and their JSON (the
tables are kvpipe.commands.plan's)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvpipe.predict import calibration
from kvpipe.predict import local_runs as machine_runs
from kvpipe.predict.calibration import Calibration
from kvpipe.predict.floors import Cost, split


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
        found = machine_runs.samples(local_runs.runs, variant, costs) if local_runs.runs is not None else []
        built.calibration = calibration.calibrate(label, found)
        built.measured_prompts = sorted({p.prompt_tokens for p in found})
        if built.calibration is None:
            built.command = machine_runs.calibrating_command(spec, variant, built.measured_prompts, new_tokens, cap)
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
