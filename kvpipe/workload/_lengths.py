"""`workload.context_tokens` as the workloads that sweep prompt lengths read it (passkey, ruler)."""

from __future__ import annotations

from kvpipe.errors import ConfigError


def context_lengths(value) -> list[int]:
    """A sorted list of distinct positive ints (one value is a list of one); else a ConfigError."""
    lengths = list(value) if isinstance(value, (list, tuple)) else [value]
    if not lengths or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in lengths):
        raise ConfigError("workload.context_tokens", value, "expected a positive integer or a list of them")
    return sorted(set(lengths))
