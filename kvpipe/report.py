"""Human-facing output: the compact summary table printed at the end of a run."""

from __future__ import annotations

from pathlib import Path

SUMMARY_METRICS = (
    ("ttft_ms", "TTFT", "ms"),
    ("tpot_ms", "TPOT", "ms"),
    ("decode_tokens_per_s", "decode", "tok/s"),
    ("e2e_ms", "end-to-end", "ms"),
    ("peak_memory_bytes", "peak memory", "bytes"),
    ("kv_cache_bytes", "KV cache", "bytes"),
    ("kv_compression", "vs fp16 KV", "x"),
    ("compile_ms", "compile", "ms"),
    ("roofline_fraction", "of memory roofline", "x"),
    ("token_agreement", "token agreement", "x"),
    ("kl_vs_reference", "KL vs reference", "nats"),
    ("ppl", "perplexity", "x"),
)


SIZE_UNITS = {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
              "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str, field: str = "--memory-budget") -> int:
    """Bytes from '8GiB', '512MiB', '24GB', '1e9'; a one-line ConfigError otherwise."""
    import re

    from kvpipe.errors import ConfigError

    match = re.fullmatch(r"\s*((?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?)\s*([a-z]*)\s*", text, re.IGNORECASE)
    if not match or match.group(2).lower() not in SIZE_UNITS or float(match.group(1)) <= 0:
        raise ConfigError(field, text, "expected a positive size like 8GiB, 512MiB, 24GB or 1e9 (bytes)")
    return int(float(match.group(1)) * SIZE_UNITS[match.group(2).lower()])


def human_bytes(value: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(value)


def format_metric(metrics: dict, name: str, unit: str) -> str:
    value = metrics.get(name)
    if value is None:
        return "n/a"
    std = metrics.get(name + "_std")
    if unit == "bytes":
        return human_bytes(value)
    if unit == "nats":
        return f"{value:.2e} nats"
    text = f"{value:.2f}" if unit == "x" else f"{value:.1f}"
    return text + (f" ± {std:.1f}" if std else "") + ("" if unit == "x" else f" {unit}")


def print_summary(document: dict, result_path: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    tags, metrics = document["tags"], document["metrics"]
    title = f"kvpipe · {document['config']['model']['name']} · cache={tags['cache.effective']} · {tags['device']}"
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, label, unit in SUMMARY_METRICS:
        if name in metrics:
            table.add_row(label, format_metric(metrics, name, unit))
    console = Console()
    console.print(table)
    for note in document.get("notes", []):
        console.print(f"[yellow]note:[/yellow] {note}")
    console.print(f"result: {result_path}")


def print_sweep_summary(counts: dict[str, int], sweep_dir: Path, parent_run_id: str | None) -> None:
    from rich.console import Console

    console = Console()
    style = "red" if counts["failed"] else "green"
    console.print(f"[{style}]sweep done:[/{style}] {counts['finished']} finished, {counts['skipped']} skipped, "
                  f"{counts['failed']} failed")
    console.print(f"results: {sweep_dir}" + (f" · MLflow parent run {parent_run_id}" if parent_run_id else ""))
