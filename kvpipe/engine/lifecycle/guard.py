"""`python guard.py SERVER_WORDS...`: an engine's server run under a guard that stops the server and
every process it started, whatever happens to kvpipe. kvpipe starts the guard with a parent-death
signal (SIGTERM) from the kernel; the guard runs the server in a process group of its own. A
parent-death signal reaches only the process it was set on (it is not inherited across a fork), so
where a server starts processes of its own (vLLM: its engine core and its worker, which outlived a
SIGKILLed kvpipe by minutes), only a signal to the server's whole group stops them all.

On SIGTERM or SIGINT (kvpipe stopping the server, or dying), or once the server exits on its own:
SIGTERM to the server's group, up to STOP_WAIT_S for every process in it to end, then SIGKILL to what
is left. The guard is their child subreaper (Linux's PR_SET_CHILD_SUBREAPER): a process the server
started and left behind becomes the guard's child, so the guard reaps every one of them, and none is
left a zombie for an init that may not reap (a container's). It exits with the server's status.

Run as a file, not as a module of kvpipe: it imports nothing of kvpipe's (a few MB, milliseconds)."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

STOP_WAIT_S = 10.0
PR_SET_CHILD_SUBREAPER = 36


def main(words: list[str]) -> int:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1)
    server = subprocess.Popen(words, start_new_session=True)  # its output is the guard's: the server's log
    asked: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda number, frame: asked.append(number))
    while server.poll() is None and not asked:
        time.sleep(0.05)
    code = server.returncode
    _signal_group(server.pid, signal.SIGTERM)
    if not _reaped_every_child(STOP_WAIT_S):
        _signal_group(server.pid, signal.SIGKILL)
        _reaped_every_child(STOP_WAIT_S)
    if code is None:  # stopped by a signal before the server ended
        return 128 + asked[0]
    return code if code >= 0 else 128 - code


def _signal_group(group: int, signum: int) -> None:
    try:
        os.killpg(group, signum)
    except ProcessLookupError:  # every process of the group has ended
        pass


def _reaped_every_child(within_s: float) -> bool:
    """Whether every child of the guard (the server, and what it left behind) has ended and been reaped."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            time.sleep(0.05)
    return False


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
