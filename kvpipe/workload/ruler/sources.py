"""What RULER's tasks are made of, from text every Python ships (so no prompt is a download): the
haystack (Python's own documentation, `_texts.reference_text`, in place of RULER's Paul Graham
essays; or the user's own text, `workload.haystack_path`), and a word list drawn from that same
documentation in place of the `wonderwords` package's nouns, adjectives and verbs."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Callable

from kvpipe.errors import ConfigError
from kvpipe.workload._encoding import raw_ids
from kvpipe.workload._texts import long_context_ids, reference_text

_SAMPLE_STRIDE = 104_729  # haystack tokens between two samples' starting points: each its own text


@lru_cache(maxsize=1)
def words() -> tuple[str, ...]:
    """Plain lower-case English words of the documentation (4-10 letters, used at least twice,
    so mostly ordinary words rather than identifiers), sorted."""
    counts: dict[str, int] = {}
    for word in re.findall(r"(?<![\w.])[a-z]{4,10}(?![\w(])", reference_text()):
        counts[word] = counts.get(word, 0) + 1
    return tuple(sorted(word for word, count in counts.items() if count >= 2))


def read_haystack(path: str) -> str:
    """The user's haystack text, checked: a readable, non-empty text file."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError("workload.haystack_path", path, "expected a text file that exists (or null: Python's docs)")
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError("workload.haystack_path", path, "expected UTF-8 text") from None
    if not text.strip():
        raise ConfigError("workload.haystack_path", path, "the file is empty; expected long text")
    return text


def haystack(tokenizer, path: str | None, sample: int) -> Callable[[int], list[int]]:
    """n haystack tokens for one sample: Python's docs from the sample's own starting point, or the
    user's text from its start (never wrapped: too short a file is named, with what it holds)."""
    if path is None:
        return lambda n: long_context_ids(tokenizer, n, offset=sample * _SAMPLE_STRIDE)
    ids = _file_ids(tokenizer, path)

    def take(n: int) -> list[int]:
        if n > len(ids):
            raise ConfigError(
                "workload.haystack_path",
                path,
                f"holds {len(ids)} tokens; expected at least {n} for the longest workload.context_tokens, "
                "or shorter lengths",
            )
        return ids[:n]

    return take


def _file_ids(tokenizer, path: str) -> list[int]:
    cached = getattr(tokenizer, "_kvpipe_haystack_ids", {})
    if path not in cached:
        cached[path] = raw_ids(tokenizer, read_haystack(path))
        tokenizer._kvpipe_haystack_ids = cached
    return cached[path]
