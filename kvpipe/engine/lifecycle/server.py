"""An engine's server as kvpipe runs it: started on a free loopback port, its output kept in a log
file beside the run, waited for until it answers (engine.start_timeout_s), and stopped whatever
happens. Stopped by `stop()` (a job's end, a sweep's, a failure), by the exit handler (an exception
that ends the process, Ctrl-C), and by the kernel where kvpipe itself is killed: the server runs
under a guard (kvpipe.engine.lifecycle.guard) started with a parent-death signal (Linux's
PR_SET_PDEATHSIG), which stops the server's whole process group, so no server, nor any process a
server started (vLLM's engine core and worker), outlives the process that started it, even after a
SIGKILL."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import http.client
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

from kvpipe.engine.lifecycle.guard import STOP_WAIT_S  # after SIGTERM, how long before the guard's SIGKILL
from kvpipe.errors import KvpipeError

log = logging.getLogger(__name__)

RUNNING: set["EngineServer"] = set()  # servers this process started and has not stopped
GUARD = str(Path(__file__).with_name("guard.py"))  # run as a file: it imports nothing of kvpipe's
PORT_TRIES = 3  # a free port may be taken between finding it and the server binding it
# an exception's line in a server's log: "ValueError: No common block size for 16 (CPU_ATTN: ...)"
ERROR_LINE = re.compile(r"\b[A-Z]\w*(?:Error|Exception): .+")


class EngineServer:
    """One engine's server for one job: `command(port)` its command line."""

    def __init__(self, name: str, command, log_path: Path, ready_path: str, timeout_s: float, env=None):
        self.name, self.command, self.log_path = name, command, Path(log_path)
        self.ready_path, self.timeout_s = ready_path, timeout_s
        self.env = dict(env or {})  # added to kvpipe's environment for the server
        self.process: subprocess.Popen | None = None
        self.port: int | None = None
        self.start_s: float | None = None  # seconds from launch to its first ready answer

    def __enter__(self) -> "EngineServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "EngineServer":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(PORT_TRIES):
            self.port = free_port()
            started = time.perf_counter()
            self._launch(self.command(self.port))
            if self._wait_ready(started, last_try=attempt == PORT_TRIES - 1):
                self.start_s = time.perf_counter() - started
                log.info(
                    "%s ready on port %d in %.1f s (its log: %s)", self.name, self.port, self.start_s, self.log_path
                )
                return self
        raise AssertionError("unreachable: the last try raises")

    def _launch(self, words: list[str]) -> None:
        with open(self.log_path, "ab") as sink:
            given = "".join(f"{name}={value} " for name, value in self.env.items())
            sink.write(f"$ {given}{' '.join(words)}\n".encode())
            sink.flush()
            self.process = subprocess.Popen(
                [sys.executable, GUARD, *words], stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                env={**os.environ, **self.env}, preexec_fn=_die_with_parent,
            )  # fmt: skip
        RUNNING.add(self)

    def _wait_ready(self, started: float, last_try: bool) -> bool:
        """True once it answers; False where it lost its port to another process (a retry); else raises."""
        while True:
            code = self.process.poll()
            if code is not None:
                RUNNING.discard(self)
                tail = self.log_tail()
                if not last_try and ("bind" in tail.lower() or "address already in use" in tail.lower()):
                    return False
                raise KvpipeError(
                    f"{self.name}'s server stopped while starting (exit {code}){self.first_error()}; the last lines "
                    f"of {self.log_path}:\n{tail}"
                )
            if self._answers():
                return True
            if time.perf_counter() - started > self.timeout_s:
                self.stop()
                raise KvpipeError(
                    f"{self.name}'s server did not answer within engine.start_timeout_s={self.timeout_s:g}; "
                    f"the last lines of {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.1)

    def _answers(self) -> bool:
        try:
            return self.get(self.ready_path, timeout_s=2)[0] == 200
        except OSError:
            return False

    headers: dict[str, str] = {}  # what each request adds: nothing, on loopback

    def connection(self, timeout_s: float) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout_s)

    def path(self, path: str) -> str:
        return path  # its API at its root

    def get(self, path: str, timeout_s: float = 10) -> tuple[int, str]:
        """GET `path` of the running server: its status and text (OSError where it does not answer)."""
        return http_get(self, path, timeout_s)

    def stop(self) -> None:
        """SIGTERM to its guard, which stops the server's group (SIGKILL after STOP_WAIT_S); nothing
        where it is not running."""
        process, self.process = self.process, None
        RUNNING.discard(self)
        if process is None or process.poll() is not None:
            return
        process.terminate()  # the guard stops the server's group: SIGTERM, then SIGKILL after STOP_WAIT_S
        try:
            process.wait(2 * STOP_WAIT_S + 5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    @property
    def pid(self) -> int | None:
        """The guard's: the process kvpipe started, whose group holds the server's."""
        return self.process.pid if self.process else None

    def server_pids(self) -> list[int]:
        """The server's processes: the guard's descendants (llama-server alone; vLLM's API server,
        engine core and worker)."""
        import psutil

        if self.process is None:
            return []
        return [child.pid for child in psutil.Process(self.process.pid).children(recursive=True)]

    def local_pids(self) -> list[int]:
        """Processes beside kvpipe's own that work for its jobs: none, its server is kvpipe's descendant."""
        return []

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.is_file() else ""

    def first_error(self) -> str:
        """': ' and the first line of its log that names an error (a Python exception's last line), or ''
        (a server of several processes may log the cause far above its last lines)."""
        for line in self.log_text().splitlines():
            found = ERROR_LINE.search(line)
            if found:
                return f": {found.group(0)}"
        return ""

    def log_tail(self, count: int = 15) -> str:
        return "\n".join(deque(self.log_text().splitlines(), maxlen=count))


def http_get(server, path: str, timeout_s: float) -> tuple[int, str]:
    """GET `path` of a server (this module's or kvpipe.engine.lifecycle.remote's): its status and text."""
    connection = server.connection(timeout_s)
    try:
        connection.request("GET", server.path(path), headers=server.headers)
        response = connection.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        connection.close()


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _die_with_parent() -> None:
    """In the guard, before it runs: the kernel sends it SIGTERM when its parent dies, on which it
    stops the server's whole group."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@atexit.register
def stop_all() -> None:
    """Every server this process started and has not stopped (an exit through an exception or Ctrl-C)."""
    for server in list(RUNNING):
        server.stop()
