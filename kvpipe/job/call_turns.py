"""Turns by call: in an interleaved sweep each measured call is a turn of its own, every job making
call i, in a counterbalanced order, before any makes call i + 1, with the machine sampled around each
job's call. A turn's calls are the pairs every paired ratio is made of, so a pair counts where its
calls saw the same conditions (`left_out_of_turn`): a call that lacked more cores than its partners
did (a neighbour arrived or left within the turn) is left out of its job's figures and of every
paired estimate it is part of, and the next turn waits for the machine to go quiet; a neighbour that
held its cores through the whole turn slowed every call of it alike, which the paired ratio cancels,
so those calls count (the job's own figures say they were measured beside it: kvpipe.measure.contention's
verdict). A turn that lasts one call, not a job's whole pass, is short against a noisy neighbour that
comes and goes within seconds."""

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
        samples = []
        for index in order:
            quiet.before_call()
            before = sampler()
            take_turn(jobs[index], lambda job, call=call: job.measure_call(call, advance), measured_s, index)
            samples.append((index, before, sampler()))
        held = [contention.other_cores(before, after) for _, before, after in samples]
        for index in left_out_of_turn(jobs, samples):
            jobs[index].exclude_last_call()
            excluded.append([call, index])
            quiet.pending = True
        orders.append(order)
        others.append([None if math.isnan(h) else round(h, 3) for h in held])  # null in rounds.json, not NaN
    for index in wanted:
        if jobs[index].failed is None:
            jobs[index].close_round()
    return orders, excluded, others


def left_out_of_turn(jobs: list[RoundTaker], samples: list[tuple]) -> list[int]:
    """The jobs whose call of one turn is left out, from (job, sample before, sample after) per call.
    A job alone in its turn, or where the machine's accounting cannot tell: by its call's own verdict
    (contention.call_contended). Else a call is out where its conditions differ from its partners':
    it lacked more cores than the turn's least-crowded call did (contention.shortfall) by more than a
    twentieth of a core and what the accounting's rounding can show over either call, or its own
    verdict is contended while another call's is not. A steady neighbour crowds every call of a turn
    alike: none is left out."""
    live = [(index, before, after) for index, before, after in samples if jobs[index].failed is None]
    own = [i for i, b, a in live if contention.call_contended(b, a, jobs[i].threads, jobs[i].on_cpu)]
    short = {i: contention.shortfall(b, a, jobs[i].threads) for i, b, a in live}
    if len(live) < 2 or any(math.isnan(v) for v in short.values()):
        return own
    least = min(live, key=lambda sample: short[sample[0]])
    floor = short[least[0]] + contention.CALL_SLACK_CORES + contention.rounding_cores(*least[1:])
    crowded = {i for i, b, a in live if short[i] > floor + contention.rounding_cores(b, a)}
    differs = set(own) if len(own) < len(live) else set()  # every call contended alike: a steady neighbour
    return sorted(crowded | differs, key=[i for i, _, _ in live].index)


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
