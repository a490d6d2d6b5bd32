"""The out-of-memory policy: retry with the next strategy of `fallback`, as the KV-cache guide's
resilient-generation pattern does, and record what happened."""

from __future__ import annotations

import logging

from kvpipe.errors import first_line
from kvpipe.measure.memory import release_freed_memory

log = logging.getLogger(__name__)


def with_fallback(spec, loaded, measure):
    """measure(spec) under the planned strategy; after an out-of-memory error, free memory and try
    the next strategy of spec.fallback (with its default settings). Returns (spec that ran, what
    measure returned, fallback tags)."""
    import torch

    chain = [spec.cache.strategy, *[s for s in spec.fallback if s != spec.cache.strategy]]
    first_error = None
    for index, strategy in enumerate(chain):
        attempt = spec if index == 0 else spec.with_strategy(strategy, defaults=True)
        try:
            measured = measure(attempt)
        except (torch.OutOfMemoryError, MemoryError) as exc:
            first_error = first_error or f"{type(exc).__name__}: {first_line(exc)}"
            release_freed_memory(loaded.device)
            if index == len(chain) - 1:
                raise
            log.warning(
                "cache=%s ran out of memory (%s); retrying with cache=%s", strategy, first_error, chain[index + 1]
            )
            continue
        tags = {}
        if index:
            tags = {"fallback_from": spec.cache.strategy, "fallback_to": strategy, "fallback_error": first_error}
        return attempt, measured, tags
    raise AssertionError("unreachable: the chain always holds the planned strategy")
