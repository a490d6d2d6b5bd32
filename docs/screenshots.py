"""The manual and the MLflow UI as a user sees them: pages opened in headless Chromium, saved as PNGs.

    python docs/screenshots.py                                # the built site (make docs) and outputs/mlflow.db
    python docs/screenshots.py --store /path/to/outputs       # another store's MLflow UI

Takes the docs' home page, the metrics page, and the MLflow experiment page of the store's `kvpipe`
experiment (its runs table; a sweep's parent run shows its compare table as its description) and its
latest sweep's parent run. Writes outputs/screenshots/*.png. Needs Chromium (`/usr/bin/chromium`,
Debian's package `chromium`); nothing here reaches beyond loopback.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from kvpipe.record.server import RUNS_VIEW  # the runs table, not MLflow's GenAI view

REPO = Path(__file__).resolve().parents[1]
# As the machine's own probe starts it: no sandbox as root, and no background connections, which a
# closed network refuses many at a time
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--hide-scrollbars",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def screenshot(url: str, path: Path, size: str = "1400,1000", wait_ms: int = 8000) -> Path:
    """One page, rendered for `wait_ms` of virtual time (a JavaScript app fetches and draws first)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    profile = path.parent / ".chromium-profile"
    subprocess.run(
        ["chromium", *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={size}",
         f"--virtual-time-budget={wait_ms}", f"--screenshot={path}", url],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    print(f"{url} -> {path}")
    return path


@contextlib.contextmanager
def served_site(site: Path):
    """The built site on a loopback port, in a thread."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


@contextlib.contextmanager
def mlflow_ui(store: Path):
    """kvpipe's MLflow UI (make ui) over `store`, until the block ends."""
    port = free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    command = [sys.executable, "-m", "kvpipe.record.server", "--ui", "--host", "127.0.0.1", "--port", str(port),
               "--dir", str(store)]  # fmt: skip
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"{url}/health", timeout=1)
                break
            time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def experiment_pages(store: Path) -> tuple[str, str | None]:
    """The `kvpipe` experiment's id and its latest sweep's parent run id (None without one)."""
    import mlflow
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("kvpipe")
    if experiment is None:
        raise SystemExit(f"no kvpipe experiment in {store / 'mlflow.db'}: run a sweep first")
    parents = client.search_runs([experiment.experiment_id], "tags.`kvpipe.sweep` = 'true'", max_results=1,
                                 order_by=["attributes.start_time DESC"])  # fmt: skip
    del mlflow
    return experiment.experiment_id, parents[0].info.run_id if parents else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--site", type=Path, default=REPO / "outputs" / "site", help="the built site (make docs)")
    parser.add_argument("--store", type=Path, default=REPO / "outputs", help="folder holding mlflow.db")
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "screenshots")
    args = parser.parse_args()
    with served_site(args.site) as site:
        screenshot(f"{site}/", args.out / "docs_home.png")
        screenshot(f"{site}/metrics/", args.out / "docs_metrics.png", size="1400,1400")
    experiment, parent = experiment_pages(args.store)
    with mlflow_ui(args.store) as ui:
        screenshot(f"{ui}/#/experiments/{experiment}?{RUNS_VIEW}", args.out / "mlflow_experiment.png", wait_ms=15000)
        if parent:
            screenshot(f"{ui}/#/experiments/{experiment}/runs/{parent}?{RUNS_VIEW}", args.out / "mlflow_sweep_parent.png",
                       size="1400,1400", wait_ms=15000)  # fmt: skip


if __name__ == "__main__":
    main()
