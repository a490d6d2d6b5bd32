"""RULER's needle-in-a-haystack tasks (its scripts/data/synthetic/niah.py): needles "One of the
special magic {numbers} for {key} is: {value}." hidden in a haystack of noise sentences, of
documentation text, or of other needles, and a question for one key's values or several keys'.

As RULER: 7-digit numbers, UUIDs from a seeded `random` (uuid4 form), keys of two hyphenated words
(RULER pairs an adjective with a noun from `wonderwords`; here two words of `sources.words`), needles
at depths drawn from RULER's 40 evenly spaced ones (documentation haystack) or between whole
lines (noise and needle haystacks), and the singular wording where one value is asked.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass

from kvpipe.workload._encoding import raw_ids
from kvpipe.workload.ruler import sources
from kvpipe.workload.ruler.prompt import Draft, between_lines, spliced

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "One of the special magic {kind} for {key} is: {value}."
INTRO = (
    "Some special magic {kind} are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {kind} afterwards.\n"
)
QUESTION = "\nWhat are all the special magic {kind} for {query} mentioned in the provided text?"
ANSWER_PREFIX = " The special magic {kind} for {query} mentioned in the provided text are"
DEPTHS = [round(100 * i / 39) for i in range(40)]  # RULER's np.linspace(0, 100, 40), rounded


@dataclass(frozen=True)
class Needles:
    """One niah task's shape, as RULER's synthetic.yaml gives it."""

    haystack: str  # noise | essay | needle
    key_kind: str = "words"  # words | uuids
    value_kind: str = "numbers"  # numbers | uuids
    keys: int = 1
    values: int = 1
    queries: int = 1


def value(kind: str, rng: random.Random) -> str:
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    return "-".join(rng.sample(sources.words(), 2))


def draft(shape: Needles, tokenizer, rng: random.Random, haystack) -> Draft:
    """One sample: its keys and values, the needles shuffled, and a context builder that hides them."""
    keys, values, needles = [], [], []
    for _ in range(max(shape.keys, shape.queries)):
        keys.append(value(shape.key_kind, rng))
        values.append([value(shape.value_kind, rng) for _ in range(shape.values)])
        needles += [NEEDLE.format(kind=shape.value_kind, key=keys[-1], value=v) for v in values[-1]]
    rng.shuffle(needles)
    asked = rng.sample(range(len(keys)), shape.queries)
    query = _listed([keys[i] for i in asked])
    expected = [v for i in asked for v in values[i]]
    if shape.haystack == "essay":
        depths = sorted(d / 100 for d in rng.sample(DEPTHS, len(needles)))
        pieces = [raw_ids(tokenizer, f" {needle} ") for needle in needles]
        context, minimum = spliced(haystack, pieces, depths), sum(len(p) for p in pieces)
    else:
        filler = (lambda: NOISE) if shape.haystack == "noise" else _distractor(shape, rng)
        context = between_lines(tokenizer, filler, needles, rng)
        minimum = sum(len(raw_ids(tokenizer, needle + "\n")) for needle in needles)
    words = [INTRO, QUESTION, ANSWER_PREFIX]
    if shape.queries * shape.values == 1:
        words = [_singular(text) for text in words]
    kind = shape.value_kind if shape.queries * shape.values > 1 else shape.value_kind[:-1]
    intro, question, prefix = (text.format(kind=kind, query=query) for text in words)
    return Draft(intro, question, prefix, expected, context, minimum)


def _distractor(shape: Needles, rng: random.Random):
    """RULER's `needle` haystack: lines that are needles of other, random keys."""
    return lambda: NEEDLE.format(kind=shape.value_kind, key=value(shape.key_kind, rng),
                                 value=value(shape.value_kind, rng))  # fmt: skip


def _listed(keys: list[str]) -> str:
    return ", ".join(keys[:-1]) + ", and " + keys[-1] if len(keys) > 1 else keys[0]


def _singular(text: str) -> str:
    """RULER's wording where one value is asked for (its own string replacements, in its order)."""
    return text.replace("Some", "A").replace("are all", "is").replace("are", "is").replace("answers", "answer")
