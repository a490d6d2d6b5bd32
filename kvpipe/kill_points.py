"""A test hook: SIGKILL at a named stage of a job's life, so that a test can stop a sweep exactly
there, with no sleep and no race (tests/test_exactly_once.py checks that every stage resumes and
syncs to each job once).

`KVPIPE_TEST_KILL_AT=POINT` kills the process the first time it reaches POINT; `POINT@N` the N-th
time (a sweep's second job, say). Read once, as this module loads: unset, as outside tests, each
point costs one comparison. Not a setting: nothing but tests should ever set it.
"""

from __future__ import annotations

import os
import signal

ENV = "KVPIPE_TEST_KILL_AT"
POINTS = (
    "before_rounds",  # a job (or a sweep's group of jobs) prepared, its measured rounds not begun
    "between_rounds",  # a round measured, another wanted
    "after_result",  # result.json written, nothing in MLflow yet
    "after_run_created",  # the job's MLflow run created, nothing logged to it, its id not written back
    "after_run_logged",  # the job's MLflow run whole and closed, its id not written back to result.json
)


def _armed(value: str | None) -> tuple[str, int] | None:
    if not value:
        return None
    point, _, nth = value.partition("@")
    if point not in POINTS or not (nth or "1").isdigit():
        raise ValueError(f"{ENV}={value!r}: expected POINT or POINT@N, POINT one of {', '.join(POINTS)}")
    return point, int(nth or 1)


_ARMED = _armed(os.environ.get(ENV))
_times_reached: dict[str, int] = {}


def reached(point: str, writer: int | None = None) -> None:
    """Kill this process (and `writer` first: the process that would write back what this one made)
    where the test asked for `point`; else nothing."""
    if _ARMED is None or _ARMED[0] != point:
        return
    _times_reached[point] = _times_reached.get(point, 0) + 1
    if _times_reached[point] == _ARMED[1]:
        if writer is not None:
            os.kill(writer, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
