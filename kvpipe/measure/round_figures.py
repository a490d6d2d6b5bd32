"""A job's figures round by round: each round's figures (a batch job's: mean TTFT, TPOT and decode
rate over the calls it made, every batch once; a served job's: kvpipe.measure.request_figures), the
interval of each figure over rounds, the stopping rule of repeats=auto, and the series as compact
tags that compare pairs with another job's rounds (kvpipe.decide.paired).

Over rounds rather than calls: a round holds every prompt once, so the prompts' own differences
(one longer than another) are not counted as noise, and two jobs that took turns in the same rounds
can be compared round by round, each round's drift cancelling in their ratio."""

from __future__ import annotations

import hashlib
import json
import math
import statistics

from kvpipe.measure.metrics import per_call_figures
from kvpipe.measure.uncertainty import FASTER, SLOWER, mean_interval, verdict

BATCH_FIGURES = ("ttft_ms", "tpot_ms", "decode_tokens_per_s")
STOPPING_FIGURE = "tpot_ms"  # every job has it: repeats=auto stops on its interval, and rounds are counted in it
MIN_ROUNDS = 3  # the fewest an interval is read from over rounds (fewer: over calls)
TAG_PREFIX = "round_"  # round_tpot_ms: a JSON list, one value per round
CALL_PREFIX = "call_"  # call_tpot_ms: one value per call, round after round (null: left out as contended)
PAIR_PREFIX = "pair."  # pair.call_tpot_ms…: the calls of a copy of the baseline measured beside a job (pair_on_node)
CALL_KEYS = "call_keys"  # a digest of what each call of a round is: two runs' calls pair where it matches
CALL_FIGURES = ("ttft_ms", "tpot_ms")  # what paired ratios are read from
DECIDE_WITHIN = 0.03  # workload.decide_within's default: a sweep on repeats=auto stops at ±3%
LONGEST_TAG = 5000  # characters: MLflow keeps 8000 of a tag; a longer call series is left to the rounds'


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


def call_tags(per_call: dict[str, list[float]], keys: list) -> dict[str, str]:
    """Each figure's calls as tags, and the digest of the calls' keys; none where a series would be
    longer than a tag holds (the runs then pair round by round)."""
    tags = {CALL_PREFIX + name: json.dumps([_short(v) for v in per_call[name]]) for name in CALL_FIGURES}
    if max(len(text) for text in tags.values()) > LONGEST_TAG:
        return {}
    tags[CALL_KEYS] = hashlib.sha256(json.dumps(keys, default=str).encode()).hexdigest()[:12]
    return tags


def decided(ratio: float, low: float, high: float, within: float) -> bool:
    """Whether a paired ratio's interval settles its verdict: within ±`within` of its ratio, or
    clear of the ±NEGLIGIBLE band about 1 on either side (the verdict compare calls "clearly")."""
    if math.isnan(low) or math.isnan(high) or not low > 0:
        return False
    return math.log(high / low) / 2 <= math.log(1 + within) or verdict(low, high) in (SLOWER, FASTER)


def firmness_note(own_rounds: list[float], ratio: tuple[float, float, float], baseline: str) -> str | None:
    """Where a job's own TPOT interval over rounds is wider than its paired ratio's against the
    baseline: the words that say so, since its figure beside the baseline's tells less than the ratio."""
    value, low, high = ratio
    own = relative_half_width(own_rounds)
    if math.isnan(low) or not low > 0:
        return None
    paired_half = math.log(high / low) / 2
    if own <= paired_half:
        return None
    own_text = "no interval of its own" if math.isinf(own) else f"its own TPOT ±{math.expm1(own):.1%} over rounds"
    return (
        f"TPOT against {baseline}, paired call by call in the same turns: {value:.3f}× ({low:.3f}–{high:.3f}), "
        f"firmer than {own_text}: read the ratio, not the two figures side by side"
    )


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
