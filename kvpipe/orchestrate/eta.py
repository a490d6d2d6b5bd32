"""A sweep's ETA from what its jobs measured: each job left is priced from the done jobs most like it.

A job's own time is its span less what its process did once (importing torch and transformers,
loading the model: Result.process_setup_s), which the first job pays and a later one skips. Jobs
differ by what they sweep (a compiled cache's warm-up alone can take 20 s), so a job left costs the
mean of the done jobs that share the most of its swept values, and one that shares none with any
done job is counted at the median of all: a guess the message owns up to.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from datetime import datetime
from typing import Iterable

from kvpipe.record.result import Result
from kvpipe.units import duration_text


@dataclass
class DoneJob:
    values: dict[str, str]  # its swept values: key -> value, as its overrides set them
    seconds: float  # its own time, without its process's one-off setup


@dataclass
class Estimate:
    seconds: float
    unlike: int  # jobs left that share no swept value with a done job: counted at the median

    def text(self) -> str:
        """'ETA 42s', and how many jobs left were counted at the median, where any were."""
        shown = f"ETA {duration_text(math.ceil(self.seconds))}"
        if not self.unlike:
            return shown
        jobs = "1 job" if self.unlike == 1 else f"{self.unlike} jobs"
        return f"{shown} ({jobs} of an unmeasured kind counted at the median)"


def seconds_left(done: list[DoneJob], left: list[dict[str, str]], workers: int = 1) -> Estimate | None:
    """What the jobs left (each its swept values) will take, from the done ones; workers: jobs
    that run side by side. None before any job has measured."""
    if not done:
        return None
    varying = _varying_keys([job.values for job in done] + left)  # a value every job shares tells none apart
    median = statistics.median(job.seconds for job in done)
    total, unlike = 0.0, 0
    for values in left:
        shared = [sum(job.values.get(key) == values[key] for key in varying & values.keys()) for job in done]
        most = max(shared)
        if most == 0 and varying:  # where no key varies, every job is alike
            total, unlike = total + median, unlike + 1
        else:
            total += statistics.mean(job.seconds for job, count in zip(done, shared) if count == most)
    return Estimate(total / max(1, min(workers, len(left))), unlike)


def _varying_keys(jobs: list[dict[str, str]]) -> set[str]:
    keys = {key for values in jobs for key in values}
    return {key for key in keys if len({values.get(key) for values in jobs}) > 1}


def values_of(overrides: Iterable[str]) -> dict[str, str]:
    """A job's overrides as key -> value ('+experiment=needle' -> {'+experiment': 'needle'})."""
    return dict(override.split("=", 1) for override in overrides if "=" in override)


def done_job(result: Result) -> DoneJob | None:
    """A measured job's swept values and own seconds; None for one that did not measure (SKIPPED,
    FAILED, KILLED) or has no start time."""
    span = result.span_ms() if result.status == "FINISHED" else None
    if span is None:
        return None
    own_s = (span[1] - span[0]) / 1e3 - (result.process_setup_s or 0.0)
    return DoneJob(values_of(result.overrides), max(own_s, 0.0))


def recorded_since(result: Result, epoch_s: float) -> bool:
    """Whether the result was written after epoch_s (a sweep's start), not left from an earlier run
    in the same folder. A skipped job's time is written to the second: a second's slack."""
    return datetime.fromisoformat(result.finished_at).timestamp() >= epoch_s - 1


def sweep_estimate(results: list[Result], planned: list[list[str]] | None, index: int, total: int,
                   began_s: float, workers: int = 1) -> Estimate | None:  # fmt: skip
    """The ETA as job `index` of a sweep begins: done are the jobs it has measured since it began,
    left the planned jobs from index on (a job skipped or failed before it is neither). A search
    plans no jobs (planned None): its trials left are counted at the median."""
    this_run = [result for result in results if recorded_since(result, began_s)]
    done = [job for job in map(done_job, this_run) if job]
    left = [{}] * max(0, total - index) if planned is None else [values_of(job) for job in planned[index:]]
    return seconds_left(done, left, workers)
