"""Progress with an ETA on a terminal; silent otherwise (logs, CI, pipes)."""

from __future__ import annotations

import sys
from contextlib import contextmanager


@contextmanager
def progress_bar(label: str, total: int | None):
    """Yields a function that advances a rich progress bar by one step (total None: not known ahead,
    as with workload.repeats=auto)."""
    if not sys.stderr.isatty():
        yield lambda: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, transient=True) as progress:
        task = progress.add_task(f"generate · {label}", total=total)
        yield lambda: progress.advance(task)
