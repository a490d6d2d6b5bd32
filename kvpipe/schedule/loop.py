"""The loop: rounds of turns, each turn's calls guarded, until the stop rule says enough.

Each round asks the StopRule which jobs it calls, takes their turns in the Order's order (call by
call, with the machine sampled around each call and the Guard's verdict on each turn; or a job's
whole pass a turn), and keeps what it took as one `Round`. At the end every job learns why the
rounds ended and, where its own figure is less firm than its paired ratio, the words that say so.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from dataclasses import dataclass, field

from kvpipe import kill_points
from kvpipe.measure import contention
from kvpipe.measure.round_figures import STOPPING_FIGURE, firmness_note
from kvpipe.schedule.guard import QUIET_WAIT_S, QuietWaits, left_out_of_turn
from kvpipe.schedule.order import Counterbalanced, Passes
from kvpipe.schedule.progress import progress_bar
from kvpipe.schedule.stop_rule import StopRule, baseline_of, paired
from kvpipe.schedule.taker import RoundTaker, take_turn
from kvpipe.units import counted, duration_text

log = logging.getLogger(__name__)


@dataclass
class Round:
    """One round as taken: its order (indices into the jobs; by call: its first call's), its wall
    seconds (waits for quiet aside); by call also each call's order, the [call, job] calls left out,
    the cores other processes held during each job's call (in that call's order; None where
    unknown) and the seconds waited for quiet."""

    order: list[int]
    seconds: float
    call_orders: list[list[int]] | None = None
    excluded: list[list[int]] = field(default_factory=list)
    other_cores: list[list[float | None]] = field(default_factory=list)
    waited_s: float = 0.0


@dataclass
class Rounds:
    """What ran, round by round, why it stopped, and the baseline the paired ratios are against."""

    taken: list[Round] = field(default_factory=list)
    by_call: bool = False
    stopped_by: str | None = None
    baseline: int | None = None  # the job the paired ratios are against (baseline_of), where several took turns
    baseline_cache: str | None = None  # its cache, as compare names it

    @property
    def orders(self) -> list[list[int]]:
        return [r.order for r in self.taken]

    @property
    def seconds(self) -> list[float]:
        return [r.seconds for r in self.taken]

    @property
    def call_orders(self) -> list[list[list[int]]]:
        return [r.call_orders for r in self.taken] if self.by_call else []

    @property
    def excluded(self) -> list[list[list[int]]]:
        return [r.excluded for r in self.taken] if self.by_call else []

    @property
    def other_cores(self) -> list[list[list[float | None]]]:
        return [r.other_cores for r in self.taken] if self.by_call else []

    @property
    def waited_s(self) -> list[float]:
        return [r.waited_s for r in self.taken] if self.by_call else []

    def drift(self) -> list[float]:
        """Each round's time against the first's, as a fraction (+0.3: 30% slower)."""
        first = self.seconds[0] if self.taken else 0.0
        return [s / first - 1 if first else float("nan") for s in self.seconds]

    def to_dict(self, labels: list[str]) -> dict:
        shown = {
            "jobs": labels,
            "orders": self.orders,
            "seconds": [round(s, 4) for s in self.seconds],
            "drift": [round(d, 4) for d in self.drift()],
        }
        if self.by_call and self.taken:
            shown.update(turn="call", call_orders=self.call_orders, excluded_calls=self.excluded,
                         call_other_cores=self.other_cores, quiet_wait_s=[round(s, 2) for s in self.waited_s])  # fmt: skip
        if self.stopped_by:
            shown["stopped_by"] = self.stopped_by
        if self.baseline is not None:
            shown.update(baseline=labels[self.baseline], baseline_cache=self.baseline_cache)
        return shown


def run_rounds(jobs: list[RoundTaker], seed: int, shuffle: bool, turn: str = "pass", sampler=None,
               wait=None, quiet_wait_s: float = QUIET_WAIT_S) -> Rounds:  # fmt: skip
    """Measure rounds until the stop rule ends them; shuffle: a fresh order each whole-pass round.
    turn="call" (several jobs): each call of a round is a turn of its own, every job making that call
    in a counterbalanced order, with the machine sampled around it (`sampler`: kvpipe.measure.contention's
    by default), a call the guard leaves out out of the paired estimate, and the next call waiting for
    quiet first (`wait`: by default kvpipe.measure.contention.wait_for_quiet for at most quiet_wait_s;
    0: never)."""
    by_call = turn == "call" and len(jobs) > 1
    order = Counterbalanced(seed) if by_call else Passes(seed, shuffle)
    if wait is None and quiet_wait_s > 0:
        wait = functools.partial(contention.wait_for_quiet, most_s=quiet_wait_s)
    by_calls = CallByCall(sampler or contention.sample, QuietWaits(wait))
    stop = StopRule(jobs, by_call)
    for job in jobs:
        job.takes_turns("call" if by_call else "pass")
    rounds = Rounds(by_call=by_call)
    measured_s = [0.0] * len(jobs)
    taken = [0] * len(jobs)  # the rounds each took part in here: measured_s over them is its round's cost
    known = all(job.fixed_rounds is not None for job in jobs)
    total = sum(job.fixed_rounds * job.calls_per_round for job in jobs) if known else None
    label = jobs[0].label if len(jobs) == 1 else f"{len(jobs)} jobs, interleaved"
    kill_points.reached("before_rounds")
    with progress_bar(label, total) as advance:
        while wanted := stop.next_round(sum(measured_s)):
            if any(job.rounds_done() for job in jobs):
                kill_points.reached("between_rounds")
            started = time.perf_counter()
            if by_call:
                taken_round = by_calls.round(jobs, wanted, order, advance, measured_s)
            else:
                taken_round = Round(order=order.next(wanted), seconds=0.0)
                for index in taken_round.order:
                    take_turn(jobs[index], lambda job: job.measure_round(advance), measured_s, index)
            taken_round.seconds = time.perf_counter() - started - taken_round.waited_s
            for index in taken_round.order:
                taken[index] += 1
            rounds.taken.append(taken_round)
            if len(jobs) > 1:
                _log_round(jobs, rounds, measured_s, taken)
    _close(jobs, rounds, stop)
    return rounds


class CallByCall:
    """A round taken call by call: each job's call of a turn sampled on its own (a neighbour that came
    for one job's call and left before the next job's slowed that one call, which alone is left out,
    its pairs with it), and the call after a left-out one waiting for quiet first."""

    def __init__(self, sampler, quiet: QuietWaits):
        self.sampler, self.quiet = sampler, quiet

    def round(self, jobs, wanted, order: Counterbalanced, advance, measured_s) -> Round:
        keys = {index: jobs[index].call_keys() for index in wanted}
        taken = Round(order=[], seconds=0.0, call_orders=[])
        for call in range(max(len(k) for k in keys.values())):
            taking = [i for i in wanted if call < len(keys[i]) and jobs[i].failed is None]
            if not taking:
                continue
            turn_order = order.next(taking)
            samples = []
            for index in turn_order:
                self.quiet.before_call()
                before = self.sampler()
                take_turn(jobs[index], lambda job, call=call: job.measure_call(call, advance), measured_s, index)
                samples.append((index, before, self.sampler()))
            left_out = left_out_of_turn(jobs, samples)
            for index in left_out:
                jobs[index].exclude_last_call()
                taken.excluded.append([call, index])
            self.quiet.after_turn(left_out)
            held = [contention.other_cores(before, after) for _, before, after in samples]
            taken.call_orders.append(turn_order)
            taken.other_cores.append([None if math.isnan(h) else round(h, 3) for h in held])  # null, not NaN
        for index in wanted:
            if jobs[index].failed is None:
                jobs[index].close_round()
        taken.order = taken.call_orders[0] if taken.call_orders else []
        taken.waited_s = self.quiet.round_taken()
        return taken


def _close(jobs: list[RoundTaker], rounds: Rounds, stop: StopRule) -> None:
    """Tell each job why its rounds ended and, against the baseline, how firm its own figure is."""
    if stop.by_paired_decision:
        rounds.stopped_by = stop.stopped_by
        log.info(stop.said(len(rounds.taken)))
    index = baseline_of(jobs)
    base = jobs[index]
    if len(jobs) > 1:
        rounds.baseline, rounds.baseline_cache = index, getattr(base, "cache_label", base.label)
    for job in jobs:
        note = None
        if rounds.by_call and job is not base and job.failed is None:
            note = firmness_note(job.per_round[STOPPING_FIGURE], paired(job, base), rounds.baseline_cache)
        job.rounds_ended(stop.ended_by, note)


def _log_round(jobs: list[RoundTaker], rounds: Rounds, measured_s: list[float], taken: list[int]) -> None:
    last = rounds.taken[-1]
    order = " ".join(jobs[i].label for i in last.order)
    said = (
        f"; {counted(len(last.excluded), 'call')} left out, taken under other processes' load" if last.excluded else ""
    )
    said += f"; waited {last.waited_s:.0f} s for the machine to go quiet" if last.waited_s else ""
    log.info(
        "round %d: %.2f s, %+.0f%% on the first; order %s%s%s",
        len(rounds.taken), last.seconds, 100 * rounds.drift()[-1], order, said, _left_text(jobs, measured_s, taken),
    )  # fmt: skip


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
