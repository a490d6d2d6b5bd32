"""Turns by call: in an interleaved sweep each measured call is a turn of its own, every job making
call i, in a counterbalanced order, before any makes call i + 1, with the machine sampled around each
job's call; a call taken while other processes held a core is left out of its job's figures and of
every paired estimate it is part of, and the next call waits for the machine to go quiet. A turn that
lasts one call, not a job's whole pass, is short against a noisy neighbour that comes and goes within
seconds."""

from __future__ import annotations

import logging
import math
import random

from kvpipe.errors import ConfigError, require_choice
from kvpipe.job.round_taker import RoundTaker, take_turn
from kvpipe.measure import contention
from kvpipe.measure.round_figures import STOPPING_FIGURE
from kvpipe.measure.uncertainty import ratio_interval

log = logging.getLogger(__name__)

TURNS = ("call", "pass")  # what takes a turn in a sweep: one measured call, or a job's whole pass


def check_turn(turn: str) -> str:
    """hydra.launcher.turn, checked at the sweep's door."""
    require_choice("hydra.launcher.turn", turn, TURNS)
    return turn


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


def check_quiet_wait(seconds) -> float:
    """hydra.launcher.quiet_wait_s, checked at the sweep's door."""
    try:
        read = float(seconds)
    except (TypeError, ValueError):
        read = math.nan
    if not read >= 0:
        raise ConfigError("hydra.launcher.quiet_wait_s", seconds, "expected seconds, 0 or more (0: never wait)")
    return read


class QuietWaits:
    """After a contended call, the next one waits for the machine to go quiet (`wait`: () -> (seconds
    waited, whether it went quiet), kvpipe.measure.contention.wait_for_quiet), so that a busy spell
    costs a call or two, not every call measured into it. A wait that runs out with the machine still
    busy ends the waiting for the sweep: a neighbour that stays is not passing, and measuring goes on.
    Without `wait` it never waits."""

    def __init__(self, wait=None):
        self.wait = wait
        self.pending, self.given_up = False, wait is None
        self.seconds = 0.0  # waited in the round being taken

    def before_call(self) -> None:
        if not self.pending or self.given_up:
            return
        waited, quiet = self.wait()
        self.seconds += waited
        self.pending = False
        if not quiet:
            self.given_up = True
            log.warning("other processes kept the cores busy for %.0f s: measuring on without waiting for "
                        "quiet (calls taken under their load are left out)", waited)  # fmt: skip

    def round_taken(self) -> float:
        """The seconds waited in the round just taken; the next round's count starts."""
        waited, self.seconds = self.seconds, 0.0
        return waited


def call_round(jobs, wanted, balanced, advance, sampler, measured_s, quiet: QuietWaits):
    """One round taken call by call: (each call's order, the [call, job] pairs left out as contended,
    per call the cores other processes held during each job's call, in that call's order, None where
    unknown). Each job's
    call is sampled on its own: a neighbour that came for one job's call of a turn and left before the
    next job's slowed that one call, which alone is left out (its pairs with it); the call after it
    waits for quiet first (`quiet`)."""
    keys = {index: jobs[index].call_keys() for index in wanted}
    orders, excluded, others = [], [], []
    for call in range(max(len(k) for k in keys.values())):
        taking = [i for i in wanted if call < len(keys[i]) and jobs[i].failed is None]
        if not taking:
            continue
        order = balanced.next(taking)
        held = []
        for index in order:
            quiet.before_call()
            job, before = jobs[index], sampler()
            take_turn(job, lambda job, call=call: job.measure_call(call, advance), measured_s, index)
            after = sampler()
            others_held = contention.other_cores(before, after)
            held.append(None if math.isnan(others_held) else round(others_held, 3))  # null in rounds.json, not NaN
            if job.failed is None and contention.call_contended(before, after, job.threads, job.on_cpu):
                job.exclude_last_call()
                excluded.append([call, index])
                quiet.pending = True
        orders.append(order)
        others.append(held)
    for index in wanted:
        if jobs[index].failed is None:
            jobs[index].close_round()
    return orders, excluded, others


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
