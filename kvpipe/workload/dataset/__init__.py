"""workload=dataset: the user's own prompts, from a local file or folder (`reading.py`).

A `messages` column (a list of {role, content}) is rendered through the model's chat template; a
`text` or `prompt` column is a user turn, templated as chat does. A `max_new_tokens` column, where
present, sets each row's length. Batches group prompts of similar length, so padding stays small;
each row runs once per repeat. The file's content digest is part of the measurement key.

A labelled file (an `answer` column, or `workload.answer_field`; a text, a number or a list of
accepted answers) has its answers scored with `workload.scorer` (`scoring.py`, `labelled.py`): its
calls stop at end-of-sequence unless the user sets workload.ignore_eos, since an answer is the text
before it, and the run records task_accuracy with its 95% interval and a row per answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Optional

from kvpipe.catalogue import Metric
from kvpipe.errors import ConfigError, require_choice
from kvpipe.units import counted
from kvpipe.workload._scored import Scored
from kvpipe.workload.base import Batch, Quality, Window, Workload, padded_batch, until_eos
from kvpipe.workload.dataset import labelled, reading, scoring

LENGTH_COLUMN = "max_new_tokens"
ANSWERS_DIR = "answers"  # a labelled file's scored answers, in the run's MLflow artifacts
# When each row arrived, in seconds (a timestamp, or an offset from the first): load=rate replays them
ARRIVAL_COLUMNS = ("timestamp", "arrival_s")
# A labelled run's `generation` tag, by workload.ignore_eos: what its calls generated and its timings cover
GENERATION = {
    False: "stops at end-of-sequence (a labelled file): timings cover the tokens generated, up to each EOS",
    True: "runs to max_new_tokens with end-of-sequence held back (workload.ignore_eos=true): each answer is all "
    "it wrote, and timings cover every token generated",
}


@dataclass(frozen=True)
class Row:
    """One prompt of the file: its row number there (0-based), its messages and its own length."""

    number: int
    messages: tuple
    max_new_tokens: int | None
    arrival_s: float | None = None  # seconds after the file's first arrival, where it says
    answers: tuple[str, ...] = ()  # what it accepts as the right answer, in a labelled file


class Dataset(Workload):
    name = "dataset"
    order = 40
    chat_style = True
    context_fields = ("path", "field", "limit", "split")
    # from the repository root: a labelled file with its quality pass, so every metric it declares is made
    test_overrides = ("workload.path=examples/questions.jsonl", "workload.limit=3", "quality=on",
                      "quality.windows=1", "quality.scored_tokens=4")  # fmt: skip
    metrics = (
        Metric("task_accuracy", "task accuracy", "", ".0%", False, in_run_table=True, compare=True),
        Metric("task_accuracy_ci_low", "task accuracy, 95% interval's low end", "", ".0%"),
        Metric("task_accuracy_ci_high", "task accuracy, 95% interval's high end", "", ".0%"),
        Metric("task_answers", "scored answers", "", ".0f"),
        Metric("answers_changed", "answers changed vs reference", "", ".0%", True, in_run_table=True, compare=True),
        Metric("flipped_to_wrong", "right → wrong vs reference", "", ".0f", True, in_run_table=True, compare=True),
        Metric("flipped_to_right", "wrong → right vs reference", "", ".0f", in_run_table=True),
        # Neither direction: closer to 1 is best; above 1 the answers cost more decode time than TPOT shows
        Metric("output_length_ratio", "output length vs reference", "×", ".2f", None, in_run_table=True, compare=True),
    )
    quality = Quality(metrics[0], term="task", axis="task accuracy")
    # Scoring settings that a file without answers leaves unset: kept out of its measurement key.
    scoring_fields = ("answer_field", "scorer")

    @dataclass
    class Settings:
        path: Optional[str] = None  # a .jsonl/.json/.csv/.parquet file or a save_to_disk folder
        field: Optional[str] = None  # the prompt column; default: messages, else text, else prompt
        limit: Optional[int] = None  # a seeded sample of this many rows (workload.seed)
        split: Optional[str] = None  # a save_to_disk folder of splits: which one
        answer_field: Optional[str] = None  # the expected answers' column; default: answer, where present
        scorer: Optional[str] = None  # how answers are scored (scoring.SCORERS); default: contains

    def check(self) -> dict:
        if self.settings.limit is not None and self.settings.limit <= 0:
            raise ConfigError(
                "workload.limit", self.settings.limit, "expected a positive number of rows, or null for all"
            )
        if self.settings.scorer is not None:
            require_choice("workload.scorer", self.settings.scorer, scoring.SCORERS)
        checked = super().check()  # reads the file where ignore_eos is left to it (default_ignore_eos)
        self.rows()  # every problem with the file, now: before the model loads
        answers = self._answer_column
        if answers is None:
            if self.settings.scorer is not None:
                raise ConfigError(
                    "workload.scorer",
                    self.settings.scorer,
                    f"the file has no {labelled.DEFAULT_ANSWER_FIELD!r} column to score against; "
                    "expected workload.answer_field naming one, or no scorer",
                )
            return {**checked, "field": self._table[1]}
        return {**checked, "field": self._table[1], "answer_field": answers, "scorer": self.scorer.name}

    def default_ignore_eos(self) -> bool:
        """An answer is the text before end-of-sequence, so a labelled file's calls stop there unless
        the user set workload.ignore_eos; a file without answers runs to max_new_tokens, as ever."""
        return self._answer_column is None

    def judges_answers(self) -> bool:
        """A labelled file only (an answer column)."""
        return self._answer_column is not None

    @property
    def scorer(self) -> scoring.Scorer:
        return scoring.SCORERS[self.settings.scorer or scoring.DEFAULT]

    @cached_property
    def _answer_column(self) -> str | None:
        return labelled.answer_column(list(self._table[0].column_names), self.settings.answer_field)

    def source(self) -> Path:
        return reading.check_path(self.settings.path)

    @cached_property
    def _table(self):
        """(the datasets.Dataset, its prompt column), read once per workload object."""
        data = reading.load(self.source(), self.settings.split, self.settings.path)
        return data, reading.column(data, self.settings.field)

    def identity(self) -> dict:
        """A file without answers is keyed as before it could have them: its unset scoring settings left out."""
        values = super().identity()
        return {k: v for k, v in values.items() if not (k in self.scoring_fields and v is None)}

    def identity_extras(self) -> dict:
        return {"digest": reading.digest(self.source())}

    def rows(self) -> list[Row]:
        """The rows this job runs: all, or a seeded sample of `limit`, each checked; read once per
        workload object (its check, batches and windows share them)."""
        return self._rows

    @cached_property
    def _rows(self) -> list[Row]:
        data, field = self._table
        numbers = list(range(len(data)))
        if self.settings.limit is not None and self.settings.limit < len(data):
            data = data.add_column("__kvpipe_row", numbers)
            data = data.shuffle(seed=self.common.seed).select(range(self.settings.limit))
            numbers = data["__kvpipe_row"]
        lengths = data[LENGTH_COLUMN] if LENGTH_COLUMN in data.column_names else [None] * len(numbers)
        arrivals = _arrivals(self.settings.path, data, numbers)
        answer_field, path = self._answer_column, self.settings.path
        answers = data[answer_field] if answer_field else [None] * len(numbers)
        return [
            Row(
                number,
                _messages(path, field, reading.row_number(number), value),
                _length(path, reading.row_number(number), new),
                arrival,
                labelled.accepted(path, answer_field, reading.row_number(number), answer, self.scorer)
                if answer_field
                else (),
            )  # fmt: skip
            for number, value, new, arrival, answer in zip(numbers, data[field], lengths, arrivals, answers)
        ]

    def notes(self) -> list[str]:
        rows, limit = len(self._table[0]), self.settings.limit
        if limit is None or limit <= rows:
            return []
        return [f"workload.limit={limit} but the file has {counted(rows, 'row')}: all {rows} used"]

    def size_label(self) -> str:
        rows = f" {counted(self.settings.limit, 'row')}" if self.settings.limit else ""
        return f"{Path(str(self.settings.path)).name}{rows}"

    # ---- prompts ------------------------------------------------------------------------------

    def batches(self, tokenizer, device: str) -> list[Batch]:
        """Rows of one length of output together, sorted by prompt length, batch_size at a time."""
        encoded = [(row, self.chat_ids(tokenizer, list(row.messages))) for row in self.rows()]
        encoded.sort(key=lambda item: (self.new_tokens(item[0]), len(item[1]), item[0].number))
        batches, size = [], self.common.batch_size
        start = 0
        while start < len(encoded):
            new = self.new_tokens(encoded[start][0])
            group = [item for item in encoded[start : start + size] if self.new_tokens(item[0]) == new]
            rows = [row for row, _ in group]
            batches.append(padded_batch(tokenizer, [ids for _, ids in group], device, rows, max_new_tokens=new))
            start += len(group)
        return batches

    def new_tokens(self, row: Row) -> int:
        return row.max_new_tokens or self.common.max_new_tokens

    def check_fits(self, shape, batches: list[Batch]) -> None:
        """Name the row that does not fit, and its token count."""
        positions = shape.max_positions
        for batch in batches:
            for row, tokens in zip(batch.rows, batch.row_tokens):
                new = self.new_tokens(row)
                if positions and tokens + new > positions:
                    raise ConfigError(
                        "workload.path",
                        self.settings.path,
                        f"row {reading.row_number(row.number)} is {tokens} tokens, which with {new} new tokens exceeds the model's "
                        f"{positions} positions; expected prompts of at most {positions - new} tokens",
                    )

    def warmup_key(self, batch: Batch) -> tuple:
        # Padded lengths differ from batch to batch: warm up once per batch size and output length
        return (batch.input_ids.shape[0], batch.max_new_tokens)

    def windows(self, tokenizer, count: int, scored_tokens: int) -> list[Window]:
        """Its own first `count` prompts (in the order the file or sample gives them); the reference
        writes what follows."""
        return [Window(self.chat_ids(tokenizer, list(row.messages)), None) for row in self.rows()[:count]]

    def tags(self, tokenizer) -> dict[str, str]:
        tags = {**super().tags(tokenizer), "dataset_digest": reading.digest(self.source())}
        if self.settings.answer_field is not None:
            tags["generation"] = GENERATION[bool(self.common.ignore_eos)]
        return tags

    # ---- its scoring and records --------------------------------------------------------------

    def answers(self, tokenizer, eos_ids, batches, calls):
        """Nothing to score in a file without answers."""
        if self.settings.answer_field is None:
            return []
        every_repeat = self.common.do_sample  # greedy repeats write the same answers again
        return labelled.answer_rows(tokenizer, eos_ids, batches, calls, self.scorer, every_repeat)

    def against_reference(self, tokenizer, eos_ids, batches, reference, rows):
        """Each answer row with the reference's own answer to its prompt."""
        generated = {
            row.number: tokens
            for batch, calls in zip(batches, reference)
            for row, tokens in zip(batch.rows, calls.tolist())
        }
        answers = {number: labelled.answer_text(tokenizer, tokens, eos_ids) for number, tokens in generated.items()}
        lengths = {number: len(until_eos(tokens, eos_ids)) for number, tokens in generated.items()}
        return labelled.with_reference(rows, answers, self.scorer, lengths)

    def scored(self, rows):
        """The mean score with its interval, the rows as answers (each an MLflow trace with its verdict)
        and as an MLflow table (the run's Evaluation view)."""
        if not rows:
            return Scored()
        by_name = {metric.name: metric for metric in self.metrics}
        found = labelled.figures(rows, self.scorer)
        if self.common.ignore_eos:  # every answer, and the reference's, ran to max_new_tokens: 1 says nothing
            found.pop("output_length_ratio", None)
        return Scored(
            metrics={by_name[name]: value for name, value in found.items()},
            rows=rows,
            answers=labelled.answers(rows),
            scorer=self.scorer.name,
            tables={f"{ANSWERS_DIR}/answers.json": rows},
        )

    def dataset_input(self, tags):
        return Path(str(self.settings.path)).name, tags.get("dataset_digest")


def _messages(path: str, field: str, number: int, value) -> tuple:
    """A row's prompt as chat messages: a `messages` list as it is, a text as one user turn."""
    if isinstance(value, str):
        if not value.strip():
            raise ConfigError("workload.path", path, f"row {number} has no text in column {field!r}")
        return ({"role": "user", "content": value},)
    if isinstance(value, list) and value and all(isinstance(m, dict) and "content" in m for m in value):
        if not any(str(m["content"] or "").strip() for m in value):
            raise ConfigError("workload.path", path, f"row {number} has no text in column {field!r}")
        return tuple({"role": m.get("role") or "user", "content": m["content"] or ""} for m in value)
    if value is None or value == []:
        raise ConfigError("workload.path", path, f"row {number} has no text in column {field!r}")
    raise ConfigError(
        "workload.field",
        field,
        f"row {number} holds {type(value).__name__}; expected text, or a list of {{role, content}} messages",
    )


def _length(path: str, number: int, value) -> int | None:
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not float(value).is_integer() or value <= 0:
        raise ConfigError(
            "workload.path", path, f"row {number} has {LENGTH_COLUMN}={value!r}; expected a positive integer"
        )
    return int(value)


def _arrivals(path: str, data, numbers: list[int]) -> list[float | None]:
    """Each row's arrival, in seconds after the first, from its timestamp (or arrival_s) column; the
    times must never go backwards down the file. No such column: None for every row."""
    name = next((c for c in ARRIVAL_COLUMNS if c in data.column_names), None)
    if name is None:
        return [None] * len(numbers)
    times = []
    for number, value in zip(numbers, data[name]):
        if hasattr(value, "timestamp"):  # a datetime column
            value = value.timestamp()
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
            raise ConfigError(
                "workload.path",
                path,
                f"row {reading.row_number(number)} has {name}={value!r}; expected seconds (a number)",
            )
        times.append(float(value))
    order = sorted(range(len(numbers)), key=lambda i: numbers[i])  # file order, whatever a sample chose
    for earlier, later in zip(order, order[1:]):
        if times[later] < times[earlier]:
            raise ConfigError(
                "workload.path",
                path,
                f"row {reading.row_number(numbers[later])} has {name}={times[later]:g}, before row "
                f"{reading.row_number(numbers[earlier])}'s {times[earlier]:g}; "
                "expected arrival times that never go backwards",
            )
    first = min(times)
    return [t - first for t in times]
