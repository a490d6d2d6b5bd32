"""What a workload's own scoring of its answers comes to, as one typed value: its metrics (by their
catalogue entries), stepped series, per-prompt rows, what each row means as an answer, tables and
files. The workload returns it; kvpipe.record writes it (the rows into result.json, the files beside
it) and logs it to MLflow (each answer a trace with its verdict), the same way for every workload;
compare lists the answers a cache turned wrong. Pure Python: a file is written by the callable it
carries.
"""

from __future__ import annotations

import enum
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


class Flip(enum.StrEnum):
    """How an answer compares with the reference's answer to the same prompt."""

    TO_WRONG = "to_wrong"  # the reference's was right, this one is wrong: what a cache broke
    TO_RIGHT = "to_right"
    NO = "no"


@dataclass(frozen=True)
class Answer:
    """One scored answer, in the words every workload shares: the prompt (or, where it is too long to
    show, what it asked), the answer(s) it accepts, what the job answered, its score and whether that
    counts as right; where the quality pass ran, the reference's (a full-precision DynamicCache's)
    answer to the same prompt and whether that was right."""

    row: int  # the prompt's number in the workload (a dataset file's row)
    repeat: int
    prompt: str
    expected: tuple[str, ...]
    answer: str
    score: float
    correct: bool
    reference_answer: str | None = None
    reference_correct: bool | None = None

    @property
    def flipped(self) -> Flip | None:
        """Against the reference's answer; None where there was none."""
        if self.reference_correct is None:
            return None
        if self.reference_correct != self.correct:
            return Flip.TO_WRONG if self.reference_correct else Flip.TO_RIGHT
        return Flip.NO


@dataclass
class Scored:
    """A workload's scoring of one job's answers."""

    metrics: dict[Metric, float] = field(default_factory=dict)  # each one of the workload's declared metrics
    steps: list[Step] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)  # a row per answer: result.json's `answers`
    answers: list[Answer] = field(default_factory=list)  # the rows as answers (none: rows that are not)
    scorer: str = ""  # what judged the answers (workload.scorer), as MLflow names their assessments' source
    tables: dict[str, list[dict]] = field(default_factory=dict)  # MLflow table artifact path -> rows
    files: list[ScoredFile] = field(default_factory=list)

    def values(self) -> dict[str, float]:
        """The metrics by name, as a run's metrics hold them."""
        return {metric.name: value for metric, value in self.metrics.items()}
