"""Calibrated TPOT and TTFT, from this machine's own runs: for `kvpipe plan --hardware local` and
`kvpipe compare --predicted`.

Per strategy (its cache settings exactly), in what each run's context costs (kvpipe.predict.floors,
the bytes and FLOPs the floors are made of):

    TPOT = a + b x decode_bytes_per_step                  (weights + KV read per step)
    TTFT = base + c x weight FLOPs + d x attention FLOPs   (base: the TPOT line with no KV)

a is what a step costs whatever its size (Python, kernel launches, sampling) and 1/b the bandwidth
the strategy reaches at the margin. A prefill also reads every weight once and pays a forward pass's
fixed costs: base is a decode step without KV, the TPOT line at the weights alone. 1/c and 1/d are
the throughputs of the weights' matrix products and of attention's: apart, because attention's
products (quadratic in the prompt) run other kernels, at another speed; one rate for both leaves
short prompts tens of per cent off (README: "Do the predictions hold?"). Two free parameters each,
by least squares on relative residuals, so that runs at two prompt lengths fix them exactly and more
leave residuals, shown. Each prompt length counts as the median of its runs, so that one slow run
among several repeats does not tilt the line.
A time cannot fall as the work grows: a TPOT line that noise tilts down is taken flat, and a TTFT
fit with a negative throughput falls back to one rate for both kinds of FLOPs. Where TPOT is not
calibrated (an offloading cache's traffic is not counted), TTFT is a line in all FLOPs, with its
own intercept. Strategies measured at fewer than two prompt lengths are not calibrated; plan shows
their floors and the command that would calibrate them.
"""

from __future__ import annotations

import math
import shlex
import socket
import statistics
from dataclasses import dataclass

from kvpipe.errors import KvpipeError
from kvpipe.record import tags as mlflow_tags
from kvpipe.spec import override_group

MIN_PROMPT_LENGTHS = 2
# compare --predicted's columns (compare shows TPOT, not TTFT, of its own: the measured TTFT comes too)
PREDICTED = {
    "predicted_tpot_ms": "TPOT predicted ms",
    "measured_ttft_ms": "TTFT ms",
    "predicted_ttft_ms": "TTFT predicted ms",
}


@dataclass(frozen=True)
class Sample:
    """One measured run, and what its context costs."""

    run_id: str
    prompt_tokens: int
    new_tokens: int
    decode_bytes: int | None  # None: an offloading cache's host traffic, not counted
    prefill_flops: int
    attention_flops: int  # of prefill_flops
    weights_bytes: int  # weight bytes a decode step reads: the TPOT line there is a step without KV
    tpot_ms: float
    ttft_ms: float

    @classmethod
    def of(cls, run_id: str, cost, tpot_ms: float, ttft_ms: float) -> "Sample":
        return cls(run_id, cost.prompt_tokens, cost.new_tokens, cost.decode_bytes_per_step, cost.prefill_flops,
                   cost.prefill_attention_flops, cost.weights_read_bytes_per_step, tpot_ms, ttft_ms)  # fmt: skip


@dataclass(frozen=True)
class Line:
    """y = intercept_ms + slope_ms x x."""

    intercept_ms: float
    slope_ms: float

    def at(self, x: float) -> float:
        return self.intercept_ms + self.slope_ms * x


@dataclass(frozen=True)
class Prefill:
    """TTFT = base_ms + linear_ms x weight FLOPs + attention_ms x attention FLOPs."""

    base_ms: float
    linear_ms: float  # per FLOP of the weights' matrix products
    attention_ms: float  # per FLOP of attention's
    base_from_tpot: bool  # base is the TPOT line without KV (else a fitted intercept, one rate for all FLOPs)

    def at(self, flops: float, attention_flops: float) -> float:
        return self.base_ms + self.linear_ms * (flops - attention_flops) + self.attention_ms * attention_flops


def fit_prefill(base_ms: float, linear: list[float], attention: list[float], ys: list[float]) -> Prefill:
    """The two throughputs through TTFT - base, by least squares on relative residuals (exact for two
    prompt lengths). A negative one is noise, not a law: then one throughput for all FLOPs, and no
    less than zero."""
    weights = [1 / y**2 for y in ys]
    rest = [y - base_ms for y in ys]
    sll = sum(w * x * x for w, x in zip(weights, linear))
    saa = sum(w * x * x for w, x in zip(weights, attention))
    sla = sum(w * x * z for w, x, z in zip(weights, linear, attention))
    sly = sum(w * x * r for w, x, r in zip(weights, linear, rest))
    say = sum(w * z * r for w, z, r in zip(weights, attention, rest))
    determinant = sll * saa - sla * sla
    if determinant > 1e-12 * sll * saa:
        c, d = (sly * saa - say * sla) / determinant, (say * sll - sly * sla) / determinant
        if c >= 0 and d >= 0:
            return Prefill(base_ms, c, d, True)
    total = [x + z for x, z in zip(linear, attention)]
    rate = sum(w * t * r for w, t, r in zip(weights, total, rest)) / sum(w * t * t for w, t in zip(weights, total))
    return Prefill(base_ms, max(rate, 0.0), max(rate, 0.0), True)


def by_length(points: list[Sample], x, y) -> tuple[list[float], list[float]]:
    """(x, the median y) per distinct x: each prompt length once, at the median of its runs."""
    groups: dict[float, list[float]] = {}
    for p in points:
        groups.setdefault(x(p), []).append(y(p))
    return list(groups), [statistics.median(found) for found in groups.values()]


def fit_line(xs: list[float], ys: list[float]) -> Line:
    """Least squares on the relative residuals, (fit - y) / y: what a prediction's error is counted
    in, so a 600 ms prefill weighs as much as a 30 s one (plain least squares would fit the long
    ones and leave the short ones tens of per cent off). Through both points exactly when there
    are two. xs must not all be equal. A time cannot fall as the work grows: where noise tilts the
    line down, it is flat, at the level that minimises the same residuals."""
    weights = [1 / y**2 for y in ys]
    total = sum(weights)
    mean_x = sum(w * x for w, x in zip(weights, xs)) / total
    mean_y = sum(w * y for w, y in zip(weights, ys)) / total
    spread = sum(w * (x - mean_x) ** 2 for w, x in zip(weights, xs))
    if spread == 0:
        raise ValueError("a line needs at least two distinct x values")
    slope = sum(w * (x - mean_x) * (y - mean_y) for w, x, y in zip(weights, xs, ys)) / spread
    return Line(mean_y - slope * mean_x, slope) if slope >= 0 else Line(mean_y, 0.0)


@dataclass(frozen=True)
class Calibration:
    """One strategy's lines, and the runs they were fitted to."""

    label: str
    points: tuple[Sample, ...]
    tpot: Line | None  # None: its decode traffic cannot be counted (offloading on CUDA)
    ttft: Prefill

    def tpot_ms(self, cost) -> float | None:
        decode = cost.decode_bytes_per_step
        return None if self.tpot is None or decode is None else self.tpot.at(decode)

    def ttft_ms(self, cost) -> float:
        return self.ttft.at(cost.prefill_flops, cost.prefill_attention_flops)

    @property
    def prompt_lengths(self) -> list[int]:
        return sorted({p.prompt_tokens for p in self.points})

    def extrapolated(self, prompt_tokens: int) -> bool:
        """Outside the prompt lengths it was fitted on."""
        lengths = self.prompt_lengths
        return not lengths[0] <= prompt_tokens <= lengths[-1]

    def residuals(self) -> list[dict]:
        """Per run: measured, fitted, and the residual as a share of the measured figure."""
        rows = []
        for p in self.points:
            row = {"run_id": p.run_id, "prompt_tokens": p.prompt_tokens, "new_tokens": p.new_tokens}
            tpot = None if self.tpot is None or p.decode_bytes is None else self.tpot.at(p.decode_bytes)
            for name, fitted, y in (("tpot", tpot, p.tpot_ms),
                                    ("ttft", self.ttft.at(p.prefill_flops, p.attention_flops), p.ttft_ms)):  # fmt: skip
                row |= {f"{name}_ms": y, f"{name}_fitted_ms": fitted,
                        f"{name}_residual_pct": None if fitted is None else (fitted - y) / y * 100}  # fmt: skip
            rows.append(row)
        return rows

    def formulas(self) -> tuple[str, str]:
        """('12.3 ms + bytes / 31.6 GB/s', '14.0 ms + weight FLOPs / 85.2 GFLOP/s + attention FLOPs / 50.1 GFLOP/s')."""
        tpot = "– (decode traffic not counted)" if self.tpot is None else _line_text(self.tpot, "bytes", "GB/s")
        ttft = self.ttft
        if ttft.linear_ms == ttft.attention_ms:
            return tpot, _line_text(Line(ttft.base_ms, ttft.linear_ms), "FLOPs", "GFLOP/s")
        return tpot, f"{ttft.base_ms:.3g} ms + weight FLOPs / {_rate(ttft.linear_ms)} + attention FLOPs / " + _rate(
            ttft.attention_ms
        )

    def as_dict(self) -> dict:
        tpot = (
            None if self.tpot is None else {"intercept_ms": self.tpot.intercept_ms, "ms_per_byte": self.tpot.slope_ms}
        )
        ttft = {"base_ms": self.ttft.base_ms, "base": "tpot without kv" if self.ttft.base_from_tpot else "fitted",
                "ms_per_weight_flop": self.ttft.linear_ms, "ms_per_attention_flop": self.ttft.attention_ms}  # fmt: skip
        return {
            "strategy": self.label,
            "prompt_lengths": self.prompt_lengths,
            "tpot": tpot,
            "ttft": ttft,
            "runs": self.residuals(),
        }


def _rate(ms_per_flop: float) -> str:
    return "∞ GFLOP/s" if ms_per_flop <= 0 else f"{1 / ms_per_flop / 1e6:.3g} GFLOP/s"


def _line_text(line: Line, x: str, rate: str) -> str:
    if line.slope_ms <= 0:
        return f"{line.intercept_ms:.3g} ms, flat (the runs fall as {x} grow: noise)"
    return f"{line.intercept_ms:.3g} ms + {x} / {1 / line.slope_ms / 1e6:.3g} {rate}"


def calibrate(label: str, points: list[Sample]) -> Calibration | None:
    """The lines through a strategy's runs, or None where they span fewer than two prompt lengths."""
    if len({p.prompt_tokens for p in points}) < MIN_PROMPT_LENGTHS:
        return None
    counted = [p for p in points if p.decode_bytes is not None]
    tpot = None
    if len({p.decode_bytes for p in counted}) >= MIN_PROMPT_LENGTHS:
        tpot = fit_line(*by_length(counted, lambda p: p.decode_bytes, lambda p: p.tpot_ms))
    prompts, ys = by_length(points, lambda p: p.prompt_tokens, lambda p: p.ttft_ms)
    one_of = {p.prompt_tokens: p for p in points}  # a length's runs share its FLOPs
    flops = [one_of[n].prefill_flops for n in prompts]
    if tpot is None:
        line = fit_line(flops, ys)
        ttft = Prefill(line.intercept_ms, line.slope_ms, line.slope_ms, False)
    else:
        attention = [one_of[n].attention_flops for n in prompts]
        base = tpot.at(points[0].weights_bytes)
        ttft = fit_prefill(base, [f - a for f, a in zip(flops, attention)], attention, ys)
    return Calibration(label, tuple(points), tpot, ttft)


# ---- reading this machine's runs --------------------------------------------------------------


@dataclass(frozen=True)
class LocalRuns:
    """The runs a calibration may use, and a line saying which they are (or why there are none)."""

    runs: object  # a DataFrame (kvpipe.record.runs), or None
    said: str
    store: str | None = None


def read_local_runs(spec, dtype: str, device: str, threads: int) -> LocalRuns:
    """The experiment's FINISHED runs of this model and dtype, on this host and device (on CPU, with
    these torch threads: another thread count is another machine to the roofline), at the plan's
    batch size, neither contended nor fallen back to another strategy. Every run counts, a
    measurement's repeats included: each length is fitted at the median of its runs, which a run
    slower than the others (noisy or not) does not move."""
    from pathlib import Path

    from kvpipe.record.runs import column, read_runs
    from kvpipe.record.store import resolve_uri

    experiment, host, batch = spec.tracking.experiment, socket.gethostname(), spec.workload.batch_size
    store = resolve_uri(spec.tracking.uri, Path.cwd())[1]
    try:
        runs, _ = read_runs(experiment, None, spec.tracking.uri, whole_experiment=True, spelled="tracking.uri",
                            every_repeat=True)  # fmt: skip
    except KvpipeError as exc:
        return LocalRuns(None, f"no runs to calibrate with: {exc}", store)
    wanted = {"params.model.name": spec.model.name, "params.model.dtype": dtype, mlflow_tags.column(mlflow_tags.HOST): host,
              mlflow_tags.column(mlflow_tags.DEVICE): device}  # fmt: skip
    if device == "cpu":
        wanted[mlflow_tags.column(mlflow_tags.TORCH_THREADS)] = str(threads)
    keep = column(runs, "metrics.batch_size") == batch
    for name, value in wanted.items():
        keep &= column(runs, name, None) == value
    contended = column(runs, mlflow_tags.column(mlflow_tags.CONTENDED), "").fillna("") == "true"
    keep &= ~contended & column(runs, mlflow_tags.column(mlflow_tags.FALLBACK_TO), None).isna()
    keep &= column(runs, "metrics.tpot_ms").notna() & column(runs, "metrics.ttft_ms").notna()
    what = " · ".join([spec.model.name, dtype, device, f"host {host}"] + ([f"{threads} torch threads"] if device == "cpu"
                      else []) + [f"batch {batch}"])  # fmt: skip
    said = f"{int(keep.sum())} of the {len(runs)} FINISHED runs in experiment {experiment!r} ({store}) are {what}"
    return LocalRuns(runs[keep], said, store)


def matching(runs, variant):
    """The runs whose cache settings are exactly the variant's (every cache, backend and axis field
    its strategy reads, as runs log them)."""
    import pandas as pd

    from kvpipe.record.runs import column

    wanted = variant.params()
    keep = pd.Series(True, index=runs.index)
    for name in variant.read_fields():
        if not name.endswith(".*"):
            logged = column(runs, f"params.{name}", None)
            same = [(value if isinstance(value, str) else None) == wanted.get(name) for value in logged]
            keep &= pd.Series(same, index=runs.index, dtype=bool)
    return runs[keep]


def samples(runs, variant, costs) -> list[Sample]:
    """The variant's runs among `runs`, each with what its context costs (floors.ModelCosts)."""
    found = []
    for _, run in matching(runs, variant).iterrows():
        prompt, new = round(run["metrics.prompt_tokens"]), max(1, round(run["metrics.new_tokens"]))
        cost = costs.at(variant.strategy, prompt, new)
        found.append(Sample.of(run["run_id"], cost, float(run["metrics.tpot_ms"]), float(run["metrics.ttft_ms"])))
    return found


def calibrating_command(spec, variant, measured: list[int], new_tokens: int, cap: int) -> str:
    """The sweep that would calibrate the variant: its cache settings at two prompt lengths (one it
    was measured at, where it was), with the plan's other overrides."""
    room = cap - new_tokens
    lengths = [length for length in (512, 2048) if length <= room] or [max(1, room // 8), max(2, room // 2)]
    if measured:
        other = measured[0] * 4 if measured[0] * 4 <= room else max(1, measured[0] // 4)
        lengths = [measured[0], other]
    kept = [o for o in spec.overrides if override_group(o) not in ("cache", "backend", "axis")
            and not o.startswith(("workload=", "workload.prompt_tokens=", "quality="))]  # fmt: skip
    words = [*kept, *type(variant.strategy).command_overrides(variant.params()), "workload=long_context",
             f"workload.prompt_tokens={','.join(str(n) for n in sorted(set(lengths)))}", "quality=off"]  # fmt: skip
    if f"workload.max_new_tokens={new_tokens}" not in words:
        words.append(f"workload.max_new_tokens={new_tokens}")
    return "kvpipe -m " + shlex.join(words)


# ---- compare --predicted -------------------------------------------------------------------------


def with_predictions(runs):
    """compare --predicted: beside each run, the TPOT and TTFT that a calibration on its group's runs
    (same model, dtype, host, device, threads, batch and cache settings, at two or more prompt
    lengths) predicts for it. Each run's job is composed again from its logged overrides to count
    its costs; a run that no longer composes, or whose group has one prompt length, gets none."""
    from kvpipe.record.runs import column

    runs = runs.copy()
    for name in PREDICTED:
        runs[name] = math.nan
    runs["measured_ttft_ms"] = column(runs, "metrics.ttft_ms")
    groups: dict[tuple, list[tuple[int, Sample]]] = {}
    for index, run in runs.iterrows():
        found = _sample_of(run)
        if found is not None:
            describe, point = found
            key = tuple(str(column(runs, name, None)[index]) for name in _GROUP_COLUMNS) + (describe,)
            groups.setdefault(key, []).append((index, point))
    for members in groups.values():
        calibration = calibrate("", [point for _, point in members])
        if calibration is None:
            continue
        for index, point in members:
            if calibration.tpot is not None and point.decode_bytes is not None:
                runs.loc[index, "predicted_tpot_ms"] = calibration.tpot.at(point.decode_bytes)
            runs.loc[index, "predicted_ttft_ms"] = calibration.ttft.at(point.prefill_flops, point.attention_flops)
    return runs


_GROUP_COLUMNS = ("params.model.name", "params.model.dtype", mlflow_tags.column(mlflow_tags.HOST), mlflow_tags.column(mlflow_tags.DEVICE),
                  mlflow_tags.column(mlflow_tags.TORCH_THREADS), "metrics.batch_size")  # fmt: skip


def _sample_of(run) -> tuple[str, Sample] | None:
    """(the run's cache settings, its Sample), from its job composed again; None where it cannot be."""
    spec = _job_spec(str(run.get(mlflow_tags.column(mlflow_tags.OVERRIDES))))
    needed = ("metrics.prompt_tokens", "metrics.new_tokens", "metrics.batch_size", "metrics.tpot_ms", "metrics.ttft_ms")
    if spec is None or any(not isinstance(run.get(n), float) or math.isnan(run.get(n)) for n in needed):
        return None
    dtype, device, batch = (
        run.get("params.model.dtype"),
        run.get(mlflow_tags.column(mlflow_tags.DEVICE)),
        int(run["metrics.batch_size"]),
    )
    costs = _costs(spec, str(dtype), batch, str(device))
    if costs is None:
        return None
    prompt, new = round(run["metrics.prompt_tokens"]), max(1, round(run["metrics.new_tokens"]))
    cost = costs.at(spec.strategy, prompt, new)
    point = Sample.of(run["run_id"], cost, float(run["metrics.tpot_ms"]), float(run["metrics.ttft_ms"]))
    return spec.strategy.describe(), point


_SPECS: dict[str, object] = {}
_COSTS: dict[tuple, object] = {}


def _job_spec(overrides: str):
    if overrides not in _SPECS:
        from kvpipe.spec import spec_from

        words = [] if overrides in ("(defaults)", "None", "nan") else shlex.split(overrides)
        try:
            _SPECS[overrides] = spec_from(words)
        except Exception:  # noqa: BLE001 - a config that no longer composes (a renamed option, a moved file)
            _SPECS[overrides] = None
    return _SPECS[overrides]


def _costs(spec, dtype: str, batch: int, device: str):
    """The run's model's costs, made once per model, dtype, batch and device (runs share them)."""
    from kvpipe.model.loading import config_key
    from kvpipe.predict.costs import costs_for

    key = (config_key(spec.model), dtype, batch, device)
    if key not in _COSTS:
        try:
            _COSTS[key] = costs_for(spec, device, dtype, batch)
        except (KvpipeError, OSError, KeyError):  # a model folder gone, a hub id offline, an unknown dtype
            _COSTS[key] = None
    return _COSTS[key]
