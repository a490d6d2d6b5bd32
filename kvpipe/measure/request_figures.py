"""What a served job measured, per request and over its passes, with the definitions vLLM's
`bench serve`, GuideLLM and AIPerf use, so a user can set kvpipe's figures beside theirs:
TTFT from the request's arrival (its queueing delay included), TPOT over its own tokens after the
first, ITL between consecutive tokens of one request (pooled over requests), end-to-end from arrival
to its last token, output tokens and requests per second over the run (first arrival to last
token, each pass's), and goodput: the requests per second that met both latency targets (and, where
the workload judges answers, those that also answered right). A served job's round is one pass over
its requests (`pass_figures`); `request_rows` keeps each request as it was served."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Iterable

from kvpipe.load import PERCENTILES
from kvpipe.measure.uncertainty import with_intervals


@dataclass
class Served:
    """One request as the server saw it; times in seconds on one perf_counter clock."""

    arrival_s: float
    started_s: float  # when the server took it (its queueing delay ends)
    token_s: list[float] = field(default_factory=list)  # when each generated token was ready
    finished_s: float = 0.0  # when its answer was whole (a static batch holds it to its longest row)
    prompt_tokens: int = 0
    tokens: list[int] = field(default_factory=list)
    prefix_hit_tokens: int | None = None  # its prompt tokens served from cache, where its server counts them

    @property
    def ttft_ms(self) -> float:
        return (self.token_s[0] - self.arrival_s) * 1e3

    @property
    def tpot_ms(self) -> float | None:
        """Time per output token after the first; None for a one-token answer."""
        if len(self.token_s) < 2:
            return None
        return (self.token_s[-1] - self.token_s[0]) / (len(self.token_s) - 1) * 1e3

    @property
    def e2e_ms(self) -> float:
        return (self.finished_s - self.arrival_s) * 1e3

    @property
    def queue_ms(self) -> float:
        return (self.started_s - self.arrival_s) * 1e3

    def itl_ms(self) -> list[float]:
        return [(b - a) * 1e3 for a, b in zip(self.token_s, self.token_s[1:])]

    def meets(self, max_ttft_ms: float | None, max_tpot_ms: float | None) -> bool:
        tpot = self.tpot_ms
        return (max_ttft_ms is None or self.ttft_ms <= max_ttft_ms) and (
            max_tpot_ms is None or tpot is None or tpot <= max_tpot_ms
        )


def percentile(values: list[float], share: float) -> float:
    """The nearest-rank percentile (share in 0-1) of the values; NaN for none."""
    if not values:
        return float("nan")
    return sorted(values)[_rank(share, len(values)) - 1]


def _rank(share: float, count: int) -> int:
    """The nearest-rank percentile's place among `count` values in order, from 1: the smallest rank
    covering that share."""
    return min(max(math.ceil(round(share * count, 9)), 1), count)


def certain_miss(served: Iterable[Served], total: int, max_ttft_ms: float | None, max_tpot_ms: float | None,
                 at: int) -> str | None:  # fmt: skip
    """Why a pass of `total` requests misses a target at percentile `at` whatever its requests not yet
    answered do, from those answered (`served`); None while it still may meet them. The nearest-rank
    percentile of n values is its ceil(at% of n)-th smallest: once n less that rank, plus one, exceed
    the target, so does it. The count needed grows with n, so the answered ones alone show the miss
    as well (one-token answers, which have no TPOT, only lower it)."""
    enough = total - _rank(at / 100, total) + 1
    answered = list(served)
    for name, target, values in (("TTFT", max_ttft_ms, [s.ttft_ms for s in answered]),
                                 ("TPOT", max_tpot_ms, [s.tpot_ms for s in answered])):  # fmt: skip
        if target is None:
            continue
        missed = sum(value is not None and value > target for value in values)
        if missed >= enough:
            return f"{missed} of its {total} requests had {name} above {target:g} ms, so p{at} {name} misses it"
    return None


SERVED_FIGURES = ("ttft_ms", "tpot_ms", "output_tokens_per_s")  # what one pass over the requests (a round) gives


def pass_figures(served: list[Served]) -> dict[str, float]:
    """One pass's figures, a served job's round: mean TTFT and TPOT over its requests (as the run's
    own are), and its output tokens per second."""
    tpot = [t for t in (s.tpot_ms for s in served) if t is not None]
    return {
        "ttft_ms": statistics.fmean(s.ttft_ms for s in served),
        "tpot_ms": statistics.fmean(tpot) if tpot else float("nan"),
        "output_tokens_per_s": sum(len(s.tokens) for s in served) / _span_s(served),
    }


def serving_metrics(passes: list[list[Served]], max_in_flight: int, max_ttft_ms: float | None,
                    max_tpot_ms: float | None, verdicts: list[list[bool]] | None = None) -> dict[str, float]:  # fmt: skip
    """The run's figures over its passes (each serves every request once): means and p50/p90/p99 per
    request, pooled; throughput and goodput over the passes' spans together; requests, tokens and
    span per pass. `verdicts`, per pass per request, whether its answer was right, where the workload
    judged every one: goodput of right answers beside goodput."""
    served = [s for one_pass in passes for s in one_pass]
    span_s = sum(_span_s(one_pass) for one_pass in passes)
    ttft = [s.ttft_ms for s in served]
    tpot = [t for t in (s.tpot_ms for s in served) if t is not None]
    itl = [gap for s in served for gap in s.itl_ms()]
    e2e = [s.e2e_ms for s in served]
    queue = [s.queue_ms for s in served]
    metrics = {
        "served_requests": len(served) / len(passes),
        "max_in_flight": float(max_in_flight),
        "ttft_ms": statistics.fmean(ttft),
        "tpot_ms": statistics.fmean(tpot) if tpot else float("nan"),
        "e2e_ms": statistics.fmean(e2e),
        "queue_ms": statistics.fmean(queue),
        "output_tokens_per_s": sum(len(s.tokens) for s in served) / span_s,
        "requests_per_s": len(served) / span_s,
        "new_tokens": sum(len(s.tokens) for s in served) / len(passes),
        "serve_span_ms": span_s * 1e3 / len(passes),
    }
    with_intervals(metrics, {"ttft_ms": ttft, "tpot_ms": tpot})  # over requests
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2e", e2e), ("queue", queue)):
        for share in PERCENTILES:
            metrics[f"{name}_p{share}_ms"] = percentile(values, share / 100)
    if max_ttft_ms is not None or max_tpot_ms is not None:
        met = [s.meets(max_ttft_ms, max_tpot_ms) for s in served]
        metrics["goodput_requests_per_s"] = sum(met) / span_s
        metrics["within_targets"] = sum(met) / len(served)
        if verdicts is not None:  # the workload judged every answer: goodput counts the right ones only
            right = [m and v for m, v in zip(met, (v for one_pass in verdicts for v in one_pass))]
            metrics["goodput_correct_requests_per_s"] = sum(right) / span_s
            metrics["correct_within_targets"] = sum(right) / len(served)
    return metrics


def request_rows(passes: list[list[Served]], verdicts: list[list[bool]] | None, max_ttft_ms: float | None,
                 max_tpot_ms: float | None) -> list[dict]:  # fmt: skip
    """Every request of every pass as it was served, compact enough for result.json: its times in ms
    from its pass's first arrival (arrival, admission by the server, first token, end), its figures,
    its tokens and the gaps between them, its prompt tokens served from cache (None where its server
    does not count them), whether it met the latency targets (None: none set) and
    whether its answer was right (None: the workload judges no answers). Any percentile of the run
    can be read back from these rows."""
    rows = []
    for number, one_pass in enumerate(passes):
        zero = min(s.arrival_s for s in one_pass)
        judged = verdicts[number] if verdicts is not None else [None] * len(one_pass)
        for index, (s, right) in enumerate(zip(one_pass, judged)):
            targets = None if max_ttft_ms is None and max_tpot_ms is None else s.meets(max_ttft_ms, max_tpot_ms)
            rows.append({
                "pass": number, "request": index,
                "arrival_ms": _ms(s.arrival_s - zero), "admitted_ms": _ms(s.started_s - zero),
                "first_token_ms": _ms(s.token_s[0] - zero), "end_ms": _ms(s.finished_s - zero),
                "ttft_ms": _ms(s.ttft_ms / 1e3), "tpot_ms": None if s.tpot_ms is None else _ms(s.tpot_ms / 1e3),
                "e2e_ms": _ms(s.e2e_ms / 1e3), "queue_ms": _ms(s.queue_ms / 1e3),
                "prompt_tokens": s.prompt_tokens, "output_tokens": len(s.tokens), "prefix_hit_tokens": s.prefix_hit_tokens,
                "itl_ms": [_ms(gap / 1e3) for gap in s.itl_ms()],
                "within_targets": targets, "correct": right,
            })  # fmt: skip
    return rows


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)


def arrival_figures(arrivals: list[float]) -> dict[str, float]:
    """The offered load as its arrivals were scheduled (seconds from the start): the gaps' coefficient
    of variation, stdev / mean of the gaps between successive arrivals (1 for Poisson, 1/sqrt(k) for
    gamma gaps of shape k: vLLM's burstiness), and the rate realised, gaps per second of their sum
    (1 / the mean gap). Nothing for fewer than 3 distinct times: no spread to measure."""
    if len(set(arrivals)) < 3:
        return {}
    ordered = sorted(arrivals)
    gaps = [b - a for a, b in zip(ordered, ordered[1:])]
    mean_gap = statistics.fmean(gaps)
    return {"arrival_gap_cv": statistics.stdev(gaps) / mean_gap, "arrival_rate_per_s": 1.0 / mean_gap}


def _span_s(served: list[Served]) -> float:
    """A pass's span: its first arrival to its last token."""
    return max(max(s.finished_s for s in served) - min(s.arrival_s for s in served), 1e-9)
