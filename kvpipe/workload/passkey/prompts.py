"""The passkey-retrieval workload's prompts: a seeded random key hidden at a chosen depth of filler
text, then a question, through the model's chat template, each exactly `context_tokens` long.

The filler is Python's own documentation (the long_context text, `_texts.reference_text`):
real, varied technical prose rather than a few sentences repeated, so the key's sentence is not
trivially the one odd line out. Each trial starts the filler at another place in that text.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from kvpipe.errors import ConfigError
from kvpipe.workload._encoding import raw_ids, template_parts, with_prefix
from kvpipe.workload._texts import long_context_ids

INSTRUCTION = "A pass key is hidden in the text below. Find it and remember it.\n\n"
QUESTION = "\n\nWhat is the pass key? Answer with the number only."
_TRIAL_STRIDE = 104_729  # filler tokens between two trials' starting points: each its own text


@dataclass(frozen=True)
class PasskeyPrompt:
    """One prompt of the workload: its token ids, the key, and where the key starts."""

    input_ids: list[int]
    key: str
    context_tokens: int
    depth: float
    trial: int
    needle_start: int  # token index of the needle sentence in input_ids
    question_tokens: int = 0  # the trailing ids that ask for the key: the question and the template's suffix


def passkey_key(seed: int, context_tokens: int, depth: float, trial: int, digits: int = 5) -> str:
    """The key of one cell and trial: random digits, the same for the same seed, cell and trial."""
    rng = random.Random(f"{seed}:{context_tokens}:{depth}:{trial}")
    return str(rng.randrange(10 ** (digits - 1), 10**digits))


def needle(key: str) -> str:
    return f" The pass key is {key}. Remember it. {key} is the pass key. "


def passkey_prompt(tokenizer, context_tokens: int, depth: float, key: str, trial: int = 0) -> PasskeyPrompt:
    """Exactly `context_tokens` ids: template prefix (BOS once, where the tokenizer adds one),
    instruction, filler with the needle at `depth` (a fraction of the filler), the question,
    template suffix."""
    before, after = template_parts(tokenizer)
    prefix, suffix = with_prefix(tokenizer, raw_ids(tokenizer, before)), raw_ids(tokenizer, after)
    intro = raw_ids(tokenizer, INSTRUCTION)
    question = raw_ids(tokenizer, QUESTION)
    needle_ids = raw_ids(tokenizer, needle(key))
    fixed = len(prefix) + len(intro) + len(needle_ids) + len(question) + len(suffix)
    filler_tokens = context_tokens - fixed
    if filler_tokens < 0:
        raise ConfigError(
            "workload.context_tokens", context_tokens, f"expected at least {fixed}: the template, question and key"
        )
    filler = long_context_ids(tokenizer, filler_tokens, offset=trial * _TRIAL_STRIDE)
    cut = round(depth * filler_tokens)
    head = prefix + intro + filler[:cut]
    ids = head + needle_ids + filler[cut:] + question + suffix
    return PasskeyPrompt(
        ids, key, context_tokens, depth, trial, needle_start=len(head), question_tokens=len(question) + len(suffix)
    )


def prompts(tokenizer, lengths: list[int], depths: list[float], trials: int, seed: int) -> list[PasskeyPrompt]:
    """Every prompt of a passkey workload: each length, each depth, each trial, in that order; each
    with its own seeded key and its own stretch of filler."""
    return [
        passkey_prompt(tokenizer, length, depth, passkey_key(seed, length, depth, trial), trial)
        for length in lengths
        for depth in depths
        for trial in range(trials)
    ]


def found(answer: str, key: str) -> bool:
    """Retrieval succeeded: the exact key appears in the answer as a whole number."""
    import re

    return re.search(rf"(?<!\d){re.escape(key)}(?!\d)", answer) is not None
