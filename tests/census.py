"""Where the suite's time goes, printed at the end of every run beside its budget (tests/budget.py).

Per test file: the wall time its tests held a worker (setup, call and teardown), and the CPU time of
the child processes they waited for. Per kind: a sampler thread in each worker looks at the main
thread's stack 20 times a second and files each sample under the innermost thing it is doing
(KINDS: importing, waiting on a child process, loading a model, scoring quality, generating, ...),
so "imports" is what the worker spent importing, wherever in a test that happened.

The budget is watched, never asserted: a timing check that can fail on a busy machine would be a test
that fails by chance. `make test-census` prints every file; a plain run prints the largest ones and
every file over its budget or without one. Under pytest-xdist each worker measures its own share and
sends it to the controller (workeroutput), which adds them up.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import budget
import psutil
import pytest

SAMPLE_EVERY_S = 0.05

# (kind, what marks it on the stack): the innermost frame that matches decides; order breaks ties
# within one frame only. A file fragment matches a frame's file, "file:function" its function too.
KINDS = (
    ("imports", ("<frozen importlib._bootstrap", "importlib/__init__.py:import_module")),
    ("child processes", ("subprocess.py:wait", "subprocess.py:communicate", "subprocess.py:_wait")),
    ("compiling", ("torch/_inductor/", "torch/_dynamo/")),
    ("model loads", ("kvpipe/model/loading.py:load", "kvpipe/model/embedded.py")),
    ("quality", ("kvpipe/measure/quality.py",)),
    ("generation", ("kvpipe/job/generate.py", "transformers/generation/")),
    ("garbage collection", ("kvpipe/measure/memory.py",)),
    ("MLflow", ("/mlflow/", "/sqlalchemy/", "/alembic/")),
    ("Hydra", ("/hydra/", "/omegaconf/")),
    ("plots", ("/matplotlib/",)),
)
# kvpipe's own Python (a job's set-up, its workload's prompts, its records), where no kind above is inside it
KVPIPE, KVPIPE_CODE = "kvpipe's own code", str(Path(__file__).resolve().parents[1] / "kvpipe") + "/"


def _kind_of(frame) -> str:
    """The kind of the innermost frame (from the top of the stack down) that KINDS names. Hydra runs
    kvpipe's jobs (its launcher calls the task function), so a sample in kvpipe's own code under
    Hydra's frames, with nothing more specific inside, is kvpipe's, not Hydra's; so is one that no
    kind names at all."""
    in_kvpipe = False
    while frame is not None:
        code = frame.f_code
        where = code.co_filename.replace(os.sep, "/")
        for kind, marks in KINDS:
            for mark in marks:
                file_part, _, function = mark.partition(":")
                if file_part in where and (not function or function == code.co_name):
                    return KVPIPE if kind == "Hydra" and in_kvpipe else kind
        in_kvpipe = in_kvpipe or where.startswith(KVPIPE_CODE)
        frame = frame.f_back
    return KVPIPE if in_kvpipe else "other"


class _Sampler(threading.Thread):
    """Counts the main thread's samples per kind."""

    def __init__(self):
        super().__init__(name="census-sampler", daemon=True)
        self.main_id = threading.main_thread().ident
        self.counts: Counter[str] = Counter()
        self.stopped = threading.Event()

    def run(self):
        while not self.stopped.wait(SAMPLE_EVERY_S):
            frame = sys._current_frames().get(self.main_id)
            if frame is not None:
                self.counts[_kind_of(frame)] += 1


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Census:
    """One process's census: per file, wall and children's CPU; per kind, sampled seconds."""

    def __init__(self):
        self.started = time.monotonic() - (time.time() - psutil.Process().create_time())  # the process's start
        self.first_test = None
        self.files: dict[str, dict[str, float]] = defaultdict(
            lambda: {"wall_s": 0.0, "children_cpu_s": 0.0, "tests": 0}
        )
        self.sampler = _Sampler()
        self.sampler.start()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item):
        if self.first_test is None:
            self.first_test = time.monotonic()
        started, children = time.monotonic(), _children_cpu_s()
        yield
        row = self.files[item.nodeid.split("::")[0]]
        row["wall_s"] += time.monotonic() - started
        row["children_cpu_s"] += _children_cpu_s() - children
        row["tests"] += 1

    def finish(self) -> dict:
        self.sampler.stopped.set()
        return {
            "files": dict(self.files),
            "kinds_s": {k: n * SAMPLE_EVERY_S for k, n in self.sampler.counts.items()},
            "before_first_test_s": (self.first_test or time.monotonic()) - self.started,
            "session_s": time.monotonic() - self.started,
        }


def merged(parts: list[dict]) -> dict:
    files: dict[str, dict[str, float]] = defaultdict(lambda: {"wall_s": 0.0, "children_cpu_s": 0.0, "tests": 0})
    kinds: Counter[str] = Counter()
    for part in parts:
        for name, row in part["files"].items():
            for key, value in row.items():
                files[name][key] += value
        kinds.update(part["kinds_s"])
    return {
        "files": dict(files),
        "kinds_s": dict(kinds),
        "workers": len(parts),
        "before_first_test_s": max((p["before_first_test_s"] for p in parts), default=0.0),
    }


def report(census: dict, wall_s: float, part: str | None, every_file: bool) -> list[str]:
    """The census as lines: the run's wall time against its budget (`part`: "fast" for make test-fast,
    "parallel" for make test's parallel part, None for any other selection), the kinds, then the files."""
    suite_budget = {"fast": budget.FAST_S, "parallel": budget.PARALLEL_S}.get(part)
    files = sorted(census["files"].items(), key=lambda kv: -kv[1]["wall_s"])
    worker_s = sum(row["wall_s"] for _, row in files) or 1.0
    within = (
        ""
        if suite_budget is None
        else f" against a budget of {suite_budget:.0f} s" + (" (over)" if wall_s > suite_budget else "")
    )
    lines = [
        f"census: {wall_s:.0f} s wall on {census['workers']} worker(s){within}; "
        f"{worker_s:.0f} worker-seconds in tests, {census['before_first_test_s']:.0f} s before a worker's first test",
        "  by kind (sampled, all workers): "
        + ", ".join(f"{k} {v:.0f} s" for k, v in sorted(census["kinds_s"].items(), key=lambda kv: -kv[1])),
        f"  {'file':<44} {'tests':>5} {'worker s':>9} {'share':>6} {'children cpu s':>15} {'budget s':>9}",
    ]
    shown = 0
    for name, row in files:
        short = name.removeprefix("tests/")
        allowed = budget.FILES_S.get(short) if part == "parallel" else None
        over = allowed is not None and row["wall_s"] > allowed
        if not (every_file or shown < 12 or over or (allowed is None and part == "parallel" and row["wall_s"] > 5)):
            continue
        shown += 1
        mark = "  over" if over else ("  no budget" if allowed is None and part == "parallel" else "")
        lines.append(
            f"  {short:<44} {row['tests']:>5.0f} {row['wall_s']:>9.1f} {row['wall_s'] / worker_s:>6.1%} "
            f"{row['children_cpu_s']:>15.1f} {'' if allowed is None else f'{allowed:.0f}':>9}{mark}"
        )
    if shown < len(files):
        lines.append(f"  … {len(files) - shown} more files, all within budget (make test-census lists every one)")
    return lines


# --- the plugin -------------------------------------------------------------------------------------------


def pytest_addoption(parser):
    parser.addoption("--census-all", action="store_true", help="census: list every test file, not only the largest")
    parser.addoption("--census-json", default=None, help="census: also write it as JSON to this path")


def pytest_configure(config):
    config._census_parts = []
    config._census_started = time.monotonic()
    workers = getattr(config.option, "numprocesses", None)
    config._census = None
    if hasattr(config, "workerinput") or not workers:  # a process that runs tests, not xdist's controller
        config._census = Census()
        config.pluginmanager.register(config._census, "census-recorder")


def pytest_sessionfinish(session):
    config = session.config
    if config._census is None:
        return
    part = config._census.finish()
    if hasattr(config, "workeroutput"):  # an xdist worker: the controller adds it up
        config.workeroutput["census"] = json.dumps(part)
    elif not config._census_parts:  # no workers: this process ran the tests
        config._census_parts.append(part)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's: a worker has finished
def pytest_testnodedown(node, error):
    if "census" in getattr(node, "workeroutput", {}):
        node.config._census_parts.append(json.loads(node.workeroutput["census"]))


def pytest_terminal_summary(terminalreporter, config):
    if hasattr(config, "workerinput") or not config._census_parts:
        return
    census = merged(config._census_parts)
    marks = config.option.markexpr or ""
    part = "fast" if "not slow" in marks else ("parallel" if "not alone" in marks else None)
    wall_s = time.monotonic() - config._census_started
    for line in report(census, wall_s, part, config.option.census_all):
        terminalreporter.write_line(line)
    if config.option.census_json:
        kept = Path(config.option.census_json)
        kept.parent.mkdir(parents=True, exist_ok=True)  # outputs/ in a fresh clone, before anything ran
        kept.write_text(json.dumps({**census, "wall_s": wall_s}, indent=1))
