"""A kvpipe process that stops at a chosen point of its work and waits there, so that a test's kill,
Ctrl-C or change to the world lands at that point on any machine: no sleep that a slow machine
overruns, no poll that a fast one slips past (interleaved jobs record back to back, within one poll's
interval). It waits for as long as its marker file exists: a test that deletes it lets it go on."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

# Run as `python -c`: kvpipe as `python -m kvpipe` runs it, with one function of one module wrapped so
# that its call number `call` first writes the marker file and waits while it exists.
PAUSING = """
import importlib, pathlib, sys, time
module = importlib.import_module({module!r})
real, calls = getattr(module, {function!r}), []
def paused(*args, **kwargs):
    calls.append(None)
    if len(calls) == {call!r}:
        marker = pathlib.Path({marker!r})
        marker.write_text("paused")
        while marker.exists():
            time.sleep(0.05)
    return real(*args, **kwargs)
setattr(module, {function!r}, paused)
sys.argv = ["kvpipe", *{args!r}]
from kvpipe.cli import run
run()
"""


def kvpipe_paused_at(where: str, call: int, marker: Path, args: list[str]) -> list[str]:
    """The command line of `kvpipe ARGS` paused just before call number `call` (1: the first) of
    `where` ("package.module:function", looked up on the module at each call): it writes `marker`, then
    waits until the marker is deleted (or the process is killed)."""
    module, function = where.split(":")
    code = PAUSING.format(module=module, function=function, call=call, marker=str(marker), args=list(args))
    return [sys.executable, "-c", code]


def wait_until_paused(proc: subprocess.Popen, marker: Path, timeout_s: float = 120) -> None:
    """Until a process started paused writes its marker (its output, should it end first); the timeout
    only guards against a hang."""
    deadline = time.monotonic() + timeout_s
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if not marker.exists():
        ended = proc.poll() is not None
        output = (proc.communicate(timeout=30)[0] or "") if ended else "still running, not paused"
        raise AssertionError(f"the process never reached its kill point: {output[-3000:]}")
