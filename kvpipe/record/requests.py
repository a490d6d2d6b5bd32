"""A served run's requests, each as it was served (result.json's `requests`, written by
kvpipe.measure.request_figures.request_rows), in three views beside result.json and in MLflow:

- `requests.json`, an MLflow table (the run's artifacts; `mlflow.load_table` reads it back);
- `requests.trace.json`, a Chrome trace: open it in https://ui.perfetto.dev or chrome://tracing,
  one track per request, its wait, prefill and decode apart, each pass a process;
- `requests_timeline.png`, the same as a picture: a bar per request from arrival to end, wrong
  answers marked.

Rebuilt from result.json's rows, so a job just run and one `kvpipe sync` uploads later log the same."""

from __future__ import annotations

import json
from pathlib import Path

ARTIFACT_DIR = "requests"
TABLE = f"{ARTIFACT_DIR}/requests.json"
TRACE_FILE, TIMELINE_FILE = "requests.trace.json", "requests_timeline.png"
# each request's three phases: (name, from, to) in its row's ms, and the timeline's colour
PHASES = (("wait", "arrival_ms", "admitted_ms", "#c9c9c9"), ("prefill", "admitted_ms", "first_token_ms", "#f0a04b"),
          ("decode", "first_token_ms", "end_ms", "#4c78a8"))  # fmt: skip
ARGS = (
    "prompt_tokens",
    "prefix_hit_tokens",
    "output_tokens",
    "ttft_ms",
    "tpot_ms",
    "correct",
    "within_targets",
)  # a trace event's
SHOWN_PASSES = 3  # the timeline's panels; the trace and the table keep every pass


def chrome_trace(rows: list[dict], title: str = "") -> dict:
    """The Chrome trace format's JSON object: a complete event ("X", microseconds) per phase of each
    request, its figures and verdict as the event's args; a process per pass, named with `title`."""
    events = []
    for row in rows:
        args = {key: row[key] for key in ARGS}
        for name, start, end, _ in PHASES:
            events.append({
                "name": name, "cat": "request", "ph": "X", "pid": row["pass"], "tid": row["request"],
                "ts": round(row[start] * 1e3, 1), "dur": round(max(row[end] - row[start], 0.0) * 1e3, 1), "args": args,
            })  # fmt: skip
    names = [
        {
            "name": "process_name",
            "ph": "M",
            "pid": p,
            "args": {"name": f"{title} · pass {p + 1}" if title else f"pass {p + 1}"},
        }
        for p in sorted({row["pass"] for row in rows})
    ]
    return {"traceEvents": names + events, "displayTimeUnit": "ms"}


def write_files(rows: list[dict], run_dir: Path, title: str) -> list[Path]:
    """The trace and the timeline beside result.json; the paths written."""
    trace = run_dir / TRACE_FILE
    trace.write_text(json.dumps(chrome_trace(rows, title)))
    timeline = run_dir / TIMELINE_FILE
    draw_timeline(rows, timeline, title)
    return [trace, timeline]


def log_requests(run_dir: Path, rows: list[dict]) -> None:
    """Inside the run's MLflow context: the rows as a table, and the files written beside result.json."""
    import mlflow
    import pandas as pd

    mlflow.log_table(pd.DataFrame(rows), TABLE)
    for name in (TRACE_FILE, TIMELINE_FILE):
        if (run_dir / name).is_file():
            mlflow.log_artifact(str(run_dir / name), ARTIFACT_DIR)


def draw_timeline(rows: list[dict], path: Path, title: str) -> None:
    """A panel per pass (the first SHOWN_PASSES), a row per request in arrival order: its wait,
    prefill and decode as bars; a red cross at the end of a wrong answer, a hollow ring where it
    missed the latency targets."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    every_pass = sorted({row["pass"] for row in rows})
    passes = every_pass[:SHOWN_PASSES]
    most = max(sum(row["pass"] == p for row in rows) for p in passes)
    height = max(2.8, 1.4 + 0.16 * most)
    # margins fixed in inches, not constrained layout: it drew each picture twice (0.25 s a run, 2-core VM)
    figure = Figure(figsize=(6.5 * len(passes), height))
    figure.subplots_adjust(left=0.75 / (6.5 * len(passes)), right=0.99, top=1 - 0.6 / height, bottom=0.95 / height,
                           wspace=0.08)  # fmt: skip
    axes = figure.subplots(1, len(passes), sharey=True, squeeze=False)[0]
    for ax, number in zip(axes, passes):
        mine = sorted((row for row in rows if row["pass"] == number), key=lambda row: row["arrival_ms"])
        ys = range(len(mine))
        for _, start, end, colour in PHASES:
            widths = [(row[end] - row[start]) / 1e3 for row in mine]
            ax.barh(ys, widths, left=[row[start] / 1e3 for row in mine], height=0.7, color=colour)
        for key, marker in (("correct", dict(marker="x", color="#d62728", ms=6)),
                            ("within_targets", dict(marker="o", mfc="none", mec="#d62728", ms=7))):  # fmt: skip
            missed = [(row["end_ms"] / 1e3, y) for y, row in zip(ys, mine) if row[key] is False]
            if missed:
                ax.plot(*zip(*missed), linestyle="none", **marker)
        ax.set_title(f"pass {number + 1} of {len(every_pass)}", fontsize=9)
        ax.set_xlabel("seconds from the first arrival")
    axes[0].invert_yaxis()  # the first arrival on top (the panels share the axis: once inverts them all)
    axes[0].yaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set_ylabel("request, in arrival order")
    handles = [Patch(color=colour, label=name) for name, _, _, colour in PHASES]
    if any(row["correct"] is False for row in rows):
        handles.append(axes[0].plot([], [], "x", color="#d62728", linestyle="none", label="wrong answer")[0])
    if any(row["within_targets"] is False for row in rows):
        handles.append(
            axes[0].plot([], [], "o", mfc="none", mec="#d62728", linestyle="none", label="missed a latency target")[0]
        )
    figure.legend(handles=handles, loc="lower center", ncols=len(handles), fontsize=8, frameon=False)
    figure.suptitle(title, fontsize=10)
    figure.savefig(path, dpi=110)
