"""passkey's part of `compare`: retrieval by context length as a table (accuracy over every depth,
and what each length cost), each run's heatmap side by side, and accuracy against KV bytes; all read
from the runs' stepped series (retrieval.stepped_metrics)."""

from __future__ import annotations

from pathlib import Path

from kvpipe.units import MIB, human_bytes
from kvpipe.workload import _heatmap
from kvpipe.workload._compared import RecordedRun, Section
from kvpipe.workload.passkey import heatmap
from kvpipe.workload.passkey.retrieval import DEPTH_PREFIX

TITLE = "passkey retrieval by context length"
HEATMAPS_FILE, VERSUS_FILE = "retrieval_heatmaps.png", "accuracy_vs_kv_bytes.png"
BY_LENGTH = {  # stepped series -> its figure per context length
    "retrieval_accuracy/all_depths": "accuracy",
    "kv_cache_bytes/by_length": "kv_cache_bytes",
    "ttft_ms/by_length": "ttft_ms",
    "tpot_ms/by_length": "tpot_ms",
}


def section(runs: list[RecordedRun], out_dir: Path | None) -> Section:
    """The table, and with out_dir the heatmaps and accuracy against KV bytes written there."""
    rows = [
        [
            run.label,
            f"{length['context_tokens']:,.0f}",
            f"{length['accuracy']:.0%}",
            human_bytes(length["kv_cache_bytes"]),
            f"{length['ttft_ms']:.0f}",
            f"{length['tpot_ms']:.1f}",
        ]
        for run in runs
        for length in by_length(run)
    ]
    columns = ["cache", "context tokens", "retrieval", "KV cache", "TTFT ms", "TPOT ms"] if rows else []
    files = []
    if out_dir is not None:
        heatmaps(runs, out_dir / HEATMAPS_FILE)
        accuracy_vs_kv_bytes(runs, out_dir / VERSUS_FILE)
        files = [HEATMAPS_FILE, VERSUS_FILE]
    return Section(TITLE, columns, rows, files)


def by_length(run: RecordedRun) -> list[dict]:
    """Per context length, shortest first: accuracy over every depth, and the KV bytes, TTFT and TPOT
    at that length (NaN where a series lacks the length)."""
    lengths: dict[int, dict] = {}
    for point in run.history(list(BY_LENGTH)):
        blank = {"context_tokens": point.step, **dict.fromkeys(BY_LENGTH.values(), float("nan"))}
        lengths.setdefault(point.step, blank)[BY_LENGTH[point.series]] = point.value
    return [lengths[step] for step in sorted(lengths)]


def cells(run: RecordedRun) -> list[dict]:
    """The run's heatmap cells (context_tokens, depth, retrieval_accuracy), from its stepped metrics."""
    series = [name for name in run.metrics if name.startswith(DEPTH_PREFIX)]
    return [
        {"context_tokens": point.step, "depth": float(point.series.removeprefix(DEPTH_PREFIX)),
         "retrieval_accuracy": point.value}
        for point in run.history(series)
    ]  # fmt: skip


def heatmaps(runs: list[RecordedRun], path: Path) -> None:
    """One needle-in-a-haystack heatmap per run, side by side on one colour scale."""
    panels = [(run.point, cells(run)) for run in runs]
    title = "passkey retrieval accuracy by context length and key depth"
    _heatmap.side_by_side(panels, heatmap.LAYOUT, path, title)


def accuracy_vs_kv_bytes(runs: list[RecordedRun], path: Path) -> None:
    """Retrieval accuracy against the KV cache's bytes: a line per run through its context lengths,
    each point labelled with its length. Up and left is better."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 5.5), layout="constrained")
    ax = figure.subplots()
    # Hollow markers of different shapes and sizes: runs that score alike (int4 in two backends) stay visible
    for index, run in enumerate(runs):
        table = by_length(run)
        if not table:
            continue
        style = {"marker": "osD^vP*X"[index % 8], "markersize": max(5, 12 - 1.5 * index), "fillstyle": "none"}
        kv = [row["kv_cache_bytes"] / MIB for row in table]
        line = ax.plot(kv, [row["accuracy"] for row in table], label=run.point, alpha=0.85, **style)[0]
        for row in table:
            ax.annotate(f"{row['context_tokens']:,.0f}", (row["kv_cache_bytes"] / MIB, row["accuracy"]),
                        textcoords="offset points", xytext=(4, 4), fontsize="x-small", color=line.get_color())  # fmt: skip
    ax.set_xscale("log")
    ax.set_ylim(-0.05, 1.05)
    ax.yaxis.set_major_formatter("{x:.0%}")
    ax.set(xlabel="KV cache (MiB, log scale; labels: context tokens)", ylabel="passkey retrieval accuracy",
           title="retrieval accuracy vs KV cache bytes")  # fmt: skip
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    figure.savefig(path, dpi=110)
