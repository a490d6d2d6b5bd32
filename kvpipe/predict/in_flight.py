"""Requests in flight: the most requests of one size a cache lets in flight at once beside the weights, and the
decode floor at that many (one step reads the weights once for the whole batch, and each sequence's
keys and values).

Needs at N requests: weights + the cache of N sequences + the larger transient: one request's prefill
(its largest activation: requests are prefilled one at a time), or the copy a decode step makes of the
layer it reads (a quantized layer dequantized, a paged layer's pages gathered), which holds that layer
for all N requests at once; with no hardware named, weights + cache, as plan's `fits up to` counts them. A paged cache's pool counts by its blocks; a
pool of fixed size (cache.num_blocks) holds no more requests than its blocks take, whatever the memory.

An offloading cache keeps on the device only the layer in use and the next, prefetched (and, where
cache.offload_only_non_sliding, the sliding layers); transformers moves every other layer to host
memory between uses, so host memory must hold those layers' keys and values for every request in
flight: the whole cache less its device part. Its capacity is then the smaller of the device's and
the host's bound; without a host figure (the hardware entry names none, and no --host-memory) it is
the device's, and says that host memory was not counted."""

from __future__ import annotations

from dataclasses import dataclass

from kvpipe.predict.costs import costs_for
from kvpipe.predict.floors import split

MOST = 1 << 20  # requests: an upper bound for the search, far past any accelerator's memory
DEVICE, HOST, HOST_NOT_COUNTED = "device", "host", "device; host memory not counted"


@dataclass(frozen=True)
class InFlight:
    """`requests` of `context` tokens each fit; the TPOT floor at that many (None: no hardware, none
    fit, or traffic the roofline does not count). `bound`: which memory sets it (DEVICE, HOST, or
    HOST_NOT_COUNTED for an offloading cache without a host figure); `device_requests`: what the
    device alone lets in; `host_kv_bytes`: the KV in host memory at `requests` (0: none offloaded)."""

    context: int
    requests: int
    needs_bytes: int | None  # at that many (None: none fit)
    tpot_floor_ms: float | None = None
    bound: str = DEVICE
    device_requests: int | None = None
    host_kv_bytes: int = 0


def requests_in_flight(spec, strategy, device: str, dtype: str, context: int, memory: int, hardware=None,
             host_memory: int | None = None) -> InFlight:  # fmt: skip
    """The most requests of `context` tokens (prompt + workload.max_new_tokens) that fit `memory`, and
    for an offloading cache `host_memory` too (bytes; None: not counted, and said so)."""
    prompt, new = split(context, spec.workload.max_new_tokens)
    prefill = costs_for(spec, device, dtype, 1).at(strategy, prompt, new).activation_bytes

    def needs(requests: int) -> int:
        cost = costs_for(spec, device, dtype, requests).at(strategy, prompt, new)
        transient = max(prefill, cost.dequantized_copy_bytes) if hardware is not None else 0
        return cost.weights_bytes + cost.kv_cache_bytes + transient

    def on_host(requests: int) -> int:
        kv = costs_for(spec, device, dtype, requests).kv
        whole = strategy.predict_kv_bytes(kv, prompt, new)
        return whole - strategy.predict_kv_bytes(strategy.device_kv_shape(kv, device), prompt, new)

    sequence = costs_for(
        spec, device, dtype, 1
    ).kv  # a fixed pool (cache.num_blocks) holds so many, whatever the memory
    on_device = most(
        lambda requests: needs(requests) <= memory and strategy.holds_requests(sequence, prompt, new, requests)
    )
    offloads = on_host(1) > 0
    bound = DEVICE if not offloads else HOST_NOT_COUNTED if host_memory is None else DEVICE
    requests = on_device
    if offloads and host_memory is not None:
        on_host_most = most(lambda requests: on_host(requests) <= host_memory)
        if on_host_most < on_device:
            requests, bound = on_host_most, HOST
    if requests == 0:
        return InFlight(context, 0, None, None, bound, on_device)
    floor = None
    if hardware is not None:
        floor = costs_for(spec, device, dtype, requests).at(strategy, prompt, new).tpot_floor_ms(hardware)
    host_bytes = on_host(requests) if offloads else 0
    return InFlight(context, requests, needs(requests), floor, bound, on_device, host_bytes)


def most(fits) -> int:
    """The largest request count up to MOST that fits (fits grows false as the count grows); 0 if none."""
    if not fits(1):
        return 0
    low, high = 1, MOST  # low always fits
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low
