"""A workload's own part of `compare`, over runs recorded long ago: what kvpipe.decide hands it
(each run's labels, recorded metrics and stepped series, read on demand), and what it gives back (a
table of text and the files it wrote). Pure Python: the stepped series come from kvpipe.record."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from kvpipe.workload._scored import Step


@dataclass
class RecordedRun:
    """One recorded run, as compare shows it."""

    label: str  # the cache, as compare's table names it
    point: str  # the label and the cache settings that vary, as compare's plots name it
    metrics: dict[str, float]  # what it recorded, by metric name (none NaN)
    history: Callable[[list[str]], list[Step]]  # the points of these stepped series


@dataclass
class Section:
    """A workload's table in compare (a title, its columns, rows of text), and the files it wrote."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    files: list[str] = field(default_factory=list)
    text_columns: tuple[str, ...] = ("cache",)  # aligned left, as text reads; the rest right, as numbers

    def markdown_title(self) -> str:
        return self.title[:1].upper() + self.title[1:]
