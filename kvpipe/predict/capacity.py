"""Capacity: the most requests of one size a cache lets in flight at once beside the weights, and the
decode floor at that many (one step reads the weights once for the whole batch, and each sequence's
keys and values).

Needs at N requests: weights + the cache of N sequences + the larger transient of one request (its
prefill's largest activation, or a quantized layer's dequantized copy); with no hardware named,
weights + cache, as plan's `fits up to` counts them. A paged cache's pool counts by its blocks."""

from __future__ import annotations

from dataclasses import dataclass

from kvpipe.predict.costs import costs_for
from kvpipe.predict.floors import split

MOST = 1 << 20  # requests: an upper bound for the search, far past any accelerator's memory


@dataclass(frozen=True)
class Capacity:
    """`requests` of `context` tokens each fit; the TPOT floor at that many (None: no hardware, none
    fit, or traffic the roofline does not count)."""

    context: int
    requests: int
    needs_bytes: int | None  # at that many (None: none fit)
    tpot_floor_ms: float | None = None


def capacity(spec, strategy, device: str, dtype: str, context: int, memory: int, hardware=None) -> Capacity:
    """The most requests of `context` tokens (prompt + workload.max_new_tokens) that fit `memory`."""
    prompt, new = split(context, spec.workload.max_new_tokens)
    one = costs_for(spec, device, dtype, 1).at(strategy, prompt, new)
    transient = max(one.activation_bytes, one.dequantized_copy_bytes) if hardware is not None else 0

    def needs(requests: int) -> int:
        cost = costs_for(spec, device, dtype, requests).at(strategy, prompt, new)
        return cost.weights_bytes + cost.kv_cache_bytes + transient

    if needs(1) > memory:
        return Capacity(context, 0, None)
    low, high = 1, MOST  # low always fits
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if needs(middle) <= memory else (low, middle - 1)
    floor = None
    if hardware is not None:
        floor = costs_for(spec, device, dtype, low).at(strategy, prompt, new).tpot_floor_ms(hardware)
    return Capacity(context, low, needs(low), floor)
