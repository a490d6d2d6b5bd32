"""Guard: whether a pair of calls counts.

A turn's calls are the pairs every paired ratio is made of, so a pair counts where its calls saw
the same machine (`left_out_of_turn`): a call that lacked more cores than its partners did (a
neighbour arrived or left within the turn) is left out of its job's figures and of every paired
estimate it is part of, and the next call waits for the machine to go quiet (`QuietWaits`, at most
hydra.launcher.quiet_wait_s). A neighbour that held its cores through the whole turn slowed every
call of it alike, which the paired ratio cancels, so those calls count; the job's own figures say
they were measured beside it (kvpipe.measure.contention's verdict). A turn that lasts one call, not
a job's whole pass, is short against a noisy neighbour that comes and goes within seconds.
"""

from __future__ import annotations

import logging
import math

from kvpipe.errors import ConfigError
from kvpipe.measure import contention
from kvpipe.measure.contention import QUIET_WAIT_S

log = logging.getLogger(__name__)

__all__ = ["QUIET_WAIT_S", "QuietWaits", "check_quiet_wait", "left_out_of_turn"]


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
    """After a turn that left a call out, the next call waits for the machine to go quiet (`wait`:
    () -> (seconds waited, whether it went quiet), kvpipe.measure.contention.wait_for_quiet), so that
    a busy spell costs a call or two, not every call measured into it. A wait that runs out with the
    machine still busy ends the waiting for the sweep: a neighbour that stays is not passing, and
    measuring goes on. Without `wait` it never waits."""

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

    def after_turn(self, left_out: list[int]) -> None:
        """A turn that left a call out makes the next call wait for quiet first."""
        self.pending = self.pending or bool(left_out)

    def round_taken(self) -> float:
        """The seconds waited in the round just taken; the next round's count starts."""
        waited, self.seconds = self.seconds, 0.0
        return waited


def left_out_of_turn(jobs: list, samples: list[tuple]) -> list[int]:
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
