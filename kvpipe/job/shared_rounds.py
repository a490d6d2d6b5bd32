"""Measured rounds: each round calls every job once (every batch of a batch job, one pass over a
served job's requests), in an order shuffled per round from the seed where jobs take turns (a
sweep's interleaved jobs), so that a machine whose speed drifts slows each job alike instead of the
one that happened to run late (google-benchmark's random interleaving). A job alone is the same loop
with one job: its repeats are its rounds.

A job says how many rounds it wants: `workload.repeats` of them, or with repeats=auto at least
MIN_ROUNDS (kvpipe.measure.round_figures) and then more until its TPOT interval is within
`workload.target_interval`, or it reaches `workload.max_repeats` rounds or `workload.max_measure_s` seconds of them. Jobs on auto
keep taking part until every one of them is done, so that each pair shares as many rounds as it can.
"""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import dataclass, field

from kvpipe import kill_points
from kvpipe.errors import require_choice
from kvpipe.job.progress_bar import progress_bar
from kvpipe.measure import contention
from kvpipe.measure.round_figures import (
    CALL_FIGURES,
    DECIDE_WITHIN,
    MIN_ROUNDS,
    STOPPING_FIGURE,
    converged,
    decided,
    firmness_note,
    relative_half_width,
    rounds_of,
)
from kvpipe.measure.uncertainty import ratio_interval
from kvpipe.units import duration_text

log = logging.getLogger(__name__)

TURNS = ("call", "pass")  # what takes a turn in a sweep: one measured call, or a job's whole pass


def check_turn(turn: str) -> str:
    """hydra.launcher.turn, checked at the sweep's door."""
    require_choice("hydra.launcher.turn", turn, TURNS)
    return turn


class RoundTaker:
    """What takes part in rounds: a job, or a test's stand-in. It keeps its figures round by round
    and call by call, and knows, from its workload's settings (`timing`: repeats, and repeats=auto's
    target_interval, max_repeats and max_measure_s), whether it wants another; a subclass measures a
    round (`measure_round`, which calls `add_round`) and, where its round can be cut into calls
    (`call_keys`), one call of it (`measure_call`)."""

    calls_per_round: int
    threads = 1  # the torch threads a call asks cores for (a job's, once prepared)
    on_cpu = True  # its own cores count in a slot's contention only on CPU
    turn = "pass"  # what its turns were: "call" where a sweep took them call by call
    compare_baseline = False  # whether compare's default baseline names it (the dynamic cache)

    def __init__(self, label: str, timing, figures: tuple[str, ...]):
        self.label = label  # a sweep names its jobs by number instead
        self.timing = timing
        self.auto = timing.repeats == "auto"
        self.fixed_rounds: int | None = None if self.auto else int(timing.repeats)
        self.per_round: dict[str, list[float]] = {name: [] for name in figures}
        self.per_call: dict[str, list[float]] = {name: [] for name in CALL_FIGURES}  # as measured
        self.call_kept: list[bool] = []  # per call: False where other processes held a core in its turn
        self.call_first: list[bool] = []  # whether it went first in each call's turn
        self.excluded_calls = 0  # calls taken while other processes held a core: out of every estimate
        self.stopped_by: str | None = None  # a sweep on repeats=auto: why its turns ended
        self.paired_note: str | None = None  # where its own figure is less firm than its paired ratio
        self.failed: BaseException | None = None  # what stopped it mid-round: it takes no further part

    def measure_round(self, advance) -> None:
        raise NotImplementedError

    def call_keys(self) -> list:
        """What each call of a round is (a batch's shape and prompt): calls of two jobs pair where
        their keys match. One key by default: a round that cannot be cut into calls is one turn."""
        return ["pass"]

    def measure_call(self, index: int, advance) -> None:
        """The round's call `index`, in call order; the last one closes the round (`add_round`)."""
        self.measure_round(advance)
        self.call_is_round()

    def call_is_round(self) -> None:
        """Its last round, one turn, as its call: a pass that cannot be cut into calls pairs pass by pass."""
        self.add_call({name: self.per_round[name][-1] for name in CALL_FIGURES if name in self.per_round})

    def close_round(self) -> None:
        """After a round's last call and the verdict on it: a job that keeps its calls sums them up."""

    def add_round(self, figures: dict[str, float]) -> None:
        for name, values in self.per_round.items():
            values.append(figures[name])

    def add_call(self, figures: dict[str, float]) -> None:
        for name, values in self.per_call.items():
            values.append(figures.get(name, math.nan))
        self.call_kept.append(True)

    def exclude_last_call(self) -> None:
        """Its last call ran while other processes held a core: out of the paired estimate."""
        self.call_kept[-1] = False
        self.excluded_calls += 1

    def paired_calls(self) -> dict[str, list[float]]:
        """Its calls as the paired estimate reads them: NaN where left out as contended; every call
        where none was kept (every turn contended: no clean call to mix them with, and the run says so)."""
        if all(self.call_kept) or not any(self.call_kept):
            return self.per_call
        return {name: [v if keep else math.nan for v, keep in zip(values, self.call_kept)]
                for name, values in self.per_call.items()}  # fmt: skip

    def rounds_done(self) -> int:
        """Its rounds so far (a job with no warm-up measures its first as it prepares)."""
        return rounds_of(self.per_round)

    def wants_more(self, measured_s: float) -> bool:
        """Whether it needs another round: short of its repeats, or (auto) not yet converged and
        under its caps."""
        if not self.auto:
            return self.rounds_done() < self.fixed_rounds
        return self.may_go_on(measured_s) and not self.converged()

    def may_go_on(self, measured_s: float) -> bool:
        """Auto: whether it is under its caps (it takes part while another job on auto is not done)."""
        return self.rounds_done() < self.timing.max_repeats and measured_s < self.timing.max_measure_s

    def converged(self) -> bool:
        return converged(self.per_round, self.timing.target_interval)

    def not_converged_note(self) -> str:
        width = relative_half_width(self.per_round[STOPPING_FIGURE])
        return (
            f"repeats=auto stopped after {self.rounds_done()} rounds (workload.max_repeats={self.timing.max_repeats}, "
            f"workload.max_measure_s={self.timing.max_measure_s:g}) with TPOT within ±{width:.1%}, wider than "
            f"workload.target_interval={self.timing.target_interval:g}"
        )


@dataclass
class Rounds:
    """What ran: each round's order (indices into the jobs; turn=call: its first call's), wall
    seconds, each call's order (turn=call), the calls left out as contended, and why it stopped."""

    orders: list[list[int]] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    call_orders: list[list[list[int]]] = field(default_factory=list)
    excluded: list[list[int]] = field(default_factory=list)  # per round, the calls taken under others' load
    stopped_by: str | None = None

    def drift(self) -> list[float]:
        """Each round's time against the first's, as a fraction (+0.3: 30% slower)."""
        first = self.seconds[0] if self.seconds else 0.0
        return [s / first - 1 if first else float("nan") for s in self.seconds]

    def to_dict(self, labels: list[str]) -> dict:
        shown = {
            "jobs": labels,
            "orders": self.orders,
            "seconds": [round(s, 4) for s in self.seconds],
            "drift": [round(d, 4) for d in self.drift()],
        }
        if self.call_orders:
            shown.update(turn="call", call_orders=self.call_orders, excluded_calls=self.excluded)
        if self.stopped_by:
            shown["stopped_by"] = self.stopped_by
        return shown


class Counterbalanced:
    """Call turns' orders: a fresh order drawn from the seed, then its reverse (ABBA), so that over
    each pair of calls every job goes first as often as last and none is systematically first."""

    def __init__(self, seed: int):
        self.draw = random.Random(seed)
        self.last: list[int] = []
        self.taken = 0

    def next(self, taking: list[int]) -> list[int]:
        if self.taken % 2 == 0 or not self.last:
            order = list(taking)
            self.draw.shuffle(order)
        else:
            order = [i for i in reversed(self.last) if i in taking] + [i for i in taking if i not in self.last]
        self.last, self.taken = order, self.taken + 1
        return order


def run_rounds(jobs: list[RoundTaker], seed: int, shuffle: bool, turn: str = "pass", sampler=None) -> Rounds:
    """Measure rounds until every job has what it wants; shuffle: a fresh order each round.
    turn="call" (several jobs): each call of a round is a turn of its own, every job making that call
    in a counterbalanced order, with the machine sampled around it (`sampler`: kvpipe.measure.contention's
    by default) and the call left out of the paired estimate where other processes held a core."""
    draw, balanced = random.Random(seed), Counterbalanced(seed)
    by_call = turn == "call" and len(jobs) > 1
    sampler = sampler or contention.sample
    for job in jobs:
        job.turn = "call" if by_call else "pass"
    sweep_auto = by_call and all(job.auto for job in jobs)  # the sweep measures until its ratios decide
    rounds = Rounds()
    measured_s = [0.0] * len(jobs)
    taken = [0] * len(jobs)  # the rounds each took part in here: measured_s over them is its round's cost
    known = all(job.fixed_rounds is not None for job in jobs)
    total = sum(job.fixed_rounds * job.calls_per_round for job in jobs) if known else None
    label = jobs[0].label if len(jobs) == 1 else f"{len(jobs)} jobs, interleaved"
    kill_points.reached("before_rounds")
    with progress_bar(label, total) as advance:
        while True:
            wanted = _decided(jobs, measured_s, rounds) if sweep_auto else _wanting(jobs, measured_s)
            if not wanted:
                break
            if any(job.rounds_done() for job in jobs):
                kill_points.reached("between_rounds")
            started = time.perf_counter()
            if by_call:
                orders, excluded = _call_round(jobs, wanted, balanced, advance, sampler, measured_s)
                order = orders[0] if orders else []
                rounds.call_orders.append(orders)
                rounds.excluded.append(excluded)
            else:
                order = list(wanted)
                if shuffle:
                    draw.shuffle(order)
                for index in order:
                    _take(jobs[index], lambda job: job.measure_round(advance), measured_s, index)
            for index in order:
                taken[index] += 1
            rounds.seconds.append(time.perf_counter() - started)
            rounds.orders.append(order)
            if len(jobs) > 1:
                _log_round(jobs, rounds, measured_s, taken)
    if sweep_auto:
        _close_auto(jobs, rounds)
    base = jobs[baseline_of(jobs)]
    for job in [job for job in jobs if job is not base and job.failed is None] if by_call else []:
        job.paired_note = firmness_note(job.per_round[STOPPING_FIGURE], paired(job, base), base.label)
    return rounds


def paired(job: RoundTaker, baseline: RoundTaker) -> tuple[float, float, float]:
    """job's TPOT over baseline's, paired call by call where their calls match (the same keys, as
    many of them), else round by round: (ratio, low, high)."""
    calls_match = job.call_keys() == baseline.call_keys() and len(job.per_call[STOPPING_FIGURE]) == len(
        baseline.per_call[STOPPING_FIGURE]
    )
    by_call = calls_match and job.turn == "call"
    series = job.paired_calls() if by_call else job.per_round
    base = baseline.paired_calls() if by_call else baseline.per_round
    return ratio_interval(series[STOPPING_FIGURE], base[STOPPING_FIGURE], paired=True)


def baseline_of(jobs: list[RoundTaker]) -> int:
    """The job the sweep's paired ratios are against: the first that compare's default baseline
    names (the dynamic cache), else the first."""
    return next((i for i, job in enumerate(jobs) if job.compare_baseline), 0)


def _take(job: RoundTaker, measure, measured_s: list[float], index: int) -> None:
    """One turn of one job; a failure is its own, and the others go on."""
    began = time.perf_counter()
    try:
        measure(job)
    except Exception as exc:  # noqa: BLE001 - one job's failure is its own; the others go on
        log.error("%s failed in round %d: %s", job.label, job.rounds_done() + 1, exc)
        job.failed = exc
    measured_s[index] += time.perf_counter() - began


def _call_round(jobs, wanted, balanced, advance, sampler, measured_s) -> tuple[list[list[int]], list[int]]:
    """One round taken call by call: (each call's order, the calls left out as contended)."""
    keys = {index: jobs[index].call_keys() for index in wanted}
    orders, excluded = [], []
    for call in range(max(len(k) for k in keys.values())):
        taking = [i for i in wanted if call < len(keys[i]) and jobs[i].failed is None]
        if not taking:
            continue
        order = balanced.next(taking)
        before = sampler()
        for position, index in enumerate(order):
            _take(jobs[index], lambda job, call=call: job.measure_call(call, advance), measured_s, index)
            jobs[index].call_first.append(position == 0)
        threads = max(jobs[i].threads for i in order)
        if contention.slot_contended(before, sampler(), threads, all(jobs[i].on_cpu for i in order)):
            excluded.append(call)
            for index in order:
                if jobs[index].failed is None:
                    jobs[index].exclude_last_call()
        orders.append(order)
    for index in wanted:
        if jobs[index].failed is None:
            jobs[index].close_round()
    return orders, excluded


def _log_round(jobs: list[RoundTaker], rounds: Rounds, measured_s: list[float], taken: list[int]) -> None:
    drift = rounds.drift()[-1]
    order = " ".join(jobs[i].label for i in rounds.orders[-1])
    left_out = rounds.excluded[-1] if rounds.excluded else []
    excluded = f"; {len(left_out)} turn(s) of calls left out, taken under other processes' load" if left_out else ""
    log.info(
        "round %d: %.2f s, %+.0f%% on the first; order %s%s%s",
        len(rounds.seconds), rounds.seconds[-1], 100 * drift, order, excluded, _left_text(jobs, measured_s, taken),
    )  # fmt: skip


def _decided(jobs: list[RoundTaker], measured_s: list[float], rounds: Rounds) -> list[int]:
    """A sweep on repeats=auto: every live job while a paired TPOT ratio against the baseline
    (baseline_of) is not yet decided and the caps allow; [] (with rounds.stopped_by said) once it is
    or they do not. Without the baseline (it failed) each job's own rule decides."""
    alive = [i for i, job in enumerate(jobs) if job.failed is None]
    base = baseline_of(jobs)
    if len(alive) < 2 or base not in alive:
        return _wanting(jobs, measured_s)
    timing = jobs[base].timing
    within = getattr(timing, "decide_within", DECIDE_WITHIN)
    done = jobs[base].rounds_done()
    others = [i for i in alive if i != base]
    if done >= MIN_ROUNDS and all(decided(*paired(jobs[i], jobs[base]), within) for i in others):
        rounds.stopped_by = "decided"
    elif done >= timing.max_repeats:
        rounds.stopped_by = "max_repeats"
    elif sum(measured_s) >= timing.max_measure_s:
        rounds.stopped_by = "max_measure_s"
    return [] if rounds.stopped_by else alive


def _close_auto(jobs: list[RoundTaker], rounds: Rounds) -> None:
    timing = jobs[0].timing
    cap = {"max_repeats": f"workload.max_repeats={timing.max_repeats}",
           "max_measure_s": f"workload.max_measure_s={timing.max_measure_s:g}"}  # fmt: skip
    reason = rounds.stopped_by or "decided"
    for job in jobs:
        job.stopped_by = reason
    said = "every paired TPOT ratio decided" if reason == "decided" else f"reached {cap.get(reason, reason)}"
    log.info("repeats=auto: %d rounds, stopped: %s", len(rounds.seconds), said)


def _left_text(jobs: list[RoundTaker], measured_s: list[float], taken: list[int]) -> str:
    """' · 2 rounds left, ETA 4s': each job's mean round so far times the rounds it still wants.
    '' where a job is on repeats=auto, whose rounds end when its TPOT settles: not known ahead."""
    alive = [i for i, job in enumerate(jobs) if job.failed is None and taken[i]]
    if any(jobs[i].auto for i in alive):
        return ""
    wanted = {i: max(0, jobs[i].fixed_rounds - jobs[i].rounds_done()) for i in alive}
    if not any(wanted.values()):
        return ""
    seconds = sum(measured_s[i] / taken[i] * rounds for i, rounds in wanted.items())
    most = max(wanted.values())
    return f" · {most} round{'s' if most > 1 else ''} left, ETA {duration_text(math.ceil(seconds))}"


def _wanting(jobs: list[RoundTaker], measured_s: list[float]) -> list[int]:
    """The jobs the next round calls: fixed ones short of their repeats, and every job on auto
    under its caps while any of them is not done."""
    alive = [i for i, job in enumerate(jobs) if job.failed is None]
    fixed = [i for i in alive if not jobs[i].auto and jobs[i].wants_more(measured_s[i])]
    auto = [i for i in alive if jobs[i].auto]
    if any(jobs[i].wants_more(measured_s[i]) for i in auto):
        fixed += [i for i in auto if jobs[i].may_go_on(measured_s[i])]
    return sorted(fixed)
