"""One RULER prompt at an exact token length: the chat template's prefix, the task's text before its
context, a context of exactly the tokens left over, its question, the template's suffix and RULER's
answer prefix (after the assistant header, where RULER's own prepare.py puts it).

A task first draws what a sample needs (its needles, question and expected answers) as a `Draft`,
whose `context(n)` then builds exactly n context tokens around them: needles spliced into haystack
tokens (`spliced`), lines of noise with needle lines between them (`between_lines`), or a list
grown to fit and padded with newlines (`grown`). Pure Python over token ids.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

from kvpipe.errors import ConfigError
from kvpipe.workload._encoding import raw_ids, template_parts, with_prefix


@dataclass
class Draft:
    """A sample before its length is known: the text before the context (`intro`), the question
    after it, RULER's answer prefix, the strings a right answer holds, and how to build a context of
    exactly n tokens (at least `minimum`: what holds every needle)."""

    intro: str
    question: str
    answer_prefix: str
    expected: list[str]
    context: Callable[[int], list[int]]
    minimum: int


@dataclass(frozen=True)
class RulerPrompt:
    """One prompt of the suite: its ids, and the facts its scoring needs."""

    task: str
    context_tokens: int
    sample: int
    input_ids: list[int]
    expected: tuple[str, ...]
    question: str
    question_tokens: int  # trailing ids that are the question, the template's suffix and the answer prefix


def assemble(tokenizer, task: str, length: int, sample: int, draft: Draft) -> RulerPrompt:
    """Exactly `length` ids; a length too short for the task's template, needles and question is
    the user's to fix, named before the model loads."""
    before, after = template_parts(tokenizer)
    head = with_prefix(tokenizer, raw_ids(tokenizer, before)) + raw_ids(tokenizer, draft.intro)
    tail = raw_ids(tokenizer, draft.question) + raw_ids(tokenizer, after) + raw_ids(tokenizer, draft.answer_prefix)
    budget = length - len(head) - len(tail)
    if budget < draft.minimum:
        raise ConfigError(
            "workload.context_tokens",
            length,
            f"expected at least {len(head) + len(tail) + draft.minimum} for task {task} "
            "(its template, needles and question), or workload.tasks without it",
        )
    ids = head + draft.context(budget) + tail
    assert len(ids) == length, (task, len(ids), length)  # our bug, not the user's
    return RulerPrompt(task, length, sample, ids, tuple(draft.expected), draft.question.strip(), len(tail))


def spliced(haystack: Callable[[int], list[int]], needles: list[list[int]], depths: list[float]):
    """A context builder: haystack tokens with each needle spliced in at its depth (a fraction of
    the haystack), in the order given."""

    def build(n: int) -> list[int]:
        filler = haystack(n - sum(len(needle) for needle in needles))
        cuts = sorted(round(depth * len(filler)) for depth in depths)
        ids, start = [], 0
        for cut, needle in zip(cuts, needles):
            ids += filler[start:cut] + needle
            start = cut
        return ids + filler[start:]

    return build


def between_lines(tokenizer, filler_line: Callable[[], str], needles: list[str], rng: random.Random):
    """A context builder: lines of filler (each from `filler_line()`) with the needle lines put
    between them at seeded places, in the order given; the last filler line is cut to fit."""
    needle_ids = [raw_ids(tokenizer, needle + "\n") for needle in needles]
    state = rng.getstate()
    known: dict[str, list[int]] = {}  # a noise line repeats: tokenize it once

    def line_ids(text: str) -> list[int]:
        if text not in known:
            known[text] = raw_ids(tokenizer, text + "\n")
        return known[text]

    def build(n: int) -> list[int]:
        rng.setstate(state)  # the same sample whatever n is asked
        budget = n - sum(len(ids) for ids in needle_ids)
        lines: list[list[int]] = []
        total = 0
        while total < budget:
            lines.append(line_ids(filler_line()))
            total += len(lines[-1])
        whole = len(lines) - (total > budget)  # the last line only where it fits whole
        places = range(whole + 1)
        pick = rng.sample if len(places) >= len(needles) else rng.choices
        at = sorted(pick(places, k=len(needles)))
        kept = sum(len(line) for line in lines[:whole])
        tail = [token for line in lines[whole:] for token in line][: budget - kept]
        return _interleave(lines[:whole], needle_ids, at) + tail

    return build


def _interleave(lines: list[list[int]], needles: list[list[int]], places: list[int]) -> list[int]:
    """The lines with needles[i] before lines[places[i]] (places sorted; len(lines): at the end)."""
    ids: list[int] = []
    pending = list(zip(places, needles))
    for index in range(len(lines) + 1):
        while pending and pending[0][0] == index:
            ids += pending.pop(0)[1]
        if index < len(lines):
            ids += lines[index]
    return ids


def grown(tokenizer, text_of: Callable[[int], str], least: int, pad: str = "\n"):
    """A context builder for a list that grows with a count (cwe's words, fwe's coded words): the
    longest `text_of(count)` that fits, from `least` up, padded to exactly n with `pad`'s tokens
    (fewer than one more item's). Returns (build, minimum)."""
    pad_id = (raw_ids(tokenizer, pad) or raw_ids(tokenizer, " ."))[-1:]  # a tokenizer that drops whitespace: a dot

    def tokens(count: int) -> list[int]:
        return raw_ids(tokenizer, text_of(count))

    def build(n: int) -> list[int]:
        low, high = least, max(least + 1, n)  # a count never costs fewer than one token per item
        while low < high:  # the largest count that fits (token counts grow with the count)
            middle = (low + high + 1) // 2
            low, high = (middle, high) if len(tokens(middle)) <= n else (low, middle - 1)
        ids = tokens(low)
        return ids + pad_id * (n - len(ids))

    return build, len(tokens(least))
