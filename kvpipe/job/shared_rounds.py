"""Measured rounds: each round calls every job once (every batch of a batch job, one pass over a
served job's requests). Where jobs take turns (a sweep's interleaved jobs), each call is a turn of its
own, in a counterbalanced order (kvpipe.job.call_turns), or with turn="pass" each job's whole round is
one, in an order shuffled per round from the seed; so that a machine whose speed drifts slows each job
alike instead of the one that happened to run late (google-benchmark's random interleaving). A job
alone is the same loop with one job: its repeats are its rounds.

A job says how many rounds it wants: `workload.repeats` of them, or with repeats=auto at least
MIN_ROUNDS (kvpipe.measure.round_figures) and then more until its TPOT interval is within
`workload.target_interval`, or it reaches `workload.max_repeats` rounds or `workload.max_measure_s`
seconds of them. Jobs on auto keep taking part until every one of them is done, so that each pair
shares as many rounds as it can. A sweep taking turns by call with every job on auto goes on instead
until every paired TPOT ratio against its baseline is decided (`workload.decide_within`), under the
same caps.
"""

from __future__ import annotations

import functools
import logging
import math
import random
import time
from dataclasses import dataclass, field

from kvpipe import kill_points
from kvpipe.job.call_turns import (
    TURNS,
    Counterbalanced,
    QuietWaits,
    baseline_of,
    call_round,
    check_quiet_wait,
    check_turn,
    paired,
)  # fmt: skip
from kvpipe.job.progress_bar import progress_bar
from kvpipe.job.round_taker import RoundTaker, take_turn
from kvpipe.measure import contention
from kvpipe.measure.contention import QUIET_WAIT_S
from kvpipe.measure.round_figures import DECIDE_WITHIN, MIN_ROUNDS, STOPPING_FIGURE, decided, firmness_note
from kvpipe.units import counted, duration_text

log = logging.getLogger(__name__)

__all__ = ["QUIET_WAIT_S", "TURNS", "RoundTaker", "Rounds", "check_quiet_wait", "check_turn", "run_rounds"]


@dataclass
class Rounds:
    """What ran: each round's order (indices into the jobs; turn=call: its first call's), wall
    seconds (waits for quiet aside), each call's order (turn=call), the calls left out as contended,
    the seconds waited for quiet after them, and why it stopped."""

    orders: list[list[int]] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    call_orders: list[list[list[int]]] = field(default_factory=list)
    excluded: list[list[list[int]]] = field(default_factory=list)  # per round, [call, job] taken under others' load
    other_cores: list[list[list[float]]] = field(default_factory=list)  # per round and call, as call_orders
    waited_s: list[float] = field(default_factory=list)  # per round: waited for quiet after contended calls
    stopped_by: str | None = None
    baseline: int | None = None  # the job the paired ratios are against (baseline_of), where several took turns
    baseline_cache: str | None = None  # its cache, as compare names it

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
            shown.update(turn="call", call_orders=self.call_orders, excluded_calls=self.excluded,
                         call_other_cores=self.other_cores, quiet_wait_s=[round(s, 2) for s in self.waited_s])  # fmt: skip
        if self.stopped_by:
            shown["stopped_by"] = self.stopped_by
        if self.baseline is not None:
            shown.update(baseline=labels[self.baseline], baseline_cache=self.baseline_cache)
        return shown


def run_rounds(jobs: list[RoundTaker], seed: int, shuffle: bool, turn: str = "pass", sampler=None,
               wait=None, quiet_wait_s: float = QUIET_WAIT_S) -> Rounds:  # fmt: skip
    """Measure rounds until every job has what it wants; shuffle: a fresh order each round.
    turn="call" (several jobs): each call of a round is a turn of its own, every job making that call
    in a counterbalanced order, with the machine sampled around it (`sampler`: kvpipe.measure.contention's
    by default) and the call left out of the paired estimate where other processes held a core, the
    next call waiting for quiet first (`wait`: by default kvpipe.measure.contention.wait_for_quiet for
    at most quiet_wait_s; 0: never)."""
    draw, balanced = random.Random(seed), Counterbalanced(seed)
    by_call = turn == "call" and len(jobs) > 1
    sampler = sampler or contention.sample
    if wait is None and quiet_wait_s > 0:
        wait = functools.partial(contention.wait_for_quiet, most_s=quiet_wait_s)
    quiet = QuietWaits(wait)
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
                orders, excluded, others = call_round(jobs, wanted, balanced, advance, sampler, measured_s, quiet)
                order = orders[0] if orders else []
                rounds.call_orders.append(orders)
                rounds.excluded.append(excluded)
                rounds.other_cores.append(others)
                rounds.waited_s.append(quiet.round_taken())
            else:
                order = list(wanted)
                if shuffle:
                    draw.shuffle(order)
                for index in order:
                    take_turn(jobs[index], lambda job: job.measure_round(advance), measured_s, index)
            for index in order:
                taken[index] += 1
            rounds.seconds.append(time.perf_counter() - started - (rounds.waited_s[-1] if by_call else 0.0))
            rounds.orders.append(order)
            if len(jobs) > 1:
                _log_round(jobs, rounds, measured_s, taken)
    if sweep_auto:
        _close_auto(jobs, rounds)
    index = baseline_of(jobs)
    base = jobs[index]
    if len(jobs) > 1:
        rounds.baseline, rounds.baseline_cache = index, getattr(base, "cache_label", base.label)
    for job in [job for job in jobs if job is not base and job.failed is None] if by_call else []:
        job.paired_note = firmness_note(job.per_round[STOPPING_FIGURE], paired(job, base), rounds.baseline_cache)
    return rounds


def _log_round(jobs: list[RoundTaker], rounds: Rounds, measured_s: list[float], taken: list[int]) -> None:
    drift = rounds.drift()[-1]
    order = " ".join(jobs[i].label for i in rounds.orders[-1])
    left_out = rounds.excluded[-1] if rounds.excluded else []
    excluded = f"; {counted(len(left_out), 'call')} left out, taken under other processes' load" if left_out else ""
    waited = rounds.waited_s[-1] if rounds.waited_s else 0.0
    excluded += f"; waited {waited:.0f} s for the machine to go quiet" if waited else ""
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
    within = getattr(timing, "decide_within", DECIDE_WITHIN)
    decided_words = f"every paired TPOT ratio clear of 1 or measured to ±{within:.0%}"
    said = decided_words if reason == "decided" else f"reached {cap.get(reason, reason)}"
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
