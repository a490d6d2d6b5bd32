"""The text the long_context and passkey workloads read: Python's own documentation, which ships
with every Python (pydoc_data.topics), so no prompt is ever a download."""

from __future__ import annotations

from functools import lru_cache
from pydoc_data.topics import topics

from kvpipe.workload._encoding import raw_ids


@lru_cache(maxsize=1)
def reference_text() -> str:
    """Real English text: the pydoc topic pages, in a fixed order."""
    return "\n\n".join(topics[name] for name in sorted(topics))


def long_context_ids(tokenizer, tokens: int, offset: int = 0) -> list[int]:
    """Exactly `tokens` token ids of reference text, starting `offset` tokens in (wrapping around)."""
    ids = _reference_ids(tokenizer)
    start = offset % len(ids)
    window = (ids[start:] + ids)[:tokens]
    while len(window) < tokens:
        window += ids[: tokens - len(window)]
    return window


def _reference_ids(tokenizer) -> list[int]:
    cached = getattr(tokenizer, "_kvpipe_reference_ids", None)
    if cached is None:
        cached = raw_ids(tokenizer, reference_text())
        tokenizer._kvpipe_reference_ids = cached
    return cached
