"""Shared fixtures: Hydra composition, a scratch launch dir, specs for tiny models, and what the
expensive end-to-end tests share: one real sweep, one migrated MLflow store, the embedded model.

Speed (2 cores, no GPU, `make test`: two pytest-xdist workers): the parallel part in 7-8 minutes, the
fast subset in ~50 s (docs/architecture.md, "Tests": their goals are 6 minutes and 60 s);
every run ends with a census of where its time went beside tests/budget.py (tests/census.py). Tests
marked slow run real jobs, load the embedded model or start kvpipe, Hydra or MLflow processes; the
fast ones check logic on configs, records and synthetic figures. An expensive fixture is made once per
session, on the one worker that runs every test using it (the xdist groups below). kvpipe's command
line runs in the worker's own process (kvpipe_here) wherever a process of its own is not what a test
checks."""

from __future__ import annotations

import atexit
import gc
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvpipe import disk_cache

# One torch thread, here and in the kvpipe processes the tests start (they inherit the environment),
# unless the caller sets OMP_NUM_THREADS. The tests' models are tiny, or the 135M embedded one on short
# inputs, so a second thread gains little; and whenever anything else runs on a 2-core machine, torch's
# two threads wait on each other: the same embedded-model job then takes ~15x longer (30 s, not 2 s).
# Speed is measured by benchmarks/, not by these tests.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# pytest keeps each test file with its asserts rewritten as bytecode in tests/__pycache__, unless
# writing bytecode is off ($PYTHONDONTWRITEBYTECODE, set on kvpipe's CI machines): then every worker
# parses and rewrites all ~90 files again at every run, ~5 s of CPU each. The suite writes its own.
sys.dont_write_bytecode = False
# A sweep's call after a contended one waits up to 20 s for the machine to go quiet; the tests' workers
# are each other's neighbours, so it never would: their sweeps measure on (the waiting is tested alone).
os.environ["KVPIPE_QUIET_WAIT_S"] = "0"
# kvpipe honours MLFLOW_TRACKING_URI like MLflow does; the tests choose their stores themselves.
os.environ.pop("MLFLOW_TRACKING_URI", None)
# Quality references on disk (kvpipe.disk_cache): one folder per test session, shared by the
# kvpipe processes the tests start, so no test reads what an earlier session or the user stored.
os.environ["KVPIPE_REFERENCE_DIR"] = tempfile.mkdtemp(prefix="kvpipe-references-")
atexit.register(shutil.rmtree, os.environ["KVPIPE_REFERENCE_DIR"], ignore_errors=True)
# torch.compile's inductor cache: the suite's own folder beside the converted model and the llama-server
# build in the per-user cache, kept between runs as they are, where torch's default (/tmp/torchinductor_$USER)
# goes with /tmp. The embedded static + compile test alone took 23 s with it warm, 56 s with it empty
# (2-core VM, 2026-12-07); a cold compile's cost is benchmarks/cache_strategies.py's compile_ms with an
# empty folder.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(disk_cache.cache_dir() / "inductor-tests"))

# Where the suite's time goes, printed at its end beside the budget (tests/census.py, tests/budget.py)
from census import (  # noqa: E402, F401
    pytest_addoption,
    pytest_configure,
    pytest_sessionfinish,
    pytest_terminal_summary,
    pytest_testnodedown,
)

from kvpipe.jobspec import Spec, compose, make_spec, register_schemas  # noqa: E402
from kvpipe.measure.memory import freeze_long_lived_objects  # noqa: E402

register_schemas()

REPO = Path(__file__).resolve().parents[1]


def compose_config(overrides: list[str] | None = None):
    """Compose conf/config.yaml with overrides, as `python -m kvpipe` would."""
    return compose(overrides or [])


def quoted_outside(owners: tuple[str, ...], names) -> list[str]:
    """Lines of kvpipe/ outside the `owners` folders that spell one of `names` as a quoted string
    (comments aside): where a registry's names leak into other stages."""
    offenders = []
    for path in sorted((REPO / "kvpipe").rglob("*.py")):
        relative = path.relative_to(REPO).as_posix()
        if relative.startswith(owners):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            for name in names:
                if re.search(rf"[\"']{name}[\"']", code):
                    offenders.append(f"{relative}:{number}: {line.strip()}")
    return offenders


def spec_for(*overrides: str) -> Spec:
    return make_spec(compose_config(list(overrides)))


TINY = ("model=tiny_random", "workload.max_new_tokens=6", "workload.warmup=0", "tracking=off", "quality=off")


@pytest.fixture
def tiny_spec():
    return lambda *extra: spec_for(*TINY, *extra)


def run_cli(args: list[str], cwd: Path, timeout: float = 300, process: bool = False) -> subprocess.CompletedProcess:
    """Run `kvpipe ARGS` in cwd, as a user would: by default in this process (kvpipe_here), with
    process=True as `python -m kvpipe ARGS` in a process of its own (within `timeout`)."""
    if not process:
        return kvpipe_here(args, cwd)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    env.pop("MLFLOW_TRACKING_URI", None)  # a test's own mlflow.set_tracking_uri exports it
    return subprocess.run(
        [sys.executable, "-m", "kvpipe", *args], cwd=cwd, env=env, text=True, capture_output=True, timeout=timeout
    )


def kvpipe_here(args: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """`kvpipe ARGS` through kvpipe.cli.main in this process, with the argv, cwd, environment, output
    streams and exit status a process would have, and the process state a job changes (logging,
    torch's threads, Hydra's global state, the environment) put back afterwards. A kvpipe process
    spends ~6 s of CPU importing torch, transformers, MLflow and Hydra before it does anything, and
    the suite starts dozens: here they are imported once per worker. What needs a process of its
    own (signals, kills, concurrent writers, launchers' processes) uses run_cli(process=True).
    `env`: the environment it runs with (else this process's), as a process's would be."""
    import contextlib
    import io
    import logging
    import traceback

    import torch
    from hydra.core.global_hydra import GlobalHydra

    from kvpipe import cli

    stdout, stderr = io.StringIO(), io.StringIO()
    saved_env, saved_argv, saved_cwd, saved_threads = (
        dict(os.environ),
        sys.argv[:],
        os.getcwd(),
        torch.get_num_threads(),
    )
    loggers = [logging.getLogger(), *(logging.getLogger(n) for n in ("kvpipe", "hydra"))]
    saved_logging = [(lg, lg.handlers[:], lg.level, lg.propagate) for lg in loggers]
    if env is not None:  # the environment given, as the user's: its MLFLOW_TRACKING_URI is their store
        os.environ.clear()
        os.environ.update(env)
    else:  # one a test's mlflow.set_tracking_uri exported into this process, not the user's
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    os.environ.pop("HYDRA_FULL_ERROR", None)
    sys.argv = ["kvpipe", *args]
    returncode = 0
    try:
        os.chdir(cwd)
        GlobalHydra.instance().clear()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                cli.main()
            except SystemExit as exc:  # as Python ends a process: a non-integer code is printed, status 1
                if exc.code is not None and not isinstance(exc.code, int):
                    print(exc.code, file=sys.stderr)
                returncode = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except Exception:  # noqa: BLE001 - a bug: the traceback and status 1, as a process would give
                traceback.print_exc()
                returncode = 1
    finally:
        GlobalHydra.instance().clear()
        os.chdir(saved_cwd)
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
        torch.set_num_threads(saved_threads)
        for logger, handlers, level, propagate in saved_logging:
            for handler in logger.handlers:
                if handler not in handlers:
                    handler.close()  # Hydra's per-job file handlers
            logger.handlers[:], logger.level, logger.propagate = handlers, level, propagate
    return subprocess.CompletedProcess(["kvpipe", *args], returncode, stdout.getvalue(), stderr.getvalue())


# --- one garbage collection per measured call, made cheap ---------------------------------------------


@pytest.fixture(autouse=True)
def _no_inherited_tracking_uri(monkeypatch):
    """mlflow.set_tracking_uri (called by tests that read a store) also sets $MLFLOW_TRACKING_URI,
    which kvpipe honours as the user's choice: each test starts without it."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


@pytest.fixture(autouse=True)
def _freeze_long_lived_objects():
    """kvpipe runs gc.collect() before every measured call (kvpipe.measure.memory), so that one call's
    peak does not hide in the last one's garbage. In this process, once a first job has imported
    torch's compiler stack, transformers, mlflow and pandas, a full collection walks ~600,000
    long-lived objects: ~0.5 s a call, over a minute in all. After such a burst of imports, freeze
    what is alive (gc.freeze: modules and classes, mostly) so that collections skip it; garbage made
    afterwards is collected as before."""
    if len(gc.get_objects()) > 50_000:  # frozen objects are not counted: this is what a collection walks
        freeze_long_lived_objects()
    yield


# --- the embedded model, loaded once --------------------------------------------------------------------


@pytest.fixture(scope="session")
def embedded_model():
    """The embedded model as the default config loads it, kept by kvpipe's per-process model cache
    (kvpipe.model.load) for the tests that use it. That cache holds one model at a time, so these
    tests run together, first (pytest_collection_modifyitems below): one load per session."""
    from kvpipe import model as models

    return models.load(spec_for().model)


# Fixtures that cost seconds to make: under pytest-xdist (`make test` runs two workers, --dist loadgroup)
# the tests that share one run on one worker, which makes it once. Session fixtures are named here;
# a module's expensive fixture (MODULE_FIXTURES) groups the tests of its module that use it.
SHARED_FIXTURES = ("embedded_model", "tiny_sweep")
MODULE_FIXTURES = (
    "reduced", "passkey_sweep", "failed_sweep", "good_model", "advised", "auth_server", "labelled_jobs", "kvpipe_kept",
    "kvpipe_answers",
)  # fmt: skip


def xdist_group(item) -> str | None:
    if own := item.get_closest_marker("xdist_group"):  # a test that names its group (the docs run: a page's)
        return own.args[0]
    names = getattr(item, "fixturenames", ())
    shared = next((name for name in SHARED_FIXTURES if name in names), None)
    if shared is None and any(name in names for name in MODULE_FIXTURES):
        return item.module.__name__
    return shared


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the groups
def pytest_collection_modifyitems(items):
    """Each test that shares an expensive fixture joins that fixture's xdist group. The groups come
    first, the embedded model's first of all (a stable sort: the rest keep their order): a worker
    starts on the longest work while the other takes the many short tests, and the embedded model's
    tests run one after another, since a tiny_random job in between would evict it from kvpipe's
    one-model cache."""
    groups = {item: xdist_group(item) for item in items}
    for item, group in groups.items():
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: (groups[item] != "embedded_model", groups[item] is None))


# --- MLflow stores ----------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def _migrated_store(tmp_path_factory) -> Path:
    """An empty MLflow SQLite store, made once: MLflow builds a new store by running its schema
    migrations, ~6 s on 2 cores, in every process that creates one."""
    from mlflow.tracking import MlflowClient

    db = tmp_path_factory.mktemp("migrated_store") / "mlflow.db"
    MlflowClient(f"sqlite:///{db}").search_experiments()  # creates and migrates the store
    return db


@pytest.fixture(scope="session")
def existing_store(_migrated_store):
    """existing_store(launch_dir): give launch_dir an MLflow store that exists already (a copy of an empty,
    migrated one) where kvpipe looks by default, outputs/mlflow.db, and return its path; or at `db`.
    For tests about what kvpipe records, not about MLflow making a store: two concurrent jobs
    (test_resilience) and a first run's log (test_pipeline) start without one, and the first run makes it."""

    def give(launch_dir: Path, db: str = "outputs/mlflow.db") -> Path:
        (launch_dir / db).parent.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copyfile(_migrated_store, launch_dir / db))

    return give


# --- `make mlflow-server`, started and stopped ----------------------------------------------------------


@contextmanager
def mlflow_server(store: Path, *make_args: str, env: dict | None = None):
    """`make mlflow-server MAKE_ARGS` on loopback at a free port, its store in `store` and its output
    in store/server.log; yields its URL once /health answers, and stops make and the server below it
    afterwards (test_launchers: a plain server; test_auth: basic-auth)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store.mkdir(parents=True, exist_ok=True)
    command = ["make", "-s", "-C", str(REPO), "mlflow-server", *make_args, f"MLFLOW_PORT={port}", f"MLFLOW_DIR={store}"]
    with open(store / "server.log", "w") as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=2).close()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, (store / "server.log").read_text()[-3000:]
                time.sleep(0.5)
        yield url
    finally:
        _stop_group(proc)


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to make and the server below it, then wait until every process of the group is gone
    (the server outlives make by a few seconds), SIGKILL after 30 s."""
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)


# --- one real sweep for the session -------------------------------------------------------------------

# hqq rather than quanto: quanto JIT-loads a C++ extension in a process's first quantized job.
# Dense caches ignore backend.nbits (duplicates: skipped), and hqq has no 5-bit form (an invalid
# combination: skipped with its reason), so of the 9 jobs 4 run: dynamic, static, hqq int2, hqq int4.
SWEEP = [
    "-m",
    "model=tiny_random",
    "workload.max_new_tokens=3",
    "workload.warmup=0",
    "quality=on",
    "quality.windows=2",
    "quality.scored_tokens=16",
    "workload.prompts=[Hi.]",
    "cache=dynamic,static,quantized",
    "backend=hqq",
    "backend.nbits=2,4,5",
]


@pytest.fixture(scope="session")
def tiny_sweep(tmp_path_factory, existing_store) -> SimpleNamespace:
    """One real sweep for the session, read by test_sweep, test_compare and test_recommend:
    launch_dir, sweep_dir (its Hydra multirun dir), proc (the finished `python -m kvpipe -m`)."""
    from kvpipe.model import loading

    launch_dir = tmp_path_factory.mktemp("tiny_sweep")
    existing_store(launch_dir)
    # test_sweep counts the sweep's model loads: none resident from an earlier test in this process
    loading._LOADED.clear()
    proc = run_cli(SWEEP, cwd=launch_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (sweep_dir,) = (launch_dir / "outputs" / "multiruns").glob("*/*")
    return SimpleNamespace(launch_dir=launch_dir, sweep_dir=sweep_dir, proc=proc)
