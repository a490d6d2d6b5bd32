"""The text the long_context and passkey workloads read: Python's own documentation, which ships
with every Python (pydoc_data.topics), so no prompt is ever a download."""

from __future__ import annotations

from functools import lru_cache
from pydoc_data.topics import topics

from kvpipe import disk_cache
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
        cached = _stored_ids(tokenizer, reference_text())
        tokenizer._kvpipe_reference_ids = cached
    return cached


def _stored_ids(tokenizer, text: str) -> list[int]:
    """raw_ids(tokenizer, text), kept on disk beside the quality references (kvpipe.disk_cache:
    whole or absent, pruned with them): tokenizing the 465,000 characters takes a process 0.25-0.36 s
    on 2 cores, reading them back 0.04 s (most of it the tokenizer's digest). The key holds all the ids depend on: transformers' version, the
    tokenizer's class and settings, its whole tokenizers pipeline (vocabulary, merges, normalizer,
    pre-tokenizer) and the text; a tokenizer without a tokenizers pipeline tokenizes afresh."""
    import hashlib

    import torch
    import transformers

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return raw_ids(tokenizer, text)
    digest = hashlib.sha256()
    for part in (transformers.__version__, type(tokenizer).__qualname__, repr(sorted(tokenizer.init_kwargs.items())),
                 backend.to_str(), text):  # fmt: skip
        digest.update(part.encode() + b"\0")
    key = f"token ids of a text without special tokens, {digest.hexdigest()}"
    stored = disk_cache.load(key)
    if stored is not None:
        return stored.tolist()
    ids = raw_ids(tokenizer, text)
    disk_cache.save(key, torch.tensor(ids, dtype=torch.int32))
    return ids
