"""What a person sees at the end of a run or a sweep: a compact rich table and where things went."""

from __future__ import annotations

from pathlib import Path

from kvpipe.record.result import Result
from kvpipe.units import human_bytes

SUMMARY_METRICS = (
    ("ttft_ms", "TTFT", "ms"),
    ("tpot_ms", "TPOT", "ms"),
    ("decode_tokens_per_s", "decode", "tok/s"),
    ("e2e_ms", "end-to-end", "ms"),
    ("timing_noise_cv", "timing noise", "%"),  # between calls of one shape (metrics.repeat_noise)
    ("peak_memory_bytes", "peak memory (weights incl.)", "bytes"),
    ("peak_over_baseline_bytes", "peak over baseline", "bytes"),
    ("kv_cache_bytes", "KV cache", "bytes"),
    ("kv_compression", "vs fp16 KV", "x"),
    ("compile_ms", "compile", "ms"),
    ("roofline_fraction", "of memory roofline", "x"),
    ("token_agreement", "token agreement", "x"),
    ("kl_vs_reference", "KL vs reference", "nats"),
    ("ppl", "perplexity", "x"),
    ("retrieval_accuracy", "passkey retrieval", "%"),
)


def format_metric(metrics: dict, name: str, unit: str) -> str:
    value = metrics.get(name)
    if value is None:
        return "n/a"
    std = metrics.get(name + "_std")
    if unit == "bytes":
        return human_bytes(value)
    if unit == "nats":
        return f"{value:.2e} nats"
    if unit == "%":
        return f"{value:.0%}"
    text = f"{value:.2f}" if unit == "x" else f"{value:.1f}"
    return text + (f" ± {std:.1f}" if std else "") + ("" if unit == "x" else f" {unit}")


def print_summary(result: Result, result_path: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    tags, metrics = result.tags, result.metrics
    title = f"kvpipe · {result.config['model']['name']} · cache={tags['cache.effective']} · {tags['device']}"
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, label, unit in SUMMARY_METRICS:
        if name in metrics:
            table.add_row(label, format_metric(metrics, name, unit))
    console = Console()
    console.print(table)
    if result.retrieval:
        console.print(retrieval_table(result.retrieval))
    for note in result.notes:
        console.print(f"[yellow]note:[/yellow] {note}")
    console.print(f"result: {result_path}")


def retrieval_table(rows: list[dict]):
    """Keys found / answers per context length (rows) and depth (columns)."""
    from rich.table import Table

    from kvpipe.measure.retrieval import cells

    found = {(c["context_tokens"], c["depth"]): c for c in cells(rows)}
    depths = sorted({depth for _, depth in found})
    table = Table(title="passkey found / asked", header_style="bold")
    table.add_column("context tokens", justify="right")
    for depth in depths:
        table.add_column(f"depth {depth:.0%}", justify="right")
    for length in sorted({length for length, _ in found}):
        cells_of_length = [found.get((length, depth)) for depth in depths]
        table.add_row(f"{length:,}", *(f"{c['found']}/{c['answers']}" if c else "" for c in cells_of_length))
    return table


def print_sweep_summary(counts: dict[str, int], sweep_dir: Path, parent_run_id: str | None) -> None:
    from rich.console import Console

    console = Console()
    style = "red" if counts["failed"] else "green"
    console.print(
        f"[{style}]sweep done:[/{style}] {counts['finished']} finished, {counts['skipped']} skipped, "
        f"{counts['failed']} failed"
    )
    console.print(f"results: {sweep_dir}" + (f" · MLflow parent run {parent_run_id}" if parent_run_id else ""))
