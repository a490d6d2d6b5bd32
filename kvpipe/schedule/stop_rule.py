"""StopRule: when the rounds end, and the one baseline that paired ratios are against.

Three rules, one per way of asking:
- **fixed**: `workload.repeats` rounds for each job;
- **auto, by interval**: at least MIN_ROUNDS rounds, then more until the job's own TPOT interval is
  within `workload.target_interval` (a job alone, or a sweep with whole-pass turns). Jobs on auto
  keep taking part until every one of them is done, so that each pair shares as many rounds as it can;
- **auto, by paired decision**: in a sweep taking turns by call with every job on auto, rounds until
  every paired TPOT ratio against the baseline is decided (`workload.decide_within`).

Both auto rules stop at the same caps, with the same meaning: `workload.max_repeats` rounds of a job,
or `workload.max_measure_s` seconds of measured calls, every job of the rounds together.
"""

from __future__ import annotations

import logging

from kvpipe.measure.round_figures import DECIDE_WITHIN, MIN_ROUNDS, STOPPING_FIGURE, decided
from kvpipe.measure.uncertainty import ratio_interval
from kvpipe.schedule.taker import RoundTaker

log = logging.getLogger(__name__)

DECIDED, MAX_REPEATS, MAX_MEASURE_S = "decided", "max_repeats", "max_measure_s"  # why the rounds ended


def baseline_of(jobs: list[RoundTaker]) -> int:
    """The job the sweep's paired ratios are against, as compare's default baseline: the first job
    whose cache compare names `dynamic`, else the first."""
    return next((i for i, job in enumerate(jobs) if job.compare_baseline), 0)


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


class StopRule:
    """Which jobs the next round calls, until none: `next_round(measured_s)` with the seconds of
    measured calls so far (every job's); `stopped_by` says why a paired-decision rule ended."""

    def __init__(self, jobs: list[RoundTaker], by_call: bool):
        self.jobs = jobs
        self.by_paired_decision = by_call and len(jobs) > 1 and all(job.auto for job in jobs)
        self.stopped_by: str | None = None

    def next_round(self, measured_s: float) -> list[int]:
        alive = [i for i, job in enumerate(self.jobs) if job.failed is None]
        base = baseline_of(self.jobs)
        if self.by_paired_decision and len(alive) >= 2 and base in alive:
            return self._until_decided(alive, base, measured_s)
        return self._each_job(alive, measured_s)  # without its baseline (it failed), each job's own rule

    def _under_caps(self, job: RoundTaker, measured_s: float) -> bool:
        return job.rounds_done() < job.timing.max_repeats and measured_s < job.timing.max_measure_s

    def _each_job(self, alive: list[int], measured_s: float) -> list[int]:
        """Fixed jobs short of their repeats, and every job on auto under the caps while any of them
        is not converged."""
        jobs = self.jobs
        calling = [i for i in alive if not jobs[i].auto and jobs[i].rounds_done() < jobs[i].fixed_rounds]
        auto = [i for i in alive if jobs[i].auto and self._under_caps(jobs[i], measured_s)]
        if any(not jobs[i].converged() for i in auto):
            calling += auto
        return sorted(calling)

    def _until_decided(self, alive: list[int], base: int, measured_s: float) -> list[int]:
        """Every live job while a paired TPOT ratio against the baseline is not yet decided and the
        caps allow; [] (with stopped_by said) once it is or they do not."""
        baseline = self.jobs[base]
        timing = baseline.timing
        within = getattr(timing, "decide_within", DECIDE_WITHIN)
        others = [self.jobs[i] for i in alive if i != base]
        if baseline.rounds_done() >= MIN_ROUNDS and all(decided(*paired(job, baseline), within) for job in others):
            self.stopped_by = DECIDED
        elif baseline.rounds_done() >= timing.max_repeats:
            self.stopped_by = MAX_REPEATS
        elif measured_s >= timing.max_measure_s:
            self.stopped_by = MAX_MEASURE_S
        return [] if self.stopped_by else alive

    @property
    def ended_by(self) -> str | None:
        """Why a paired-decision rule's rounds ended (decided, unless a cap ended them; also where its
        baseline failed and each job's own rule took over); None under the other rules."""
        return (self.stopped_by or DECIDED) if self.by_paired_decision else None

    def said(self, rounds: int) -> str:
        """The log line of a paired-decision rule's end."""
        timing = self.jobs[0].timing
        within = getattr(timing, "decide_within", DECIDE_WITHIN)
        cap = {MAX_REPEATS: f"workload.max_repeats={timing.max_repeats}",
               MAX_MEASURE_S: f"workload.max_measure_s={timing.max_measure_s:g}"}  # fmt: skip
        reason = self.ended_by
        words = (
            f"every paired TPOT ratio clear of 1 or measured to ±{within:.0%}"
            if reason == DECIDED
            else f"reached {cap.get(reason, reason)}"
        )
        return f"repeats=auto: {rounds} rounds, stopped: {words}"
