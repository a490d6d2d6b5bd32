"""What takes part in rounds: a job, or a test's stand-in. It keeps its figures round by round and
call by call, and which of its calls were left out as contended; the stop rule (kvpipe.schedule.stop_rule)
reads them, with its workload's settings, to decide whether it takes another round."""

from __future__ import annotations

import logging
import math
import time

from kvpipe.measure.round_figures import CALL_FIGURES, STOPPING_FIGURE, converged, relative_half_width, rounds_of

log = logging.getLogger(__name__)


class RoundTaker:
    """What takes part in rounds: a job, or a test's stand-in. It keeps its figures round by round
    and call by call, and its workload's settings (`timing`: repeats, and repeats=auto's
    target_interval, max_repeats and max_measure_s); a subclass measures a round (`measure_round`,
    which calls `add_round`) and, where its round can be cut into calls (`call_keys`), one call of
    it (`measure_call`)."""

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

    def takes_turns(self, turn: str) -> None:
        """The rounds begin: its turns are calls ("call", a sweep's interleaved jobs) or whole passes."""
        self.turn = turn

    def rounds_ended(self, stopped_by: str | None, paired_note: str | None) -> None:
        """The rounds ended: why (a sweep on repeats=auto, ruled by its paired ratios), and where its own
        figure is less firm than its paired ratio against the baseline, the words that say so."""
        self.stopped_by, self.paired_note = stopped_by, paired_note

    def converged(self) -> bool:
        return converged(self.per_round, self.timing.target_interval)

    def not_converged_note(self) -> str:
        width = relative_half_width(self.per_round[STOPPING_FIGURE])
        return (
            f"repeats=auto stopped after {self.rounds_done()} rounds (workload.max_repeats={self.timing.max_repeats}, "
            f"workload.max_measure_s={self.timing.max_measure_s:g}) with TPOT within ±{width:.1%}, wider than "
            f"workload.target_interval={self.timing.target_interval:g}"
        )


def take_turn(job: RoundTaker, measure, measured_s: list[float], index: int) -> None:
    """One turn of one job; a failure is its own, and the others go on."""
    began = time.perf_counter()
    try:
        measure(job)
    except Exception as exc:  # noqa: BLE001 - one job's failure is its own; the others go on
        log.error("%s failed in round %d: %s", job.label, job.rounds_done() + 1, exc)
        job.failed = exc
    measured_s[index] += time.perf_counter() - began
