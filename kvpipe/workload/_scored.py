"""What a workload's own scoring of its answers comes to, as one typed value: its metrics (by their
catalogue entries), stepped series, per-prompt rows, tables and files. The workload returns it;
kvpipe.record writes it (the rows into result.json, the files beside it) and logs it to MLflow, the
same way for every workload. Pure Python: a file is written by the callable it carries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from kvpipe.catalogue import Metric


@dataclass(frozen=True)
class Step:
    """One point of a stepped series: the MLflow metric `series` at `step` (passkey: its accuracy at
    a context length, the step)."""

    series: str
    value: float
    step: int


@dataclass(frozen=True)
class ScoredFile:
    """A file written beside result.json, kept by MLflow under `artifact_dir`. `write(path, title)`
    writes it (title: the run's name)."""

    name: str
    artifact_dir: str
    write: Callable[[Path, str], object]


@dataclass
class Scored:
    """A workload's scoring of one job's answers."""

    metrics: dict[Metric, float] = field(default_factory=dict)  # each one of the workload's declared metrics
    steps: list[Step] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)  # a row per answer: result.json's `answers`
    tables: dict[str, list[dict]] = field(default_factory=dict)  # MLflow table artifact path -> rows
    files: list[ScoredFile] = field(default_factory=list)

    def values(self) -> dict[str, float]:
        """The metrics by name, as a run's metrics hold them."""
        return {metric.name: value for metric, value in self.metrics.items()}
