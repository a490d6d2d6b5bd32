"""Contention: a job that cannot have the cores it counts on is told apart from an idle one, flagged
and said; torch's threads are chosen, not inherited by accident."""

from __future__ import annotations

import math
import subprocess
import sys
import time

import psutil
import pytest

from kvpipe.job.runner import run_job
from kvpipe.measure import contention

from conftest import spec_for

TINY = ("model=tiny_random", "workload=long_context", "workload.prompt_tokens=200", "workload.max_new_tokens=24",
        "tracking=off", "quality=off", "workload.warmup=0", "workload.repeats=2", "model.threads=1")  # fmt: skip


def test_threads_and_other_processes_cores_against_the_machines():
    assert not contention.contended(others=0.1, threads=2, available=2)  # an idle 2-core machine
    assert contention.contended(others=1.0, threads=2, available=2)  # one core taken from two threads
    assert not contention.contended(others=1.0, threads=1, available=2)  # the job still has its core
    assert contention.contended(others=math.nan, threads=2, available=2, load_average=3.3)  # no /proc: the load
    assert not contention.contended(others=math.nan, threads=2, available=2)
    # two spinning processes beside one thread: they held 1.4 cores, and took 0.4 of the job's
    assert contention.contended(others=1.4, threads=1, available=2, own=0.6)
    assert not contention.contended(others=0.2, threads=1, available=2, own=0.6)  # a slow job, but no rival
    before = contention.CpuSample(wall_s=0, busy_s=10, own_s=5)
    assert contention.other_cores(before, contention.CpuSample(wall_s=2, busy_s=14, own_s=7)) == 1.0


SPIN = "import time\nend = time.monotonic() + 60\nwhile time.monotonic() < end:\n    pass\n"


def _spinning(count: int) -> list[subprocess.Popen]:
    """`count` processes that each keep a core busy, returned once each has spun for a while: a
    spawned process may take seconds to start on a busy machine."""
    hogs = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(count)]
    deadline = time.monotonic() + 30
    while any(psutil.Process(h.pid).cpu_times().user < 0.3 for h in hogs) and time.monotonic() < deadline:
        time.sleep(0.05)
    return hogs


# The job's other processes must be only the ones the test starts: run with the machine to itself
# (`make test` runs the tests marked `alone` after the parallel part).
@pytest.mark.slow  # two real jobs, one beside spinning processes
@pytest.mark.alone
def test_a_job_beside_busy_processes_is_tagged_contended_marked_noisy_and_says_so():
    idle = run_job(spec_for(*TINY))
    assert idle.tags["contended"] == "false" and idle.params["model.threads"] == "1"
    assert idle.metrics["other_cpu_cores"] < 1
    # two spinning processes per core: the scheduler cannot then leave the job most of a core (with one
    # per core it sometimes did, and the job was rightly not contended)
    hogs = _spinning(2 * contention.cores())
    try:
        busy = run_job(spec_for(*TINY))
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert busy.tags["contended"] == "true" and busy.tags["noisy"] == "true"
    assert busy.metrics["other_cpu_cores"] > 1
    (note,) = [n for n in busy.notes if n.startswith("contended:")]
    assert "\n" not in note and "torch thread" in note


def test_model_threads_is_checked_in_one_line():
    from kvpipe.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^model.threads=0 .*expected a positive number"):
        spec_for("model.threads=0")
