"""A kvpipe process that stops at a chosen point of its work and waits there, so that a test's kill or
Ctrl-C lands at that point on any machine: no sleep that a slow machine overruns, no poll that a fast
one slips past (interleaved jobs record back to back, within one poll's interval)."""

from __future__ import annotations

import sys
from pathlib import Path

# Run as `python -c`: kvpipe as `python -m kvpipe` runs it, with one function of one module wrapped so
# that its call number `call` writes the marker file and then waits (for the test's signal) instead.
PAUSING = """
import importlib, pathlib, sys, time
module = importlib.import_module({module!r})
real, calls = getattr(module, {function!r}), []
def paused(*args, **kwargs):
    calls.append(None)
    if len(calls) == {call!r}:
        pathlib.Path({marker!r}).write_text("paused")
        while True:
            time.sleep(3600)
    return real(*args, **kwargs)
setattr(module, {function!r}, paused)
sys.argv = ["kvpipe", *{args!r}]
from kvpipe.cli import run
run()
"""


def kvpipe_paused_at(where: str, call: int, marker: Path, args: list[str]) -> list[str]:
    """The command line of `kvpipe ARGS` paused just before call number `call` (1: the first) of
    `where` ("package.module:function", looked up on the module at each call), once `marker` is written."""
    module, function = where.split(":")
    code = PAUSING.format(module=module, function=function, call=call, marker=str(marker), args=list(args))
    return [sys.executable, "-c", code]
