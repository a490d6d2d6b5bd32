"""The contexts and their questions: a user's JSONL file, or the bundled example made from seeds.

A file holds one context per line: `{"context": TEXT, "questions": [{"question": TEXT, "answer":
TEXT | NUMBER | [accepted, ...]}, ...]}`. Every question needs an answer; a line that is wrong is one
ConfigError naming `workload.path`, its line and what is expected.

The bundled example: `facts` seeded five-digit codes, each named by a colour, hidden at even depths of
Python's own documentation (`_texts.long_context_ids`), and one question per code. Nothing is read
from the network; the same seed makes the same contexts.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from kvpipe.errors import ConfigError
from kvpipe.workload._encoding import raw_ids
from kvpipe.workload._texts import long_context_ids
from kvpipe.workload.dataset import labelled, scoring

EXPECTED = 'expected a .jsonl file, one {"context": ..., "questions": [{"question": ..., "answer": ...}, ...]} a line'
NAMES = ("red", "blue", "green", "amber", "violet", "silver", "orange", "teal", "black", "white", "grey", "gold")
_CONTEXT_STRIDE = 104_729  # filler tokens between two contexts' starting points: each its own text


@dataclass(frozen=True)
class Question:
    """One question of one context, and the answers it accepts."""

    context: int  # the context's index (its line in a file)
    number: int  # its index among the context's questions
    text: str
    answers: tuple[str, ...]


@dataclass(frozen=True)
class Context:
    """One context: its text (a file's) or its ids (the example's), and its questions."""

    questions: tuple[Question, ...]
    text: str | None = None
    ids: tuple[int, ...] | None = None

    def context_ids(self, tokenizer) -> list[int]:
        return list(self.ids) if self.ids is not None else raw_ids(tokenizer, self.text)


def from_file(path: str, scorer: scoring.Scorer) -> list[Context]:
    """Every context of the file, each question's answers checked as the scorer needs them."""
    found = Path(path).expanduser()
    if found.suffix.lower() != ".jsonl" or not found.is_file():
        raise ConfigError("workload.path", path, ("no such file; " if not found.is_file() else "") + EXPECTED)
    contexts = []
    for number, line in enumerate(found.read_text().splitlines(), start=1):
        if line.strip():
            contexts.append(_context(path, number, line, len(contexts), scorer))
    if not contexts:
        raise ConfigError("workload.path", path, f"the file holds no context; {EXPECTED}")
    return contexts


def _context(path: str, line_number: int, line: str, index: int, scorer: scoring.Scorer) -> Context:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as error:
        raise ConfigError("workload.path", path, f"line {line_number} is not JSON ({error.msg}); {EXPECTED}") from None
    context, asked = (data.get("context"), data.get("questions")) if isinstance(data, dict) else (None, None)
    if not isinstance(context, str) or not context.strip():
        raise ConfigError("workload.path", path, f"line {line_number} has no context text; {EXPECTED}")
    if not isinstance(asked, list) or not asked:
        raise ConfigError("workload.path", path, f"line {line_number} has no questions; {EXPECTED}")
    questions = []
    for number, item in enumerate(asked):
        text = item.get("question") if isinstance(item, dict) else None
        if not isinstance(text, str) or not text.strip():
            raise ConfigError("workload.path", path, f"line {line_number}, questions[{number}] has no question text; {EXPECTED}")  # fmt: skip
        answers = labelled.accepted(path, f"questions[{number}].answer", line_number, item.get("answer"), scorer)
        questions.append(Question(index, number, text.strip(), answers))
    return Context(tuple(questions), text=context)


def example(tokenizer, contexts: int, context_tokens: int, facts: int, seed: int) -> list[Context]:
    """The bundled contexts: each `context_tokens` of filler with `facts` coded facts at even depths."""
    made = []
    for index in range(contexts):
        rng = random.Random(f"{seed}:{index}:{context_tokens}:{facts}")
        names = rng.sample(NAMES, facts)
        codes = [str(rng.randrange(10_000, 100_000)) for _ in names]
        sentences = [raw_ids(tokenizer, f" The {name} code is {code}. ") for name, code in zip(names, codes)]
        filler = long_context_ids(tokenizer, max(context_tokens - sum(map(len, sentences)), 0), index * _CONTEXT_STRIDE)
        ids, start = [], 0
        for fact, sentence in enumerate(sentences):
            cut = round((fact + 0.5) / facts * len(filler))
            ids += filler[start:cut] + sentence
            start = cut
        ids += filler[start:]
        questions = tuple(
            Question(index, number, f"What is the {name} code? Answer with the number only.", (code,))
            for number, (name, code) in enumerate(zip(names, codes))
        )
        made.append(Context(questions, ids=tuple(ids)))
    return made
