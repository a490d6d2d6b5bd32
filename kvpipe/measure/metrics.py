"""From measured calls to the job's metrics: latencies with spreads, memory, KV bytes, roofline."""

from __future__ import annotations

import statistics

from kvpipe.cache.accounting import dense_fp16_bytes
from kvpipe.measure.clock import mean_std, percentile
from kvpipe.measure.roofline import memory_bandwidth_bytes_per_s, roofline_fraction


def summarise(calls: list, loaded) -> dict[str, float]:
    """Metrics over the measured calls (kvpipe.job.generate.Call) of one job."""
    metrics: dict[str, float] = {}

    def put(name: str, values: list[float]) -> None:
        metrics[name], metrics[name + "_std"] = mean_std(values)

    put("ttft_ms", [c.timing.ttft_ms for c in calls])
    put("tpot_ms", [c.timing.tpot_ms for c in calls])
    put("e2e_ms", [c.timing.e2e_ms for c in calls])
    put(
        "decode_tokens_per_s",
        [c.batch_size * len(c.timing.itl_ms) / (sum(c.timing.itl_ms) / 1e3) for c in calls if c.timing.itl_ms],
    )
    put("prefill_tokens_per_s", [c.batch_size * c.prompt_tokens / (c.timing.ttft_ms / 1e3) for c in calls])
    itl = [ms for c in calls for ms in c.timing.itl_ms]
    for q in (50, 90, 99):
        metrics[f"itl_p{q}_ms"] = percentile(itl, q)

    largest = max(calls, key=lambda c: (c.kv_tokens * c.batch_size, c.kv_bytes))
    metrics["kv_cache_bytes"] = largest.kv_bytes
    metrics["kv_cache_tokens"] = largest.kv_tokens
    metrics["kv_cache_bytes_fp16"] = dense_fp16_bytes(loaded.shape, largest.kv_tokens, largest.batch_size)
    metrics["kv_compression"] = metrics["kv_cache_bytes_fp16"] / largest.kv_bytes if largest.kv_bytes else float("nan")
    metrics["peak_memory_bytes"] = max(c.peak.peak_bytes for c in calls)
    reserved = [c.peak.peak_reserved_bytes for c in calls if c.peak.peak_reserved_bytes is not None]
    if reserved:
        metrics["peak_reserved_bytes"] = max(reserved)
    metrics["weights_bytes"] = loaded.weights_bytes
    # Roofline: each decode step reads every weight once and the whole KV cache once (upper bound:
    # the final cache), so steps/s x bytes/step over the copy bandwidth is the fraction achieved.
    bandwidth = memory_bandwidth_bytes_per_s(loaded.device)
    metrics["decode_bytes_per_step"] = loaded.weights_bytes + largest.kv_bytes
    metrics["memory_bandwidth_bytes_per_s"] = bandwidth
    steps_per_s = metrics["decode_tokens_per_s"] / largest.batch_size
    metrics["roofline_fraction"] = roofline_fraction(metrics["decode_bytes_per_step"], steps_per_s, bandwidth)
    metrics["prompt_tokens"] = statistics.fmean(c.prompt_tokens for c in calls)
    metrics["new_tokens"] = statistics.fmean(c.timing.steps for c in calls)
    metrics["batch_size"] = calls[0].batch_size
    return metrics
