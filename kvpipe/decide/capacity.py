"""Judging a capacity search (`kvpipe capacity`): whether one measured rate meets the latency targets
at their percentile (and the accuracy floor, where the workload judges answers), and per cache the
verdict: the highest rate carried, the lowest rate above it that failed (its resolution), and what
binds there: TTFT, TPOT, the share of requests within targets, accuracy, or memory (the point ran
out, or plan's memory-bound capacity is below the requests it held in flight)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvpipe import workload
from kvpipe.errors import ConfigError
from kvpipe.load import PERCENTILES  # what a served job records per request (kvpipe.measure.request_figures)
from kvpipe.units import counted

# what a point's failure says when the cache ran out of memory (torch's, transformers' and the OS's words)
OUT_OF_MEMORY = ("out of memory", "outofmemory", "cannot allocate memory", "memoryerror", "no free blocks")
THROUGHPUT = "throughput"  # binds where the cache met the targets at the most it serves at all
NOTHING = "nothing"  # binds where no rate was measured


def _positive(field_name: str, value: float | None) -> float | None:
    if value is not None and not (isinstance(value, int | float) and value > 0 and math.isfinite(value)):
        raise ConfigError(field_name, value, "expected a positive number of milliseconds, e.g. 2000")
    return value


@dataclass(frozen=True)
class Targets:
    """The latency targets a rate must meet at `percentile` of its requests (TTFT from arrival, TPOT
    after the first token), and optionally the share of requests within both (goodput's share) and
    the share of answers right (the workload's own accuracy, over every request served there)."""

    max_ttft_ms: float | None = None
    max_tpot_ms: float | None = None
    percentile: int = 90
    min_goodput: float | None = None
    min_accuracy: float | None = None
    max_accuracy_drop: float | None = None  # below the full-precision answers' accuracy on the same prompts
    reference_accuracy: float | None = None  # theirs, once a ceiling's quality pass has measured it

    def check(self, prefix: str = "--") -> Targets:
        """Itself, or a one-line ConfigError naming the flag (prefix '--') or field (prefix 'hydra.sweeper.')."""
        name = lambda flag: prefix + (flag.replace("_", "-") if prefix == "--" else flag)  # noqa: E731
        _positive(name("max_ttft_ms"), self.max_ttft_ms)
        _positive(name("max_tpot_ms"), self.max_tpot_ms)
        if self.max_ttft_ms is None and self.max_tpot_ms is None:
            raise ConfigError(name("max_ttft_ms"), None, f"expected a target: {name('max_ttft_ms')} and/or "
                              f"{name('max_tpot_ms')}, positive milliseconds")  # fmt: skip
        if self.percentile not in PERCENTILES:
            raise ConfigError(name("percentile"), self.percentile, "expected one of "
                              f"{', '.join(map(str, PERCENTILES))}: the percentiles a served job records")  # fmt: skip
        if self.min_goodput is not None and not 0 < self.min_goodput <= 1:
            raise ConfigError(name("min_goodput"), self.min_goodput,
                              "expected the share of requests within the targets, above 0 and at most 1, e.g. 0.95")  # fmt: skip
        if self.min_accuracy is not None and not 0 < self.min_accuracy <= 1:
            raise ConfigError(name("min_accuracy"), self.min_accuracy,
                              "expected the share of answers right, above 0 and at most 1, e.g. 0.8")  # fmt: skip
        if self.max_accuracy_drop is not None and not 0 <= self.max_accuracy_drop < 1:
            raise ConfigError(name("max_accuracy_drop"), self.max_accuracy_drop, "expected the accuracy a cache may "
                              "lose against full precision, 0 or more and below 1, e.g. 0.05")  # fmt: skip
        return self

    @property
    def judges_accuracy(self) -> bool:
        return self.min_accuracy is not None or self.max_accuracy_drop is not None

    def accuracy_floor(self) -> float:
        """The accuracy a rate must keep: --min-accuracy, or full precision's less --max-accuracy-drop,
        the higher of the two; NaN while the drop's reference is not measured."""
        floors = [] if self.min_accuracy is None else [self.min_accuracy]
        if self.max_accuracy_drop is not None:
            if self.reference_accuracy is None:
                return math.nan
            floors.append(self.reference_accuracy - self.max_accuracy_drop)
        return max(floors)

    def _floor_words(self) -> str:
        """'80%', or '79% (full precision's 89% less 10%)'."""
        floor = self.accuracy_floor()
        if floor != floor:
            return "full precision's, not measured"
        if self.max_accuracy_drop is None or floor == self.min_accuracy:
            return f"{floor:.0%}"
        return f"{floor:.0%} (full precision's {self.reference_accuracy:.0%} less {self.max_accuracy_drop:.0%})"

    def describe(self) -> str:
        """'TTFT p90 ≤ 2000 ms · TPOT p90 ≤ 150 ms · goodput ≥ 95% of requests'."""
        parts = [f"{what} p{self.percentile} ≤ {target:g} ms" for what, target in self._latencies()]
        if self.min_goodput is not None:
            parts.append(f"goodput ≥ {self.min_goodput:.0%} of requests")
        if self.min_accuracy is not None:
            parts.append(f"accuracy ≥ {self.min_accuracy:.0%}")
        if self.max_accuracy_drop is not None:
            parts.append(f"accuracy ≥ full precision's less {self.max_accuracy_drop:.0%}")
        return " · ".join(parts)

    def _latencies(self) -> list[tuple[str, float]]:
        return [(what, target) for what, target in (("TTFT", self.max_ttft_ms), ("TPOT", self.max_tpot_ms))
                if target is not None]  # fmt: skip

    def misses(self, metrics: dict[str, float]) -> list[Miss]:
        """The targets a point's figures (by metric name: ttft_p90_ms, within_targets, ...) miss."""
        missed = []
        for what, target in self._latencies():
            value = metrics.get(f"{what.lower()}_p{self.percentile}_ms", math.nan)
            if not value <= target:  # NaN (not measured) misses too
                missed.append(Miss(f"{what} p{self.percentile}", value, target, "ms"))
        share = metrics.get("within_targets", math.nan)
        if self.min_goodput is not None and not share >= self.min_goodput:
            missed.append(Miss("goodput", share, self.min_goodput, "share", minimum=True))
        if self.judges_accuracy:
            accuracy, interval = accuracy_of(metrics)
            floor = self.accuracy_floor()
            if not accuracy >= floor:  # NaN either side (not measured) misses too
                missed.append(Miss("accuracy", accuracy, floor, "accuracy", minimum=True, interval=interval,
                                   floor=self._floor_words()))  # fmt: skip
        return missed


def accuracy_of(metrics: dict[str, float]) -> tuple[float, tuple[float, float] | None]:
    """The workload's own accuracy at a point (task, retrieval or RULER accuracy: the one it measured),
    with its 95% interval where it has one; NaN where it measured none."""
    for quality in workload.quality_metrics().values():
        name = quality.metric.name
        value = metrics.get(name)
        if value is not None and value == value:
            low, high = metrics.get(f"{name}_ci_low"), metrics.get(f"{name}_ci_high")
            return value, (low, high) if low is not None and high is not None else None
    return math.nan, None


@dataclass(frozen=True)
class Miss:
    """One target a point missed: what, the measured figure, the target."""

    what: str  # "TTFT p90", "TPOT p90", "goodput", "accuracy"
    measured: float
    target: float
    unit: str  # "ms", "share" (of requests), "accuracy" or "requests" (in flight)
    minimum: bool = False  # a figure that must reach the target, not stay under it
    interval: tuple[float, float] | None = None  # the measured figure's 95% interval, where it has one
    floor: str = ""  # how an accuracy floor came about, in words ("79% (full precision's 89% less 10%)")

    @property
    def over(self) -> float:
        """How far past the target, relative (0.2: 20% over; for a minimum, 20% short)."""
        if self.measured != self.measured or self.target != self.target:
            return math.inf
        return 1 - self.measured / self.target if self.minimum else self.measured / self.target - 1

    def text(self) -> str:
        """'TTFT p90 2410 ms > 2000 ms (+21%)' or 'goodput 80% < 95% of requests'."""
        if self.unit == "requests":
            return f"{counted(self.measured, 'request')} in flight; plan's memory bound is {self.target:,.0f}"
        if self.unit == "share":
            return f"{self.what} {self.measured:.0%} < {self.target:.0%} of requests"
        if self.unit == "accuracy":
            if self.measured != self.measured:
                return "accuracy not measured: the workload judged no answers"
            between = f" ({self.interval[0]:.0%}–{self.interval[1]:.0%})" if self.interval else ""
            return f"accuracy {self.measured:.0%}{between} < {self.floor or format(self.target, '.0%')}"
        return f"{self.what} {self.measured:.0f} ms > {self.target:g} ms (+{self.over:.0%})"


@dataclass
class Point:
    """One measured rate of one cache: its figures by metric name, or why it has none."""

    rate: float
    metrics: dict[str, float] | None = None
    failure: str = ""
    misses: list[Miss] = field(default_factory=list)

    @property
    def meets(self) -> bool:
        return self.metrics is not None and not self.misses

    @property
    def out_of_memory(self) -> bool:
        return self.metrics is None and any(word in self.failure.lower() for word in OUT_OF_MEMORY)


def judged(rate: float, metrics: dict[str, float] | None, failure: str, targets: Targets,
           memory_requests: int | None = None) -> Point:  # fmt: skip
    """A point with the targets it misses; one that held more requests in flight than plan's
    memory-bound capacity misses memory too (this machine had room, the budget would not)."""
    if metrics is None:
        return Point(rate, None, failure)
    misses = targets.misses(metrics)
    in_flight = metrics.get("max_in_flight")
    if memory_requests is not None and in_flight is not None and in_flight > memory_requests:
        misses.insert(0, Miss("memory", in_flight, memory_requests, "requests"))
    return Point(rate, metrics, failure, misses)


@dataclass
class Verdict:
    """Per cache: the rate it carries within the targets, the failing rate above it, what binds."""

    cache: str
    max_throughput: float | None  # requests/s with every request at once: the search's ceiling
    carried: Point | None  # the highest rate that met every target
    failing: Point | None  # the lowest rate above it that did not: the answer's resolution
    binds: str  # TTFT, TPOT, goodput, accuracy, memory, throughput (met at its ceiling) or nothing (none measured)
    why: str  # by how much, in words
    memory_requests: int | None  # plan's memory-bound capacity: requests of the workload's size in flight

    @property
    def rate(self) -> float:
        return self.carried.rate if self.carried else 0.0

    def as_dict(self) -> dict:
        return {
            "cache": self.cache, "rate": self.rate, "max_throughput": self.max_throughput,
            "failing_rate": self.failing.rate if self.failing else None, "binds": self.binds, "why": self.why,
            "goodput_requests_per_s": goodput(self.carried), "memory_requests": self.memory_requests,
            "goodput_correct_requests_per_s": goodput(self.carried, "goodput_correct_requests_per_s"),
            "accuracy": self.accuracy, "accuracy_interval": self.accuracy_interval,
            "kv_bytes_per_request": self.kv_bytes_per_request,
        }  # fmt: skip

    @property
    def kv_bytes_per_request(self) -> float | None:
        """At the rate carried, the KV cache's peak bytes over the most requests in flight then: what a
        request in flight held (a paged cache's blocks; kvpipe's other caches their tensors) or was
        given (an engine's cache, allocated whole at start); None where not measured."""
        metrics = self.carried.metrics if self.carried and self.carried.metrics else {}
        held = next((v for v in (metrics.get("kv_held_bytes"), metrics.get("kv_cache_bytes")) if v == v and v), None)
        in_flight = metrics.get("max_in_flight")
        return held / in_flight if held and in_flight else None

    @property
    def accuracy(self) -> float | None:
        """The workload's own accuracy at the rate carried, where it judged answers there."""
        value = accuracy_of(self.carried.metrics)[0] if self.carried and self.carried.metrics else math.nan
        return None if value != value else value

    @property
    def accuracy_interval(self) -> list[float] | None:
        """Its 95% interval, where the workload gives one."""
        interval = accuracy_of(self.carried.metrics)[1] if self.carried and self.carried.metrics else None
        return list(interval) if interval else None


def goodput(point: Point | None, metric: str = "goodput_requests_per_s") -> float | None:
    """The requests per second within both targets at a point (with goodput_correct_requests_per_s,
    those that answered right too), where measured."""
    if point is None or point.metrics is None:
        return None
    value = point.metrics.get(metric)
    return None if value is None or value != value else value


def verdict(cache: str, points: list[Point], max_throughput: float | None, memory_requests: int | None) -> Verdict:
    """The verdict from a cache's measured rates (each judged against the targets)."""
    met = [p for p in points if p.meets]
    carried = max(met, key=lambda p: p.rate) if met else None
    above = [p for p in points if not p.meets and (carried is None or p.rate > carried.rate)]
    failing = min(above, key=lambda p: p.rate) if above else None
    if carried is None and failing is None:
        return Verdict(cache, max_throughput, None, None, NOTHING, "no rate was measured", memory_requests)
    if failing is None:
        why = f"meets the targets at {carried.rate:.3g}/s, the most it serves with every request at once"
        return Verdict(cache, max_throughput, carried, None, THROUGHPUT, why, memory_requests)
    binds, why = what_binds(failing)
    if carried is None:
        why = f"misses even at {failing.rate:.3g}/s, the lowest rate tried: {why}"
    return Verdict(cache, max_throughput, carried, failing, binds, why, memory_requests)


def what_binds(failing: Point) -> tuple[str, str]:
    """(what binds, by how much) at the first failing rate: memory where the cache ran out, or held
    more requests in flight than plan's memory bound; else the target it missed by most."""
    if failing.metrics is None:
        return ("memory" if failing.out_of_memory else "failure"), failing.failure or "the point failed"
    memory = [miss for miss in failing.misses if miss.unit == "requests"]
    worst = memory[0] if memory else max(failing.misses, key=lambda miss: miss.over)
    return worst.what.split(" ")[0], f"{worst.text()} at {failing.rate:.3g}/s"


def most_carried(verdicts: list[Verdict]) -> Verdict | None:
    """The cache that carries the highest rate (None where none carries any)."""
    carrying = [v for v in verdicts if v.carried is not None]
    return max(carrying, key=lambda v: v.rate) if carrying else None
