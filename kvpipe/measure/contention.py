"""Whether the job had the cores it counted on: the CPU time other processes used while it measured.

A machine whose cores are busy with other work slows every call alike, so the calls agree with one
another and no spread shows it (16x slower TPOT, CV 1%, was seen). What does show it is the machine's
own accounting: the CPU time all processes used (psutil.cpu_times, from /proc/stat) less this
process's own (its threads' and its descendants', from /proc), over the wall time of the measured
calls, is how many cores other processes held. The job is contended when its torch threads and
those cores together ask for more than the machine has (half a core of slack for background
chatter), or when, on CPU, it ran on less than 80% of its threads' cores while other processes held
half a core or more (what they took from it: competing processes share the cores, so their own use
understates their demand).
Where no such accounting exists, the 1-minute load average stands in for it.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from dataclasses import dataclass

SLACK_CORES = 0.5  # daemons, the shell, a terminal: what an idle machine runs beside the job


@dataclass(frozen=True)
class CpuSample:
    wall_s: float
    busy_s: float  # every process's CPU time since boot (nan: not available)
    own_s: float  # this process's and its descendants'


def cores() -> int:
    """The logical cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def sample() -> CpuSample:
    import psutil

    try:
        times = psutil.cpu_times()
        busy = sum(times) - times.idle - getattr(times, "iowait", 0.0)
    except (OSError, AttributeError):
        busy = math.nan
    return CpuSample(time.monotonic(), busy, own_cpu_s(psutil.Process()))


# Processes this one did not start whose work is the job's: a server on this machine that the user
# runs and the job sends its requests to (engine=openai), with whatever that server started; counted
# per job that adopted it, so that two jobs of a sweep on one server each release their own
ADOPTED: Counter[int] = Counter()


def adopt(pids: list[int]) -> None:
    ADOPTED.update(pids)


def release(pids: list[int]) -> None:
    ADOPTED.subtract(pids)
    for pid in [pid for pid, held in ADOPTED.items() if held <= 0]:
        del ADOPTED[pid]


def own_cpu_s(process) -> float:
    """The CPU seconds of a process and everything it started: its live descendants (torch's compile
    workers, kvpipe's tracking worker) and its reaped children are the job's own work, not rivals;
    so is an adopted process's (ADOPTED) and its descendants'."""
    import psutil

    times = process.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in _with_adopted(process):
        try:
            child_times = child.cpu_times()
        except psutil.Error:  # it ended between the walk and the read; its parent will count it once reaped
            continue
        total += child_times.user + child_times.system
    return total


def _with_adopted(process) -> list:
    import psutil

    found = process.children(recursive=True)
    for pid in ADOPTED:
        try:
            adopted = psutil.Process(pid)
            found += [adopted, *adopted.children(recursive=True)]
        except psutil.Error:  # it ended: its time no longer moves
            continue
    return found


def other_cores(before: CpuSample, after: CpuSample) -> float:
    """Cores other processes kept busy between two samples, on average (nan where unknown)."""
    wall = after.wall_s - before.wall_s
    if wall <= 0 or math.isnan(before.busy_s) or math.isnan(after.busy_s):
        return math.nan
    others = (after.busy_s - before.busy_s) - (after.own_s - before.own_s)
    return max(others, 0.0) / wall


def own_cores(before: CpuSample, after: CpuSample) -> float:
    """Cores this process kept busy between two samples, on average."""
    wall = after.wall_s - before.wall_s
    return (after.own_s - before.own_s) / wall if wall > 0 else math.nan


def contended(others: float, threads: int, available: int, load_average: float = math.nan,
              own: float = math.nan, slack: float = SLACK_CORES) -> bool:  # fmt: skip
    """Whether `threads` torch threads could not each have a core beside `others` busy ones, or (given
    `own`, the job's cores on CPU) lost their cores to them. Without `others`, the load average (which
    counts this job's own threads too) stands in."""
    if math.isnan(others):
        if math.isnan(load_average):
            return False
        return load_average > available + slack
    crowded = threads + others > available + slack
    lost = not math.isnan(own) and own < 0.8 * threads and others >= slack
    return crowded or lost


@dataclass(frozen=True)
class Verdict:
    """What a job's two samples say: the cores others held and the job's own, and whether it was contended."""

    others: float
    own: float
    busy: bool
    threads: int
    load_average: float

    def metrics(self) -> dict[str, float]:
        """other_cpu_cores and job_cpu_cores, where the samples could tell (not NaN)."""
        return {} if self.others != self.others else {"other_cpu_cores": self.others, "job_cpu_cores": self.own}

    def note(self) -> str:
        held = f"{self.others:.1f}" if self.others == self.others else f"load average {self.load_average:.1f} on"
        return (
            f"contended: other processes kept {held} of {cores()} cores busy while this job's {self.threads} torch "
            "thread(s) measured; every timing is slower than on an idle machine (rerun when it is idle, or set "
            "model.threads to the cores that are free)"
        )


def judge(before: CpuSample, after: CpuSample, threads: int, load_average: float, device: str) -> Verdict:
    """The verdict on a job measured between two samples, with `threads` torch threads on `device`
    (its own cores count only on CPU) and the load average at its start."""
    others, own = other_cores(before, after), own_cores(before, after)
    busy = contended(others, threads, cores(), load_average, own if device == "cpu" else math.nan)
    return Verdict(others, own, busy, threads, load_average)


# A call's own window is seconds, not a job's minute: a neighbour that held a core for part of it slowed
# that call and not the next job's. So a call is judged with a twentieth of a core of slack, not half
# a core: an idle 2-core VM's background read 0.000-0.015 cores over 2 s windows (2026-12-04), and
# with 0.1 a drifted sweep still kept calls whose pair read 0.84-1.22x (benchmarks/drift.py).
CALL_SLACK_CORES = 0.05


def accounting_error_s() -> float:
    """The most CPU time that rounding alone can show as other processes' between two samples: the
    kernel counts CPU time in clock ticks (1/100 s), each core's counter and this process's user and
    system times each rounded to one. An idle 2-core VM read up to 3 ticks of "others" over 0.15 s
    calls (0.2 cores; 2026-12-06), so for a call of a small model this, not the slack, is the floor."""
    return (cores() + 2) / os.sysconf("SC_CLK_TCK")


def rounding_cores(before: CpuSample, after: CpuSample) -> float:
    """The cores that the accounting's rounding alone can show as other processes' over this window."""
    wall = after.wall_s - before.wall_s
    return accounting_error_s() / wall if wall > 0 else math.inf


def shortfall(before: CpuSample, after: CpuSample, threads: int) -> float:
    """The cores that `threads` threads lacked between two samples: how far they and other processes'
    busy cores together went past the machine's (0 where there was room; NaN where unknown)."""
    return max(threads + other_cores(before, after) - cores(), 0.0)


def call_contended(before: CpuSample, after: CpuSample, threads: int, on_cpu: bool) -> bool:
    """Whether one call between two samples ran while other processes held a core that its `threads`
    needed: judge's rule on the call's own samples (no load average: a minute's, not a call's), with
    a twentieth of a core of slack, or what the accounting's rounding can show over so short a call."""
    own = own_cores(before, after) if on_cpu else math.nan
    wall = after.wall_s - before.wall_s
    slack = max(CALL_SLACK_CORES, rounding_cores(before, after)) if wall > 0 else CALL_SLACK_CORES
    return contended(other_cores(before, after), threads, cores(), math.nan, own, slack=slack)


# After a call taken under others' load, the next calls wait for the machine to go quiet instead of being
# measured into the same busy spell and left out in turn: a neighbour busy for 15 s of every 30 cost an
# interleaved sweep most of its calls. A second's window reads an idle machine's background to a
# hundredth of a core; a neighbour still there after QUIET_WAIT_S is not passing, so measuring goes on.
QUIET_WINDOW_S = 1.0
QUIET_WAIT_S = 20.0


def wait_for_quiet(sampler=sample, sleep=time.sleep, window_s: float = QUIET_WINDOW_S,
                   most_s: float = QUIET_WAIT_S) -> tuple[float, bool]:  # fmt: skip
    """Wait, window by window, until other processes hold at most CALL_SLACK_CORES for a whole
    window, or most_s has passed: (seconds waited, whether it went quiet). Where the machine keeps
    no accounting it cannot tell, and waits for nothing."""
    first = before = sampler()
    while True:
        sleep(window_s)
        after = sampler()
        others = other_cores(before, after)
        waited = after.wall_s - first.wall_s
        if math.isnan(others):
            return waited, True
        if others <= CALL_SLACK_CORES:
            return waited, True
        if waited >= most_s:
            return waited, False
        before = after
