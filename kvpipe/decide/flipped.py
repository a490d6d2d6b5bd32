"""compare's list of the prompts a cache broke. For each run whose answers stand beside the
reference's (its quality pass: a full-precision DynamicCache answering the same prompts), how many
flipped to wrong and to right, and its first prompts that flipped to wrong: what was expected, what
the reference answered, what this cache answered. Any workload whose scoring declares its rows as
answers (kvpipe.workload.Answer), read from each run's result.json."""

from __future__ import annotations

from typing import Callable, Iterable

import pandas as pd

from kvpipe.decide.limits import ANSWER_QUALITY
from kvpipe.record.read_back import recorded_answers
from kvpipe.workload import Answer, Flip, Section

SHOWN = 5  # prompts listed per cache
TEXT_CHARS = 60  # of each prompt and answer: a table row stays one line on a wide terminal
COUNTS_TITLE = "answers flipped against the reference's (a full-precision DynamicCache, same prompts)"
BROKEN_TITLE = f"prompts each cache broke: right with the reference, wrong with the cache (its first {SHOWN})"
COUNTS_COLUMNS = ["cache", "answers", "flipped to wrong", "flipped to right"]
BROKEN_COLUMNS = ["cache", "row", "prompt", "expected", "reference answered", "answered"]


def sections(runs: pd.DataFrame, answers_of: Callable[[str], Iterable[Answer]] = recorded_answers) -> list[Section]:
    """The counts and the broken prompts, over the runs (with compare's `point`) whose workload
    judged its answers; none where no run's answers have the reference's beside them."""
    counts, broken = [], []
    for _, run in runs[runs[ANSWER_QUALITY.name].notna()].iterrows():
        against = [answer for answer in answers_of(run["run_id"]) if answer.flipped is not None]
        if not against:
            continue
        to_wrong = sorted((a for a in against if a.flipped == Flip.TO_WRONG), key=lambda a: (a.row, a.repeat))
        to_right = sum(answer.flipped == Flip.TO_RIGHT for answer in against)
        counts.append([run["point"], str(len(against)), str(len(to_wrong)), str(to_right)])
        broken += [[run["point"], *_broken(answer)] for answer in to_wrong[:SHOWN]]
    if not counts:
        return []
    found = [Section(COUNTS_TITLE, COUNTS_COLUMNS, counts)]
    return found + (
        [Section(BROKEN_TITLE, BROKEN_COLUMNS, broken, text_columns=tuple(BROKEN_COLUMNS))] if broken else []
    )


def _broken(answer: Answer) -> list[str]:
    row = f"{answer.row}" + (f" (repeat {answer.repeat})" if answer.repeat else "")
    expected = " / ".join(answer.expected)
    return [row, *(_short(text) for text in (answer.prompt, expected, answer.reference_answer or "", answer.answer))]


def _short(text: str) -> str:
    """One line, cut to TEXT_CHARS; no `|`, which would end a markdown table's cell."""
    line = " ".join(text.split()).replace("|", "¦")
    return line if len(line) <= TEXT_CHARS else line[: TEXT_CHARS - 1] + "…"
