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
from kvpipe.job.progress_bar import progress_bar
from kvpipe.measure.round_figures import STOPPING_FIGURE, converged, relative_half_width, rounds_of
from kvpipe.units import duration_text

log = logging.getLogger(__name__)


class RoundTaker:
    """What takes part in rounds: a job, or a test's stand-in. It keeps its figures round by round
    and knows, from its workload's settings (`timing`: repeats, and repeats=auto's target_interval,
    max_repeats and max_measure_s), whether it wants another; a subclass measures a round
    (`measure_round`, which calls `add_round`) and says how many calls a round makes."""

    calls_per_round: int

    def __init__(self, label: str, timing, figures: tuple[str, ...]):
        self.label = label  # a sweep names its jobs by number instead
        self.timing = timing
        self.auto = timing.repeats == "auto"
        self.fixed_rounds: int | None = None if self.auto else int(timing.repeats)
        self.per_round: dict[str, list[float]] = {name: [] for name in figures}
        self.failed: BaseException | None = None  # what stopped it mid-round: it takes no further part

    def measure_round(self, advance) -> None:
        raise NotImplementedError

    def add_round(self, figures: dict[str, float]) -> None:
        for name, values in self.per_round.items():
            values.append(figures[name])

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
    """What ran: each round's order (indices into the jobs) and wall seconds."""

    orders: list[list[int]] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    def drift(self) -> list[float]:
        """Each round's time against the first's, as a fraction (+0.3: 30% slower)."""
        first = self.seconds[0] if self.seconds else 0.0
        return [s / first - 1 if first else float("nan") for s in self.seconds]

    def to_dict(self, labels: list[str]) -> dict:
        return {
            "jobs": labels,
            "orders": self.orders,
            "seconds": [round(s, 4) for s in self.seconds],
            "drift": [round(d, 4) for d in self.drift()],
        }


def run_rounds(jobs: list[RoundTaker], seed: int, shuffle: bool) -> Rounds:
    """Measure rounds until every job has what it wants; shuffle: a fresh order each round."""
    draw = random.Random(seed)
    rounds = Rounds()
    measured_s = [0.0] * len(jobs)
    taken = [0] * len(jobs)  # the rounds each took part in here: measured_s over them is its round's cost
    known = all(job.fixed_rounds is not None for job in jobs)
    total = sum(job.fixed_rounds * job.calls_per_round for job in jobs) if known else None
    label = jobs[0].label if len(jobs) == 1 else f"{len(jobs)} jobs, interleaved"
    kill_points.reached("before_rounds")
    with progress_bar(label, total) as advance:
        while True:
            wanted = _wanting(jobs, measured_s)
            if not wanted:
                break
            if any(job.rounds_done() for job in jobs):
                kill_points.reached("between_rounds")
            order = list(wanted)
            if shuffle:
                draw.shuffle(order)
            started = time.perf_counter()
            for index in order:
                began = time.perf_counter()
                try:
                    jobs[index].measure_round(advance)
                except Exception as exc:  # noqa: BLE001 - one job's failure is its own; the others go on
                    log.error("%s failed in round %d: %s", jobs[index].label, len(rounds.seconds) + 1, exc)
                    jobs[index].failed = exc
                measured_s[index] += time.perf_counter() - began
                taken[index] += 1
            rounds.seconds.append(time.perf_counter() - started)
            rounds.orders.append(order)
            if len(jobs) > 1:
                drift = rounds.drift()[-1]
                log.info(
                    "round %d: %.2f s, %+.0f%% on the first; order %s%s",
                    len(rounds.seconds), rounds.seconds[-1], 100 * drift,
                    " ".join(jobs[i].label for i in order), _left_text(jobs, measured_s, taken),
                )  # fmt: skip
    return rounds


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
