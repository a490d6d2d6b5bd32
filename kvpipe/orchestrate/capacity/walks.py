"""One cache's walk: which load to measure next, given what the last point measured. `RateWalk` is
`kvpipe capacity`'s (every request at once for the ceiling, then the rate search of rates.py);
`ConcurrencyWalk` is `kvpipe advise --objective throughput|goodput`'s (concurrency upward while
throughput grows and the limits hold). Each says its next point as load overrides, or None when done."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from kvpipe.decide.capacity import Point, Targets, Verdict, judged, verdict, what_binds
from kvpipe.decide.limits import LIMITS, Limits
from kvpipe.orchestrate.capacity.rates import NEAR, next_rate

# a level must add more throughput than this share to be worth the next one: served runs of one pass
# differ by a few percent from run to run on an idle 2-core machine
MIN_GAIN = 0.05


@dataclass
class Figures:
    """What a launched point measured (metrics by name), or why it has none; `where`: its job or run."""

    metrics: dict[str, float] | None
    failure: str = ""
    where: str = ""


ANSWERS_BIND = 2  # rates in a row missed on accuracy alone, every latency target met: no lower rate is searched


class RateWalk:
    """The highest request rate a cache carries within the targets (kvpipe.orchestrate.capacity.rates)."""

    def __init__(self, cache: str, targets: Targets, resolution: float, requests: int, memory_requests: int | None):
        self.cache, self.targets, self.resolution, self.requests = cache, targets, resolution, requests
        self.memory_requests = memory_requests
        self.ceiling: float | None = None  # requests/s with every request at once
        self.ceiling_failure = ""
        self.points: list[Point] = []
        self.met = self.missed = None
        self.near = False  # the lowest rate that missed missed by less than NEAR (rates.py)
        # rates in a row, from the ceiling down, that missed on accuracy alone: at ANSWERS_BIND the
        # answers, not the traffic, bind, and a lower rate is not searched
        self.accuracy_misses = 0

    def next_load(self) -> tuple[str, list[str]] | None:
        """(what the point is, its load overrides), or None when the search is done."""
        if self.ceiling_failure:
            return None
        if self.ceiling is None:
            return "every request at once", ["load=offline", f"load.requests={self.requests}"]
        if self.accuracy_misses >= ANSWERS_BIND:
            return None
        rate = next_rate(self.met, self.missed, self.ceiling, self.resolution, self.near)
        if rate is None:
            return None
        return f"{rate:g}/s", ["load=rate", f"load.rate={rate:g}", f"load.requests={self.requests}"]

    def tell(self, figures: Figures) -> Point | None:
        """Take a point's figures; returns it judged (None for the ceiling's)."""
        if self.ceiling is None:
            rate = (figures.metrics or {}).get("requests_per_s", math.nan)
            if figures.metrics is None or not rate > 0:
                self.ceiling_failure = figures.failure or "no requests per second measured"
            else:
                self.ceiling = rate
            return None
        rate = next_rate(self.met, self.missed, self.ceiling, self.resolution, self.near)
        point = judged(rate, figures.metrics, figures.failure, self.targets, self.memory_requests)
        self.points.append(point)
        if point.meets:
            self.met = rate
        else:
            self.missed = rate
            self.near = near_miss(point)
        answers_alone = not point.meets and point.misses and all(m.unit == "accuracy" for m in point.misses)
        self.accuracy_misses = self.accuracy_misses + 1 if answers_alone and self.met is None else 0
        return point

    def verdict(self) -> Verdict:
        if self.ceiling_failure:
            binds, why = what_binds(Point(math.inf, None, self.ceiling_failure))
            return Verdict(
                self.cache, None, None, None, binds, f"with every request at once: {why}", self.memory_requests
            )
        found = verdict(self.cache, self.points, self.ceiling, self.memory_requests)
        if self.accuracy_misses >= ANSWERS_BIND:
            why = f"{found.why}; it missed on accuracy alone at {ANSWERS_BIND} rates in a row: the answers, not the traffic, bind, and lower rates were not searched"  # fmt: skip
            return dataclasses.replace(found, why=why)
        return found

    def as_dict(self) -> dict:
        return {**self.verdict().as_dict(), "rates": [p.rate for p in self.points],
                "met": [p.meets for p in self.points]}  # fmt: skip


def near_miss(point: Point) -> bool:
    """Whether a point missed only latency targets (TTFT, TPOT, goodput's share), each by less than
    NEAR: the rate that meets is likely close below. Memory and accuracy change little with the rate:
    a cache that misses them steps down by half, as one that failed."""
    latency = ("ms", "share")
    return bool(point.misses) and all(m.unit in latency and m.over < NEAR for m in point.misses)


def walk_limits(limits: Limits) -> Limits:
    """The limits a concurrency level can break: every one but quality's (a cache's quality does not
    change with how many requests it serves at once)."""
    return Limits(**{limit.key: None if limit.quality else limits[limit.name] for limit in LIMITS})


def limit_row(metrics: dict[str, float]) -> dict[str, float]:
    """A point's figures as the columns kvpipe.decide.limits reads of a recorded run."""
    from kvpipe import catalogue

    known = catalogue.catalogue()
    row = {known[name].column: value for name, value in metrics.items() if name in known}
    row["memory_bytes"] = metrics.get("peak_memory_bytes", math.nan)  # weights included, as runs.with_derived's
    return row


class ConcurrencyWalk:
    """Concurrency upward along `levels` while the objective grows by more than MIN_GAIN and the limits
    hold: the walk stops at the first level that misses a limit or adds no throughput."""

    def __init__(self, cache: str, levels: list[int], limits: Limits, figure: str):
        self.cache, self.levels, self.limits, self.figure = cache, levels, walk_limits(limits), figure
        self.measured: list[tuple[int, float]] = []  # (level, its objective)
        self.stopped = ""

    def next_load(self) -> tuple[str, list[str]] | None:
        if self.stopped or len(self.measured) == len(self.levels):
            return None
        level = self.levels[len(self.measured)]
        return f"concurrency {level}", ["load=concurrency", f"load.concurrency={level}"]

    def tell(self, figures: Figures) -> None:
        level = self.levels[len(self.measured)]
        value = (figures.metrics or {}).get(self.figure, math.nan)
        if value != value:  # goodput needs targets: without them, throughput says whether a level adds any
            value = (figures.metrics or {}).get("output_tokens_per_s", math.nan)
        best = max((v for _, v in self.measured), default=None)
        self.measured.append((level, value))
        if figures.metrics is None:
            self.stopped = f"concurrency {level} failed: {figures.failure}"
        elif missed := self.limits.misses(limit_row(figures.metrics)):
            self.stopped = f"concurrency {level} misses {' and '.join(missed)}"
        elif best is not None and not value > best * (1 + MIN_GAIN):
            self.stopped = (
                f"concurrency {level} adds no {self.figure} beyond {MIN_GAIN:.0%} ({value:.3g} vs {best:.3g})"
            )
        elif (
            len(self.measured) < len(self.levels)
            and (requests := figures.metrics.get("served_requests", math.inf)) <= level
        ):
            # a higher level would keep no more in flight: the same setup, measured again
            higher = self.levels[len(self.measured)]
            self.stopped = (
                f"only {requests:.0f} requests: concurrency {higher} would keep at most {requests:.0f} in flight"
            )

    def as_dict(self) -> dict:
        return {"cache": self.cache, "levels": [level for level, _ in self.measured], "stopped": self.stopped}
