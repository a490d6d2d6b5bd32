"""From measured calls to the job's metrics: latencies with spreads, noise, memory, KV bytes, roofline."""

from __future__ import annotations

import math
import statistics

from kvpipe.cache.accounting import UnpredictableLayers, dense_fp16_bytes, kv_shape
from kvpipe.measure.clock import mean_std, percentile
from kvpipe.measure.roofline import memory_bandwidth_bytes_per_s, roofline_fraction, weights_read_bytes
from kvpipe.measure.uncertainty import with_intervals

TIMINGS = ("ttft_ms", "tpot_ms", "e2e_ms", "decode_tokens_per_s", "prefill_tokens_per_s")
NOISE_JUDGED = ("ttft_ms", "tpot_ms")  # the figures a run is marked noisy by
INTERVALS = ("ttft_ms", "tpot_ms", "decode_tokens_per_s")  # the timings that carry a confidence interval


def summarise(calls: list, loaded, strategy) -> tuple[dict[str, float], list[str]]:
    """Metrics over the measured calls (kvpipe.job.generate.Call) of one job; and notes on figures
    that could not be given."""
    metrics: dict[str, float] = {}
    per_call = per_call_figures(calls)
    for name in TIMINGS:
        values = [v for v in per_call[name] if not math.isnan(v)]
        mean, std = mean_std(values)
        metrics[name], metrics[name + "_std"], metrics[name + "_cv"] = mean, std, std / mean if mean else math.nan
    metrics["timing_noise_cv"] = repeat_noise(
        per_call, [(c.batch_size, c.prompt_tokens) for c in calls], [c.timing.itl_ms for c in calls]
    )
    itl = [ms for c in calls for ms in c.timing.itl_ms]
    for q in (50, 90, 99):
        metrics[f"itl_p{q}_ms"] = percentile(itl, q)
    # every timing's 95% interval, over the calls (and ITL's over its gaps)
    with_intervals(metrics, {name: per_call[name] for name in INTERVALS})
    with_intervals(metrics, {"itl_ms": itl})

    largest = max(calls, key=lambda c: (c.kv_tokens * c.batch_size, c.kv_bytes))
    metrics["kv_cache_bytes"] = largest.kv_bytes
    metrics["kv_cache_tokens"] = largest.kv_tokens
    if largest.kv_host_bytes:
        metrics["kv_cache_host_bytes"] = largest.kv_host_bytes
    metrics["peak_memory_bytes"] = max(c.peak.peak_bytes for c in calls)  # absolute: weights included
    metrics["peak_over_baseline_bytes"] = max(c.peak.peak_over_baseline_bytes for c in calls)
    reserved = [c.peak.peak_reserved_bytes for c in calls if c.peak.peak_reserved_bytes is not None]
    if reserved:
        metrics["peak_reserved_bytes"] = max(reserved)
    metrics["weights_bytes"] = loaded.weights_bytes
    notes = []
    try:
        kv = kv_shape(loaded.shape, largest.batch_size, loaded.dtype)
    except UnpredictableLayers as exc:
        notes.append(f"no kv_cache_bytes_fp16 or roofline_fraction: {exc}")
    else:
        notes += _kv_figures(metrics, largest, kv, loaded, strategy)
    context_ms = [c.context_prefill_ms for c in calls if getattr(c, "context_prefill_ms", None) is not None]
    if context_ms:  # the context compressed alone, then the question (press.protocol=query_agnostic)
        metrics["context_prefill_ms"] = statistics.fmean(context_ms)
    metrics["prompt_tokens"] = statistics.fmean(c.prompt_tokens for c in calls)
    metrics["new_tokens"] = statistics.fmean(c.timing.steps for c in calls)
    metrics["batch_size"] = calls[0].batch_size
    return metrics, notes


def per_call_figures(calls: list) -> dict[str, list[float]]:
    """Each TIMINGS figure of each call (NaN where a call has none: a decode rate without two tokens)."""
    return {
        "ttft_ms": [c.timing.ttft_ms for c in calls],
        "tpot_ms": [c.timing.tpot_ms for c in calls],
        "e2e_ms": [c.timing.e2e_ms for c in calls],
        "decode_tokens_per_s": [
            c.batch_size * len(c.timing.itl_ms) / (sum(c.timing.itl_ms) / 1e3) if c.timing.itl_ms else math.nan
            for c in calls
        ],
        "prefill_tokens_per_s": [c.batch_size * c.prompt_tokens / (c.timing.ttft_ms / 1e3) for c in calls],
    }


def prompt_lengths(tokens: list[int]) -> dict[str, float]:
    """The distribution of the prompts' lengths in tokens (unpadded, BOS included), over one repeat's
    batches: how many, mean, p50, p90 and max."""
    return {
        "prompt_count": len(tokens),
        "prompt_tokens_mean": statistics.fmean(tokens),
        "prompt_tokens_p50": percentile(tokens, 50),
        "prompt_tokens_p90": percentile(tokens, 90),
        "prompt_tokens_max": max(tokens),
    }


def _kv_figures(metrics: dict, largest, kv, loaded, strategy) -> list[str]:
    """The largest call's fp16 reference and compression, and the memory roofline of its decode step;
    the notes for what cannot be counted."""
    # the call's prompt and new tokens, counted from what it generated: a cache a press evicted from holds
    # fewer than prompt + new - 1, and its fp16 reference is the whole cache it replaces
    prompt, new = largest.prompt_tokens, int(largest.new_tokens.shape[1])
    metrics["kv_cache_bytes_fp16"] = dense_fp16_bytes(loaded.shape, prompt, new, largest.batch_size)
    metrics["kv_compression"] = metrics["kv_cache_bytes_fp16"] / largest.kv_bytes if largest.kv_bytes else math.nan
    metrics["kv_size_vs_fp16"] = largest.kv_bytes / metrics["kv_cache_bytes_fp16"]
    kv_traffic = strategy.decode_kv_traffic_bytes(kv, largest.kv_bytes, prompt, new, loaded.device)
    if kv_traffic is None:
        return [f"no roofline_fraction: {strategy.traffic_unknown_reason(loaded.device)}"]
    bandwidth = memory_bandwidth_bytes_per_s(loaded.device)
    metrics["weights_read_bytes_per_step"] = weights_read_per_step(loaded, largest.batch_size)
    metrics["kv_read_bytes_per_step"] = kv_traffic
    metrics["decode_bytes_per_step"] = metrics["weights_read_bytes_per_step"] + kv_traffic
    metrics["memory_bandwidth_bytes_per_s"] = bandwidth
    steps_per_s = metrics["decode_tokens_per_s"] / largest.batch_size
    metrics["roofline_fraction"] = roofline_fraction(metrics["decode_bytes_per_step"], steps_per_s, bandwidth)
    return []


def weights_read_per_step(loaded, batch_size: int) -> int:
    """Weight bytes one decode step reads: every weight once, except untied input embeddings, of
    which each sequence reads its one row (tied ones are read whole by the output head)."""
    return weights_read_bytes(
        loaded.weights_bytes, loaded.input_embedding_bytes, loaded.embedding_row_bytes, loaded.embeddings_tied,
        batch_size,
    )  # fmt: skip


def robust_cv(values: list[float]) -> float:
    """The spread of a few samples that one outlier cannot carry: 1.4826 x the median absolute
    deviation (the standard deviation, for normal samples), over the median. NaN for fewer than 2."""
    if len(values) < 2:
        return math.nan
    middle = statistics.median(values)
    if not middle:
        return math.nan
    return 1.4826 * statistics.median(abs(v - middle) for v in values) / middle


def repeat_noise(per_call: dict[str, list[float]], shapes: list[tuple], gaps: list[list[float]] = ()) -> float:
    """How noisy the timings are, from the samples a job has: between calls, the robust spread of TTFT
    and of TPOT among calls of one shape (batch size, prompt length: the repeats of a batch, or a
    workload's prompts of one length), typical (median) over shapes; within calls, the robust spread
    of each call's per-token gaps, typical over calls. The larger of the two. A typical spread, not
    the worst of eight groups of three: one slow call of one prompt is not a noisy run. NaN when no
    shape was measured twice and no call had three gaps."""
    between = []
    for name in NOISE_JUDGED:
        samples: dict[tuple, list[float]] = {}
        for shape, value in zip(shapes, per_call[name]):
            if not math.isnan(value):
                samples.setdefault(shape, []).append(value)
        between += [robust_cv(values) for values in samples.values() if len(values) >= 2]
    within = [robust_cv(call) for call in gaps if len(call) >= 3]
    typical = [statistics.median(found) for found in (between, within) if found]
    return max(typical) if typical else math.nan
