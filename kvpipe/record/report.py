"""What a person sees at the end of a run or a sweep: a compact rich table and where things went."""

from __future__ import annotations

import re
from pathlib import Path

from kvpipe import catalogue, workload
from kvpipe.measure.round_figures import TAG_PREFIX, parse_series
from kvpipe.measure.uncertainty import interval_note
from kvpipe.record.result import Result
from kvpipe.units import counted


def print_run(result: Result, result_path: Path) -> None:
    """The run's table: the catalogue's run-table metrics it measured, its prompts, the workload's own
    tables and notes, and where result.json went."""
    from rich.console import Console
    from rich.table import Table

    tags, metrics = result.tags, result.metrics
    load = f" · load={tags['load']}" if "load" in tags else ""
    title = f"kvpipe · {result.config['model']['name']} · cache={tags['cache.effective']}{load} · {tags['device']}"
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows, once = said_once(run_rows(metrics, tags))
    for label, shown in rows:
        table.add_row(label, shown)
    console = Console()
    console.print(table)
    if once:
        console.print(once)
    if "prompt_count" in metrics:
        console.print(prompt_lengths(metrics))
    if result.answers:  # the workload's own tables (passkey: found / asked per length and depth)
        for extra in result.workload().run_tables(result.answers):
            console.print(extra)
    for note in result.notes:
        console.print(f"[yellow]note:[/yellow] {note}")
    console.print(f"result: {result_path}")


def run_rows(metrics: dict, tags: dict) -> list[tuple[str, str]]:
    """(label, figure) for each run-table metric the run measured: the figure with its interval where
    its rounds support one, else the words that say why not (kvpipe.measure.uncertainty.interval_note)."""
    return [
        (metric.label, figure_text(metric, metrics, tags))
        for metric in workload.metrics().values()
        if metric.in_run_table and metric.name in metrics
    ]


_CELL_NOTE = re.compile(r" \(([^()]*interval[^()]*)\)$")  # interval_note's words, as a figure ends with them


def interval_words(text: str) -> str | None:
    """The words a printed figure ends with in place of its interval ('67.9 ms (1 round, no
    interval)' -> '1 round, no interval'), None where it ends with none."""
    match = _CELL_NOTE.search(text)
    return match[1] if match else None


def without_interval_words(text: str) -> str:
    return _CELL_NOTE.sub("", text)


def said_once(rows: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], str | None]:
    """The run table's rows with words that several figures share in place of their interval ('1
    round, no interval') taken out of them, and the one line that says them once instead: 'TTFT,
    TPOT, decode: 1 round, no interval'; the rows as they are, and None, where no two share them."""
    worded = [(label, interval_words(shown)) for label, shown in rows if interval_words(shown)]
    if len(worded) < 2 or len({words for _, words in worded}) > 1:
        return rows, None
    stripped = [(label, without_interval_words(shown)) for label, shown in rows]
    return stripped, f"{', '.join(label for label, _ in worded)}: {worded[0][1]}"


def figure_text(metric: catalogue.Metric, metrics: dict, tags: dict, unit: bool = True) -> str:
    """A run's figure as kvpipe prints it: with its 95% interval where its rounds support one, else
    the words that say why not ('67.9 ms (1 round, no interval)'); without its unit for a table cell
    whose header names it (unit=False). Benchmarks print theirs through it too."""
    interval = metric.interval_of(metrics)
    note = interval_note(*interval, parse_series(tags.get(TAG_PREFIX + metric.name)), metric.is_share) or ""
    shown = metric.show if unit else metric.number
    return shown(metrics[metric.name], metrics.get(metric.name + "_std"), interval, note)


def prompt_lengths(metrics: dict) -> str:
    """'8 prompts · 42.1 tokens mean, p50 42, p90 45, max 46': the lengths the job ran."""
    shown = ", ".join(
        f"{label} {catalogue.get(f'prompt_tokens_{name}').number(metrics[f'prompt_tokens_{name}'])}"
        for name, label in (("p50", "p50"), ("p90", "p90"), ("max", "max"))
    )
    mean = catalogue.get("prompt_tokens_mean").number(metrics["prompt_tokens_mean"])
    return f"{counted(metrics['prompt_count'], 'prompt')} · {mean} tokens mean, {shown}"


def print_sweep_end(counts: dict[str, int], sweep_dir: Path, parent_run_id: str | None, unsynced: int = 0) -> None:
    """unsynced: results the store refused or missed while the sweep ran, kept on disk for `kvpipe sync`."""
    from rich.console import Console

    console = Console()
    style = "red" if counts["failed"] or unsynced else "green"
    console.print(
        f"[{style}]sweep done:[/{style}] {counts['finished']} finished, {counts['skipped']} skipped, "
        f"{counts['failed']} failed" + (f", {unsynced} not in MLflow" if unsynced else "")
    )
    console.print(f"results: {sweep_dir}" + (f" · MLflow parent run {parent_run_id}" if parent_run_id else ""))
