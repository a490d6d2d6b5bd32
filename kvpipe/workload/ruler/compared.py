"""ruler's part of `compare`: each run's accuracy per task and context length, with the mean over
tasks, as a table, and its task x length heatmap beside the others'; read from the runs' stepped
series (scoring.stepped_metrics)."""

from __future__ import annotations

from pathlib import Path

from kvpipe.workload import _heatmap
from kvpipe.workload._compared import RecordedRun, Section
from kvpipe.workload.ruler.heatmap import LAYOUT
from kvpipe.workload.ruler.scoring import TASK_SERIES, task_metrics

TITLE = "RULER accuracy by task and context length"
HEATMAPS_FILE = "ruler_heatmaps.png"
MEAN = "mean over tasks"


def section(runs: list[RecordedRun], out_dir: Path | None) -> Section:
    """The table, and with out_dir the heatmaps written there."""
    tables = [(run, cells(run)) for run in runs]
    lengths = sorted({cell["context_tokens"] for _, found in tables for cell in found})
    rows = []
    for run, found in tables:
        by_task = {(cell["task"], cell["context_tokens"]): cell["accuracy"] for cell in found}
        for task in LAYOUT.down_order({task for task, _ in by_task}) + [MEAN]:
            overall = _with_interval(run.metrics, "ruler_accuracy" if task == MEAN else task_metrics(task)[0])
            rows.append([run.label, task, *(_percent(by_task.get((task, n))) for n in lengths), overall])
    columns = ["cache", "task", *(f"{n:,} tokens" for n in lengths), "all lengths (95% interval)"] if rows else []
    files = []
    if out_dir is not None and rows:
        panels = [(run.point, [c for c in found if c["task"] != MEAN]) for run, found in tables]
        _heatmap.side_by_side(panels, LAYOUT, out_dir / HEATMAPS_FILE, TITLE)
        files = [HEATMAPS_FILE]
    return Section(TITLE, columns, rows, files)


def cells(run: RecordedRun) -> list[dict]:
    """The run's (task, context_tokens, accuracy) cells, and its mean over tasks per length."""
    series = [name for name in run.metrics if name.startswith(TASK_SERIES)]
    points = run.history([*series, "ruler_accuracy/all_tasks"])
    return [
        {"task": point.series.removeprefix(TASK_SERIES) if point.series in series else MEAN,
         "context_tokens": point.step, "accuracy": point.value}
        for point in points
    ]  # fmt: skip


def _percent(value: float | None) -> str:
    return "" if value is None else f"{value:.0%}"


def _with_interval(metrics: dict[str, float], name: str) -> str:
    """A recorded accuracy with its interval: `75% (41%–93%)`."""
    value, low, high = (metrics.get(key) for key in (name, f"{name}_ci_low", f"{name}_ci_high"))
    if value is None:
        return ""
    return f"{value:.0%}" + (f" ({low:.0%}–{high:.0%})" if low is not None and high is not None else "")
