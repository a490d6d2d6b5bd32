"""A job's figures round by round: each round's figures (a batch job's: mean TTFT, TPOT and decode
rate over the calls it made, every batch once; a served job's: kvpipe.measure.request_figures), the
interval of each figure over rounds, the stopping rule of repeats=auto, and the series as compact
tags that compare pairs with another job's rounds (kvpipe.decide.paired).

Over rounds rather than calls: a round holds every prompt once, so the prompts' own differences
(one longer than another) are not counted as noise, and two jobs that took turns in the same rounds
can be compared round by round, each round's drift cancelling in their ratio."""

from __future__ import annotations

import json
import math
import statistics

from kvpipe.measure.metrics import per_call_figures
from kvpipe.measure.uncertainty import mean_interval

BATCH_FIGURES = ("ttft_ms", "tpot_ms", "decode_tokens_per_s")
STOPPING_FIGURE = "tpot_ms"  # every job has it: repeats=auto stops on its interval, and rounds are counted in it
MIN_ROUNDS = 3  # the fewest an interval is read from over rounds (fewer: over calls)
TAG_PREFIX = "round_"  # round_tpot_ms: a JSON list, one value per round


def batch_round(calls: list) -> dict[str, float]:
    """One batch round's figures: the mean over its calls (kvpipe.job.generate.Call) of each, as the
    job's own figure is the mean over all its calls."""
    per_call = per_call_figures(calls)
    return {name: mean(per_call[name]) for name in BATCH_FIGURES}


def rounds_of(per_round: dict[str, list[float]]) -> int:
    return len(per_round[STOPPING_FIGURE])


def over_rounds(per_round: dict[str, list[float]]) -> dict[str, float]:
    """`rounds`, and with MIN_ROUNDS or more each figure's 95% interval over its round means (which
    replaces the interval over calls, or over requests)."""
    metrics = {"rounds": float(rounds_of(per_round))}
    if rounds_of(per_round) >= MIN_ROUNDS:
        for name, values in per_round.items():
            metrics[f"{name}_ci_low"], metrics[f"{name}_ci_high"] = mean_interval(values)
    return metrics


def converged(per_round: dict[str, list[float]], target_interval: float) -> bool:
    """repeats=auto's stopping rule: MIN_ROUNDS or more, and the TPOT interval over them within
    target_interval (a fraction of the mean)."""
    if rounds_of(per_round) < MIN_ROUNDS:
        return False
    return relative_half_width(per_round[STOPPING_FIGURE]) <= target_interval


def round_tags(per_round: dict[str, list[float]]) -> dict[str, str]:
    """Each figure's round means (4 significant figures), and what its interval is over."""
    tags = {TAG_PREFIX + name: json.dumps([_short(v) for v in values]) for name, values in per_round.items()}
    tags["interval_over"] = "rounds" if rounds_of(per_round) >= MIN_ROUNDS else "calls"
    return tags


def parse_series(text) -> list[float]:
    """A figure's round means back from its tag's text; [] where a run has none (NaN, or older runs)."""
    if not isinstance(text, str) or not text:
        return []
    return [math.nan if v is None else float(v) for v in json.loads(text)]


def relative_half_width(values: list[float]) -> float:
    """Half the 95% interval of the mean on the log scale (log(high / low) / 2: the t · s / (mean · √n)
    of the mean's relative error); inf where it cannot be read."""
    low, high = mean_interval(values)
    if math.isnan(low) or not low > 0:
        return math.inf
    return math.log(high / low) / 2


def mean(values: list[float]) -> float:
    """The mean of the values that are not NaN; NaN where none is."""
    finite = [v for v in values if not math.isnan(v)]
    return statistics.fmean(finite) if finite else math.nan


def _short(value: float):
    return None if math.isnan(value) else float(f"{value:.4g}")
