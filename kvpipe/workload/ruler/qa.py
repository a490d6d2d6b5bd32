"""RULER's QA tasks (its scripts/data/synthetic/qa.py): a question over documents, the ones that
answer it hidden among others. qa_1 asks rows with one document (RULER: SQuAD), qa_2 rows with
several (RULER: HotpotQA, multi-hop). The rows come from the user's file (`workload.qa_path`: JSON
lines or a JSON list of {context: a text or a list of texts, question, answers: a text or a list}),
or without one from the bundled example (`qa_example.py`): no SQuAD or HotpotQA download.

The other documents are every other row's, then stretches of the haystack as further documents,
the last cut to make the length exact.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from kvpipe.errors import ConfigError
from kvpipe.workload._encoding import raw_ids
from kvpipe.workload.dataset.reading import row_number
from kvpipe.workload.ruler.prompt import Draft

INTRO = (
    "Answer the question based on the given documents. Only give me the answer and do not output any "
    "other words.\n\nThe following are given documents.\n\n"
)
QUESTION = (
    "\n\nAnswer the question based on the given documents. Only give me the answer and do not output any "
    "other words.\n\nQuestion: {query}"
)
ANSWER_PREFIX = " Answer:"
DOCUMENT = "Document {i}:\n{document}\n\n"
FIELDS = "expected a JSON object with context (a text or a list of texts), question and answers (a text or a list)"
_HAYSTACK_DOCUMENT_TOKENS = 200


@dataclass(frozen=True)
class Row:
    documents: tuple[str, ...]
    question: str
    answers: tuple[str, ...]


def read(path: str | None) -> list[Row]:
    """The QA rows, checked: the user's file, or the bundled example."""
    if path is None:
        from kvpipe.workload.ruler.qa_example import ROWS

        return [_row(None, number, raw) for number, raw in enumerate(ROWS)]
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(
            "workload.qa_path", path, "expected a .jsonl or .json file that exists (or null: the example)"
        )
    text = file.read_text(encoding="utf-8")
    try:
        raws = (
            json.loads(text)
            if file.suffix == ".json"
            else [json.loads(line) for line in text.splitlines() if line.strip()]
        )
    except json.JSONDecodeError as error:
        raise ConfigError("workload.qa_path", path, f"is not valid JSON ({error}); {FIELDS} per row") from None
    if not isinstance(raws, list) or not raws:
        raise ConfigError("workload.qa_path", path, f"holds no rows; {FIELDS} per row")
    return [_row(path, row_number(index), raw) for index, raw in enumerate(raws)]


def _row(path: str | None, number: int, raw) -> Row:
    def texts(name: str) -> tuple[str, ...]:
        value = raw.get(name) if isinstance(raw, dict) else None
        value = [value] if isinstance(value, str) else value
        if not value or not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise ConfigError("workload.qa_path", path, f"row {number} has no {name}; {FIELDS}")
        return tuple(value)

    question = texts("question")
    return Row(texts("context"), question[0], texts("answers"))


def eligible(rows: list[Row], several: bool) -> list[Row]:
    """qa_1's rows (one document) or qa_2's (several)."""
    return [row for row in rows if (len(row.documents) > 1) == several]


def draft(tokenizer, rng: random.Random, row: Row, rows: list[Row], haystack) -> Draft:
    """The row's documents at seeded places among the others; RULER's string_match_part scores it."""
    others = sorted({d for other in rows if other is not row for d in other.documents} - set(row.documents))
    rng.shuffle(others)
    depths = sorted(rng.random() for _ in row.documents)
    context = _documents(tokenizer, list(row.documents), others, depths, haystack)
    minimum = len(context(0, whole_only=True))
    return Draft(INTRO, QUESTION.format(query=row.question), ANSWER_PREFIX, list(row.answers), context, minimum)


def _documents(tokenizer, gold: list[str], others: list[str], depths: list[float], haystack):
    """A builder of n context tokens: as many whole other documents as fit with the gold ones placed
    at their depths, numbered in order, then the next document cut to fill."""
    known: dict[tuple, list[int]] = {}

    def piece(number: int, document) -> list[int]:
        key = (number, document)
        if key not in known:
            if isinstance(document, int):  # the haystack's own stretch number `document`
                ids = haystack((document + 1) * _HAYSTACK_DOCUMENT_TOKENS)[-_HAYSTACK_DOCUMENT_TOKENS:]
                known[key] = raw_ids(tokenizer, f"Document {number}:\n") + ids + raw_ids(tokenizer, "\n\n")
            else:
                known[key] = raw_ids(tokenizer, DOCUMENT.format(i=number, document=document))
        return known[key]

    def distractor(index: int):
        return others[index] if index < len(others) else index - len(others)

    def ordered(count: int) -> list:
        listed = [distractor(i) for i in range(count)]
        for depth, document in zip(depths, gold):
            listed.insert(round(depth * len(listed)), document)
        return listed

    def ids_of(listed: list) -> list[int]:
        return [t for number, document in enumerate(listed, 1) for t in piece(number, document)]

    def build(n: int, whole_only: bool = False) -> list[int]:
        count = 0
        while not whole_only and len(ids_of(ordered(count + 1))) <= n:
            count += 1
        listed = ordered(count)
        ids = ids_of(listed)
        if whole_only:
            return ids
        while len(ids) < n:  # numbering may leave a token or two: the next document, cut, fills them
            ids += piece(len(listed) + 1, distractor(count))[: n - len(ids)]
            listed, count = [*listed, distractor(count)], count + 1
        return ids

    return build
