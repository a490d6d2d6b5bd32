"""A server kvpipe did not start (engine=openai): an OpenAI-compatible endpoint the user runs,
reached at its base URL (http or https, any host), with the API key from an environment variable
where it asks for one. kvpipe waits for it to answer (engine.start_timeout_s), sends it requests,
and neither stops it nor reads its processes: it is the user's."""

from __future__ import annotations

import http.client
import time
from urllib.parse import urlsplit

from kvpipe.engine.lifecycle.server import http_get
from kvpipe.errors import KvpipeError

LOOPBACK = ("127.0.0.1", "localhost", "::1")


class RemoteServer:
    """The endpoint at `base_url` (`http://127.0.0.1:8000/v1`): what EngineServer offers a job,
    without starting or stopping anything."""

    log_path = None  # its log is the user's
    start_s = None  # kvpipe did not start it

    def __init__(self, name: str, base_url: str, ready_path: str, timeout_s: float, api_key: str | None = None):
        parts = urlsplit(base_url)
        self.name, self.base_url, self.ready_path, self.timeout_s = name, base_url, ready_path, timeout_s
        self.secure, self.host, self.port = parts.scheme == "https", parts.hostname, parts.port
        self.prefix = parts.path.rstrip("/")  # the API's root on that server: /v1
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def __enter__(self) -> RemoteServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> RemoteServer:
        """Waits until it answers its ready path; one line with its last answer where it never does."""
        started, last = time.perf_counter(), ""
        while time.perf_counter() - started <= self.timeout_s:
            try:
                status, text = self.get(self.ready_path, timeout_s=5)
            except OSError as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                if status == 200:
                    return self
                last = f"{status} {text[:200]!r}"
                if status in (401, 403):  # no wait makes a refused key good
                    break
            time.sleep(0.5)
        raise KvpipeError(
            f"the server at engine.base_url={self.base_url} did not answer GET {self.prefix}{self.ready_path} "
            f"within engine.start_timeout_s={self.timeout_s:g} (last: {last or 'no answer'})"
        )

    def connection(self, timeout_s: float) -> http.client.HTTPConnection:
        kind = http.client.HTTPSConnection if self.secure else http.client.HTTPConnection
        return kind(self.host, self.port, timeout=timeout_s)

    def path(self, path: str) -> str:
        return f"{self.prefix}{path}"

    def get(self, path: str, timeout_s: float = 10) -> tuple[int, str]:
        """GET `path` under its base URL: its status and text (OSError where it does not answer)."""
        return http_get(self, path, timeout_s)

    def stop(self) -> None:
        """Nothing: the server is the user's."""

    def local_pids(self) -> list[int]:
        """Its processes where it listens on this machine and they can be seen (else none): their
        work is the job's, not a neighbour's, in the contention check (kvpipe.job.engine_served)."""
        import psutil

        if self.host not in LOOPBACK:
            return []
        try:
            listening = psutil.net_connections(kind="tcp")
        except (psutil.Error, OSError):  # another user's sockets: not ours to read
            return []
        port = self.port or (443 if self.secure else 80)
        return sorted({c.pid for c in listening if c.status == psutil.CONN_LISTEN and c.laddr.port == port and c.pid})

    def server_pids(self) -> list[int]:
        return []  # its processes are not kvpipe's to read (they may be on another machine)

    def log_text(self) -> str:
        return ""
