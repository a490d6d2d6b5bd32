"""compare's table as plain rows (Shown), and printing it: the sweep's process prints the rows its
tracking worker sends back (kvpipe.orchestrate.closing), without importing pandas or matplotlib."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from kvpipe.workload import Section


@dataclass
class Shown:
    """compare's table, and each workload's own (passkey: retrieval by context length), as strings."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    caption: str
    warning: str | None = None
    sections: list[Section] = field(default_factory=list)


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
    for section in shown.sections:
        if not section.rows:
            continue
        own = Table(title=section.title, header_style="bold")
        for name in section.columns:
            own.add_column(name, justify="left" if name in section.text_columns else "right")
        for row in section.rows:
            own.add_row(*row)
        console.print(own)
