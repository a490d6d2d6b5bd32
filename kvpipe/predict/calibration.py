"""Calibrated TPOT and TTFT, fitted on this machine's own runs: for `kvpipe plan --hardware local`
(the runs: kvpipe.predict.local_runs) and `kvpipe compare --predicted` (kvpipe.predict.predicted_runs).

Per strategy (its cache settings exactly), in what each run's context costs (kvpipe.predict.floors,
the bytes and FLOPs the floors are made of):

    TPOT = a + b x decode_bytes_per_step                  (weights + KV read per step)
    TTFT = base + c x weight FLOPs + d x attention FLOPs   (base: the TPOT line with no KV)

a is what a step costs whatever its size (Python, kernel launches, sampling) and 1/b the bandwidth
the strategy reaches at the margin. A prefill also reads every weight once and pays a forward pass's
fixed costs: base is a decode step without KV, the TPOT line at the weights alone. 1/c and 1/d are
the throughputs of the weights' matrix products and of attention's: apart, because attention's
products (quadratic in the prompt) run other kernels, at another speed; one rate for both leaves
short prompts tens of per cent off (docs/plan.md: "Do the predictions hold?"). Two free parameters each,
by least squares on relative residuals, so that runs at two prompt lengths fix them exactly and more
leave residuals, shown. Each prompt length counts as the median of its runs, so that one slow run
among several repeats does not tilt the line, and weighs by how sure it is: by the inverse square of
its figure's 95% interval where its runs recorded one (a length measured tightly pulls the line
harder than one a slow spell widened), else as the others do relative to their size.
A time cannot fall as the work grows: a TPOT line that noise tilts down is taken flat, and a TTFT
fit with a negative throughput falls back to one rate for both kinds of FLOPs. Where TPOT is not
calibrated (an offloading cache's traffic is not counted), TTFT is a line in all FLOPs, with its
own intercept. Strategies measured at fewer than two prompt lengths are not calibrated; plan shows
their floors and the command that would calibrate them.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

MIN_PROMPT_LENGTHS = 2


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
    tpot_half_ms: float | None = None  # half its 95% interval, where the run recorded one
    ttft_half_ms: float | None = None

    @classmethod
    def of(cls, run_id: str, cost, tpot_ms: float, ttft_ms: float, tpot_half_ms=None, ttft_half_ms=None) -> "Sample":
        return cls(run_id, cost.prompt_tokens, cost.new_tokens, cost.decode_bytes_per_step, cost.prefill_flops,
                   cost.prefill_attention_flops, cost.weights_read_bytes_per_step, tpot_ms, ttft_ms,
                   tpot_half_ms, ttft_half_ms)  # fmt: skip


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


SURE_AT_MOST = 0.005  # an interval narrower than 0.5% of its figure weighs as this: no point outweighs all


def point_weights(ys: list[float], halves: list[float | None] | None = None) -> list[float]:
    """Each point's least-squares weight: 1 / its interval's half-width squared where it has one,
    else as a point of the others' typical relative width (with none, 1 / y squared: relative residuals)."""
    halves = halves or [None] * len(ys)
    relative = [h / y for h, y in zip(halves, ys) if h is not None and h == h and y]
    typical = statistics.median(relative) if relative else 1.0
    sigmas = [h if h is not None and h == h else typical * y for h, y in zip(halves, ys)]
    return [1 / max(sigma, SURE_AT_MOST * y) ** 2 for sigma, y in zip(sigmas, ys)]


def fit_prefill(base_ms: float, linear: list[float], attention: list[float], ys: list[float],
                halves: list[float | None] | None = None) -> Prefill:  # fmt: skip
    """The two throughputs through TTFT - base, by weighted least squares (point_weights; exact for
    two prompt lengths). A negative one is noise, not a law: then one throughput for all FLOPs, and
    no less than zero."""
    weights = point_weights(ys, halves)
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


def by_length(points: list[Sample], x, y, half=lambda p: None) -> tuple[list[float], list[float], list]:
    """(x, the median y, its half-width or None) per distinct x: each prompt length once, at the
    median of its runs, as sure as their typical interval over the square root of how many they are."""
    groups: dict[float, list[Sample]] = {}
    for p in points:
        groups.setdefault(x(p), []).append(p)
    ys = [statistics.median(y(p) for p in found) for found in groups.values()]
    halves = []
    for found in groups.values():
        known = [half(p) for p in found if half(p) is not None and half(p) == half(p)]
        halves.append(statistics.median(known) / len(found) ** 0.5 if known else None)
    return list(groups), ys, halves


def fit_line(xs: list[float], ys: list[float], halves: list[float | None] | None = None) -> Line:
    """Weighted least squares (point_weights): by default on the relative residuals, (fit - y) / y,
    what a prediction's error is counted in, so a 600 ms prefill weighs as much as a 30 s one (plain
    least squares would fit the long ones and leave the short ones tens of per cent off); with
    intervals, each point as sure as its own. Through both points exactly when there are two. xs
    must not all be equal. A time cannot fall as the work grows: where noise tilts the line down, it
    is flat, at the level that minimises the same residuals."""
    weights = point_weights(ys, halves)
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
        tpot = fit_line(*by_length(counted, lambda p: p.decode_bytes, lambda p: p.tpot_ms, lambda p: p.tpot_half_ms))
    prompts, ys, halves = by_length(points, lambda p: p.prompt_tokens, lambda p: p.ttft_ms, lambda p: p.ttft_half_ms)
    one_of = {p.prompt_tokens: p for p in points}  # a length's runs share its FLOPs
    flops = [one_of[n].prefill_flops for n in prompts]
    if tpot is None:
        line = fit_line(flops, ys, halves)
        ttft = Prefill(line.intercept_ms, line.slope_ms, line.slope_ms, False)
    else:
        attention = [one_of[n].attention_flops for n in prompts]
        base = tpot.at(points[0].weights_bytes)
        ttft = fit_prefill(base, [f - a for f, a in zip(flops, attention)], attention, ys, halves)
    return Calibration(label, tuple(points), tpot, ttft)
