"""The table a sweep closes with, and `kvpipe compare`'s, printed from plain rows.

At a sweep's end its runs are read from MLflow, compared, plotted and logged by kvpipe.decide.compare,
in the sweep's tracking worker where it has one (kvpipe.record.worker); the sweep's own process
prints the rows it gets back, without importing pandas or matplotlib for them.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

from kvpipe.errors import KvpipeError
from kvpipe.record import worker
from kvpipe.record.store import store_paths

log = logging.getLogger(__name__)


@dataclass
class Shown:
    """compare's table (and, for passkey runs, retrieval by context length) as strings."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    caption: str
    warning: str | None = None
    retrieval_columns: list[str] = field(default_factory=list)
    retrieval_rows: list[list[str]] = field(default_factory=list)


def print_shown(shown: Shown) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=shown.title, header_style="bold", caption=shown.caption, caption_justify="left")
    for name in shown.columns:
        table.add_column(name, justify="left" if name in ("★", "cache") else "right")
    for row in shown.rows:
        table.add_row(*row, style="bold" if row[0].startswith("★") else None)
    console = Console(width=None if sys.stdout.isatty() else 240)  # a pipe gets whole rows, not 80 columns
    console.print(table)
    if shown.warning:
        console.print(shown.warning, style="bold yellow")
    if shown.retrieval_rows:
        by_length = Table(title="passkey retrieval by context length", header_style="bold")
        for name in shown.retrieval_columns:
            by_length.add_column(name, justify="left" if name == "cache" else "right")
        for row in shown.retrieval_rows:
            by_length.add_row(*row)
        console.print(by_length)


def summarise_sweep(config, parent_run_id: str, sweep_dir: Path) -> None:
    """End of a multirun: table, files in sweep_dir, artifacts on the parent. Never fails the sweep."""
    from omegaconf import OmegaConf

    try:
        uri = store_paths(OmegaConf.to_object(config.tracking), Path(config.hydra.runtime.cwd))[0]
        experiment = config.tracking.experiment
        print_shown(worker.run("kvpipe.decide.compare", "publish_sweep", experiment, parent_run_id, uri, sweep_dir))
    except KvpipeError as exc:  # an empty or all-failed sweep has nothing to compare
        log.info("compare: %s", exc)
    except Exception:  # noqa: BLE001 - our bug, but every job is recorded already: keep the sweep's own status
        log.exception(
            "compare failed; the sweep's runs are recorded, `kvpipe compare --parent %s` retries", parent_run_id
        )
