"""RULER's 13 tasks by their RULER names: how each draws a sample, how it is scored
(`all`: string_match_all, the share of expected strings in the answer; `part`: string_match_part,
1 where any is), and how many tokens RULER lets it answer in (its tokens_to_generate).

A sample is drawn from its own seeded `random.Random` (the seed, task, length and sample number), so
the same settings make the same prompts on any machine; `Materials` is what the drafts read.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import partial
from typing import Callable

from kvpipe.workload.ruler import aggregation, niah, qa, sources
from kvpipe.workload.ruler.prompt import Draft, RulerPrompt, assemble


@dataclass
class Materials:
    """What the drafts read: the tokenizer, the haystack (None: Python's docs) and the QA rows."""

    tokenizer: object
    haystack_path: str | None
    qa_rows: list
    seed: int

    def haystack(self, sample: int):
        return sources.haystack(self.tokenizer, self.haystack_path, sample)

    def qa_row(self, several: bool, sample: int) -> qa.Row:
        rows = qa.eligible(self.qa_rows, several)
        random.Random(f"{self.seed}:qa:{several}").shuffle(rows)
        return rows[sample % len(rows)]


@dataclass(frozen=True)
class Task:
    name: str
    draft: Callable[[Materials, random.Random, int, int], Draft]  # (materials, rng, length, sample)
    match: str  # all | part
    new_tokens: int


def _niah(shape: niah.Needles, materials: Materials, rng, length: int, sample: int) -> Draft:
    return niah.draft(shape, materials.tokenizer, rng, materials.haystack(sample))


def _aggregation(make, materials: Materials, rng, length: int, sample: int) -> Draft:
    return make(materials.tokenizer, rng, length)


def _qa(several: bool, materials: Materials, rng, length: int, sample: int) -> Draft:
    row = materials.qa_row(several, sample)
    return qa.draft(materials.tokenizer, rng, row, materials.qa_rows, materials.haystack(sample))


NIAH = {  # RULER's scripts/synthetic.yaml
    "niah_single_1": niah.Needles("noise"),
    "niah_single_2": niah.Needles("essay"),
    "niah_single_3": niah.Needles("essay", value_kind="uuids"),
    "niah_multikey_1": niah.Needles("essay", keys=4),
    "niah_multikey_2": niah.Needles("needle"),
    "niah_multikey_3": niah.Needles("needle", key_kind="uuids", value_kind="uuids"),
    "niah_multivalue": niah.Needles("essay", values=4),
    "niah_multiquery": niah.Needles("essay", queries=4),
}
TASKS: dict[str, Task] = {
    **{name: Task(name, partial(_niah, shape), "all", 128) for name, shape in NIAH.items()},
    "vt": Task("vt", partial(_aggregation, aggregation.variable_tracking), "all", 30),
    "cwe": Task("cwe", partial(_aggregation, aggregation.common_words), "all", 120),
    "fwe": Task("fwe", partial(_aggregation, aggregation.frequent_words), "all", 50),
    "qa_1": Task("qa_1", partial(_qa, False), "part", 32),
    "qa_2": Task("qa_2", partial(_qa, True), "part", 32),
}
QA_TASKS = {"qa_1": False, "qa_2": True}  # task -> whether its rows have several documents


def prompt(task: str, materials: Materials, length: int, sample: int) -> RulerPrompt:
    """One sample of one task at one length."""
    rng = random.Random(f"{materials.seed}:{task}:{length}:{sample}")
    draft = TASKS[task].draft(materials, rng, length, sample)
    return assemble(materials.tokenizer, task, length, sample, draft)
