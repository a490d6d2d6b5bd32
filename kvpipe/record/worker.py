"""MLflow's side of a sweep, in a process of its own.

Before its first job, a sweep's process paid ~2.4 s on 2 cores to import MLflow and open its store
for the parent run, and at its end ~0.8 s to import pandas and matplotlib for the compare. Imports
hold the interpreter's lock, so a thread cannot hide them; a second process can. A sweep whose jobs
run in its own process starts this worker as it opens: the worker imports MLflow, opens the parent
run and imports what the compare needs, while the sweep's process imports torch and transformers,
which its first job needs anyway. Every later call is waited for, so the worker never runs while a
job measures. What the worker imports ahead of its calls, the sweep names (import_modules): this
module knows nothing above kvpipe.record.

A call made in the worker gives back what it printed and logged, replayed here, so the sweep's
output and its jobs' log files read as if the call had run in the sweep's process. Ctrl-C is the
sweep's: the worker ignores it, so that it can still close the parent run as KILLED.

The worker is `python -m kvpipe.record.worker`, talking over two pipes: not multiprocessing's spawn,
which would run the caller's main module again in the worker.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import logging
import os
import signal
import subprocess
import sys
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

from kvpipe._startup import collector_paused
from kvpipe.errors import KvpipeError
from kvpipe.record.store import TrackingUnavailable


class WorkerFailed(RuntimeError):
    """An unexpected error in a call the worker made: its type, message and traceback."""


@dataclass
class Reply:
    value: object = None
    error: BaseException | None = None
    stdout: str = ""
    stderr: str = ""
    records: list[logging.LogRecord] = field(default_factory=list)


@dataclass
class _Worker:
    process: subprocess.Popen
    send: Connection
    receive: Connection
    waiting: int = 0  # calls sent whose replies are not read yet


_worker: _Worker | None = None
_caller: int | None = None  # in a worker: the sweep's process, which writes back what the calls return


def start() -> None:
    """Start the worker. Calls made through `forwarded` functions go to it from now on."""
    global _worker
    if _worker is not None:
        return
    to_worker, from_caller = os.pipe()
    to_caller, from_worker = os.pipe()
    process = subprocess.Popen(
        [sys.executable, "-m", "kvpipe.record.worker", str(to_worker), str(from_worker)],
        pass_fds=(to_worker, from_worker),
    )
    os.close(to_worker)
    os.close(from_worker)
    _worker = _Worker(process, Connection(from_caller, readable=False), Connection(to_caller, writable=False))


def stop() -> None:
    """Calls run in this process again. The worker, with nothing left to do, exits on its own."""
    global _worker
    worker, _worker = _worker, None
    if worker is not None:
        worker.send.close()
        worker.receive.close()


def active() -> bool:
    return _worker is not None


def caller() -> int | None:
    """In a tracking worker, the process whose calls it runs; elsewhere None."""
    return _caller


def submit(module: str, name: str, *args, **kwargs) -> None:
    """Send `module.name(*args, **kwargs)` to the worker and return at once; `result` reads its
    answer. Answers come back in the order the calls were sent."""
    try:
        _worker.send.send((module, name, args, kwargs))
    except (OSError, ValueError) as exc:
        _lost(exc)
    _worker.waiting += 1


def result():
    """What the oldest call not yet read returned (or raised), after replaying what it printed and logged."""
    try:
        reply: Reply = _worker.receive.recv()
    except (EOFError, OSError) as exc:
        _lost(exc)
    _worker.waiting -= 1
    sys.stdout.write(reply.stdout)
    sys.stderr.write(reply.stderr)
    for record in reply.records:
        logger = logging.getLogger(record.name)
        if logger.isEnabledFor(record.levelno):
            logger.handle(record)
    if reply.error is not None:
        raise reply.error
    return reply.value


def run(module: str, name: str, *args, **kwargs):
    """`module.name(*args, **kwargs)`: in the worker if one is started (its module imported only
    there), else here."""
    if _worker is None:
        return _target(module, name)(*args, **kwargs)
    submit(module, name, *args, **kwargs)
    while _worker.waiting > 1:  # an earlier call's answer its caller never read (Ctrl-C came first): drop it
        with contextlib.suppress(Exception):
            result()
    return result()


def forwarded(fn):
    """`fn` runs in the worker while one is started, else here; either way the caller sees the same
    return value, exceptions, output and log records."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if _worker is None:
            return fn(*args, **kwargs)
        return run(fn.__module__, fn.__qualname__, *args, **kwargs)

    return call


def import_modules(names: tuple[str, ...]) -> None:
    """Run in the worker, so that a later call there finds the modules its caller names imported
    already; with the collector off, as kvpipe.model.import_libraries imports (the modules' objects
    live as long as the worker)."""
    with collector_paused():
        for name in names:
            with contextlib.suppress(ImportError):  # a warm-up only: what needs it fails there, with its error
                importlib.import_module(name)


def _lost(exc: BaseException):
    """An outage, as a store that went away is: the caller's result waits on disk for `kvpipe sync`."""
    stop()
    raise TrackingUnavailable(f"the sweep's tracking worker stopped ({exc!r}); later calls run in this process")


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        # args and exc_info may not pickle: the message and traceback travel as text
        record.msg, record.args = record.getMessage(), None
        if record.exc_info:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        self.records.append(record)


def _target(module: str, qualname: str):
    """module.qualname: a function, or a method of a module's object (`root.warning` of logging)."""
    target = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def _call(module: str, qualname: str, args: tuple, kwargs: dict) -> Reply:
    target = _target(module, qualname)  # a @forwarded one runs itself here: the worker has no worker
    out, err, collect = io.StringIO(), io.StringIO(), _Collect()
    root = logging.getLogger()
    root.addHandler(collect)
    reply = Reply()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            reply.value = target(*args, **kwargs)
    except KvpipeError as exc:  # the user's to read, as if raised here
        reply.error = exc if _pickles(exc) else KvpipeError(str(exc))
    except Exception as exc:  # noqa: BLE001 - any other type may not unpickle in the sweep's process
        reply.error = WorkerFailed(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    finally:
        root.removeHandler(collect)
    reply.stdout, reply.stderr, reply.records = out.getvalue(), err.getvalue(), collect.records
    return reply


def _pickles(exc: BaseException) -> bool:
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return True
    except Exception:  # noqa: BLE001 - an exception class whose __init__ takes other arguments
        return False


def _serve(receive: Connection, send: Connection) -> None:
    """The worker's loop: a call, its reply, until the sweep closes the pipe."""
    global _caller
    _caller = os.getppid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.getLogger().setLevel(logging.INFO)
    while True:
        try:
            module, name, args, kwargs = receive.recv()
        except EOFError:  # the sweep is done with it
            break
        reply = _call(module, name, args, kwargs)
        try:
            send.send(reply)
        except OSError:  # the sweep stopped waiting (it ended, or was interrupted): its answers go nowhere
            break
    # Every write is committed; MLflow's exit handlers would only cost the machine a second
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    from kvpipe.record import worker  # by its own name, so that the Reply it sends unpickles in the caller

    worker._serve(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False))
