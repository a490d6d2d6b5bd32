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


def _spinning(count: int) -> list[psutil.Process]:
    """`count` processes that each keep a core busy, returned once each has spun for a while: a
    spawned process may take seconds to start on a busy machine. Started by a process that exits at
    once, so they are no descendants of this one: another user's work, not the job's own."""
    # their output goes nowhere: a spinner holding the starter's pipe would keep run() waiting for it
    spin = f"subprocess.Popen([sys.executable, '-c', {SPIN!r}], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)"
    starter = f"import subprocess, sys\nfor _ in range({count}):\n    print({spin}.pid)\n"
    pids = subprocess.run([sys.executable, "-c", starter], capture_output=True, text=True, check=True).stdout.split()
    hogs = [psutil.Process(int(pid)) for pid in pids]
    deadline = time.monotonic() + 30
    while any(h.cpu_times().user < 0.3 for h in hogs) and time.monotonic() < deadline:
        time.sleep(0.05)
    return hogs


def _background_cores(seconds: float = 1.0) -> float:
    """The cores other processes keep busy now: the premise the idle half of the test stands on."""
    before = contention.sample()
    time.sleep(seconds)
    return contention.other_cores(before, contention.sample())


QUIET_CORES = 0.5  # a background below this leaves the job its one thread's core


def _agrees_with_its_figures(job) -> bool:
    """Whether a job's contended tag is what its own measured cores say, by the rule it is judged by."""
    said = contention.contended(
        job.metrics["other_cpu_cores"], int(job.params["model.threads"]), contention.cores(),
        own=job.metrics["job_cpu_cores"],
    )  # fmt: skip
    return job.tags["contended"] == str(said).lower()


# The job's other processes should be only the ones the test starts (`make test` runs the tests
# marked `alone` after the parallel part); where something else on the machine is busy anyway (a
# shared workstation, a busy CI runner), the test checks what must hold whatever the background is.
@pytest.mark.slow  # two real jobs, one beside spinning processes
@pytest.mark.alone
def test_a_job_beside_busy_processes_is_tagged_contended_marked_noisy_and_says_so():
    before = _background_cores()
    idle = run_job(spec_for(*TINY))
    after = _background_cores()
    assert idle.params["model.threads"] == "1" and _agrees_with_its_figures(idle), idle.metrics
    # the machine to itself just before and just after the job: the job must not count its own thread as
    # another's. A neighbour busy on either side says nothing of an absolute figure; the relation below holds.
    if max(before, after) < QUIET_CORES:
        assert idle.tags["contended"] == "false" and idle.metrics["other_cpu_cores"] < 1, (before, after, idle.metrics)
    # two spinning processes per core: the scheduler cannot then leave the job most of a core (with one
    # per core it sometimes did, and the job was rightly not contended)
    hogs = _spinning(2 * contention.cores())
    try:
        busy = run_job(spec_for(*TINY))
    finally:
        for hog in hogs:
            hog.kill()
        psutil.wait_procs(hogs, timeout=10)
    figures = {name: (idle.metrics[name], busy.metrics[name]) for name in ("other_cpu_cores", "job_cpu_cores")}
    assert busy.tags["contended"] == "true" and busy.tags["noisy"] == "true", figures
    assert _agrees_with_its_figures(busy), figures
    # the test's own spinners are counted as others' work: with the job they fill the cores (two a core
    # beside its one thread), and they add to whatever ran beside the idle job. By how much depends
    # on that background: where it already fills the cores, only by the share the spinners take from it.
    assert busy.metrics["other_cpu_cores"] > max(1.0, idle.metrics["other_cpu_cores"]), figures
    (note,) = [n for n in busy.notes if n.startswith("contended:")]
    assert "\n" not in note and "torch thread" in note


def test_model_threads_is_checked_in_one_line():
    from kvpipe.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^model.threads=0 .*expected a positive number"):
        spec_for("model.threads=0")


CPU_SPIN = "import time\nwhile time.process_time() < {seconds}:\n    pass\n"


def _spin_child(cpu_s: float) -> None:
    """A child process of this one that spends `cpu_s` of CPU (however long a busy machine makes
    that take), waited for."""
    subprocess.run([sys.executable, "-c", CPU_SPIN.format(seconds=cpu_s)], check=True)


def test_the_cpu_of_the_jobs_own_child_processes_counts_as_the_jobs():
    before = contention.sample()
    _spin_child(1.5)
    after = contention.sample()
    assert after.own_s - before.own_s >= 1.4  # torch's compile workers, the tracking worker: the job's own


TICK_SLACK_S = 0.03  # three of /proc's 10 ms clock ticks, and float rounding


def _cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def test_a_live_child_process_counts_as_the_jobs_while_it_runs():
    child = psutil.Popen([sys.executable, "-c", CPU_SPIN.format(seconds=60)])
    try:
        before, child_before = contention.sample(), _cpu_s(child)
        # until the child has spun a while, however long a busy machine makes that (the deadline: a hang)
        deadline = time.monotonic() + 60
        while _cpu_s(child) - child_before < 0.3 and time.monotonic() < deadline:
            time.sleep(0.05)
        child_after, after = _cpu_s(child), contention.sample()
    finally:
        child.kill()
        child.wait()
    child_s = child_after - child_before
    # /proc counts CPU in clock ticks (10 ms), read at two moments a few microseconds apart: a tick's slack
    assert child_s >= 0.3 and after.own_s - before.own_s >= child_s - TICK_SLACK_S


def test_a_process_the_job_adopted_counts_as_its_own_work_until_every_job_that_adopted_it_releases_it():
    # a server the user runs on this machine (engine=openai) is no descendant of kvpipe's: started
    # here by a shell that exits at once, so that its process is nobody's child here; it spins until
    # it has used a second of CPU and is then stopped, so that what it used stays put while we read
    shell = subprocess.run(
        ["sh", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"], capture_output=True, text=True
    )  # fmt: skip
    spinner = psutil.Process(int(shell.stdout))
    try:
        me = psutil.Process()
        assert spinner.pid not in {child.pid for child in me.children(recursive=True)}
        deadline = time.monotonic() + 60
        while sum(spinner.cpu_times()[:2]) < 1.0 and time.monotonic() < deadline:
            time.sleep(0.05)
        spinner.suspend()
        used = sum(spinner.cpu_times()[:2])
        assert used >= 1.0
        base = contention.own_cpu_s(me)
        contention.adopt([spinner.pid])
        contention.adopt([spinner.pid])  # a second job of a sweep on the same server
        tick = 0.02  # /proc's CPU times come in hundredths of a second: two reads may round apart
        assert used - tick <= contention.own_cpu_s(me) - base < used + 0.5
        contention.release([spinner.pid])
        assert contention.own_cpu_s(me) - base >= used - tick  # the other job still holds it
        contention.release([spinner.pid])
        assert contention.own_cpu_s(me) - base < 0.5 and spinner.pid not in contention.ADOPTED
    finally:
        spinner.kill()
