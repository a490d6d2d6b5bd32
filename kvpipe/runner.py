"""One job: plan -> model + cache -> measured generation -> JobResult.

The runner measures; it never records. Writing result.json and MLflow happen in record.py.
"""

from __future__ import annotations

import gc
import logging
import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from kvpipe import caches, models, workloads
from kvpipe.errors import KvpipeError, first_line
from kvpipe.measure import PeakMemory, Timing, TokenClock, mean_std, memory_bandwidth_bytes_per_s, percentile
from kvpipe.plan import Plan

log = logging.getLogger(__name__)


@dataclass
class JobResult:
    """Everything one job measured, in plain types (JSON-ready)."""

    metrics: dict[str, float]
    tags: dict[str, str]
    texts: list[dict[str, str]]
    notes: list[str] = field(default_factory=list)


@dataclass
class _Call:
    timing: Timing
    peak: PeakMemory
    batch_size: int
    prompt_tokens: int
    kv_bytes: int
    kv_tokens: int
    new_tokens: Any  # LongTensor [batch, steps]


def run_job(plan: Plan) -> JobResult:
    """Load (or reuse) the model, build the cache, generate with warm-up and repeats, measure."""
    shape = models.describe(plan.model)
    tokenizer = models.load_tokenizer(plan.model)
    device = models.resolve_device(plan.model.device)
    batches = workloads.build_batches(plan.workload, tokenizer, device)
    longest_prompt = max(b.prompt_tokens for b in batches)
    caches.validate_for_model(plan, shape, longest_prompt)

    loaded = models.load(plan.model)
    plan, setup, calls, warmup_ms, fallback_tags = _measure_with_fallback(plan, loaded, longest_prompt, batches)
    metrics = _summarise(calls, loaded, shape)
    metrics["warmup_ms"] = sum(warmup_ms)
    metrics["load_ms"] = loaded.load_s * 1e3
    if plan.cache.compile:
        # The first call compiles; its extra time over a steady call of the same batch is compile time.
        steady_first_batch = [c.timing.e2e_ms for c in calls[:: len(batches)]]
        metrics["compile_ms"] = max(0.0, warmup_ms[0] - min(steady_first_batch))
    tags = {
        "cache.requested": setup.requested,
        "cache.effective": setup.effective,
        "device": loaded.device,
        "dtype": loaded.dtype,
        "peak_memory_source": calls[0].peak.source,
        **fallback_tags,
        **_versions(),
    }
    if plan.quality.enabled:
        from kvpipe import quality

        started = time.perf_counter()
        generated = [c.new_tokens for c in calls[: len(batches)]]
        metrics.update(quality.measure(loaded, plan.model, plan.workload, plan.quality, batches, generated,
                                       setup.make_cache))
        metrics["quality_ms"] = (time.perf_counter() - started) * 1e3
    texts = _texts(loaded.tokenizer, batches, calls[: len(batches)])
    return JobResult(metrics=metrics, tags=tags, texts=texts, notes=[*plan.warnings, *setup.notes])


def _measure_with_fallback(plan: Plan, loaded: models.LoadedModel, longest_prompt: int, batches):
    """Measure with the planned cache; on out-of-memory, free memory and retry with the next
    strategy of `fallback` (the guide's resilient-generation pattern, as a policy)."""
    import torch

    chain = [plan.cache.strategy, *[s for s in plan.fallback if s != plan.cache.strategy]]
    first_error = None
    for index, strategy in enumerate(chain):
        attempt = plan if index == 0 else replace(plan, cache=replace(plan.cache, strategy=strategy, compile=False))
        setup = caches.build(attempt, loaded, longest_prompt)
        try:
            calls, warmup_ms = _measure(attempt, loaded, setup, batches)
        except (torch.OutOfMemoryError, MemoryError) as exc:
            first_error = first_error or f"{type(exc).__name__}: {first_line(exc)}"
            _release_freed_memory(loaded.device)
            if index == len(chain) - 1:
                raise
            log.warning("cache=%s ran out of memory (%s); retrying with cache=%s", strategy, first_error,
                        chain[index + 1])
            continue
        tags = {}
        if index:
            tags = {"fallback_from": plan.cache.strategy, "fallback_to": strategy, "fallback_error": first_error}
            setup.notes.append(f"cache={plan.cache.strategy} ran out of memory; measured cache={strategy} instead")
            setup.requested = plan.cache.strategy
        return attempt, setup, calls, warmup_ms, tags
    raise AssertionError("unreachable: the chain always holds the planned strategy")


def _measure(plan: Plan, loaded: models.LoadedModel, setup: caches.CacheSetup, batches):
    """Warm-up calls (timed, not measured), then the measured calls."""
    if plan.cache.compile and plan.workload.warmup == 0:
        setup.notes.append("cache.compile needs a warm-up call to compile outside the timings; ran 1")
    warmup_calls = max(plan.workload.warmup, 1 if plan.cache.compile else 0)
    warmup_ms: list[float] = []
    calls: list[_Call] = []
    with progress_bar(f"{setup.effective}", (warmup_calls + plan.workload.repeats) * len(batches)) as advance:
        for _ in range(warmup_calls):
            for batch in batches:
                warmup_ms.append(measured_generate(plan, loaded, setup, batch).timing.e2e_ms)
                advance()
        for _ in range(plan.workload.repeats):
            for batch in batches:
                calls.append(measured_generate(plan, loaded, setup, batch))
                advance()
    return calls, warmup_ms


@contextmanager
def _backend_errors(plan: Plan, batch):
    """A quantization backend that fails for some shape says which combination and shape, in one line."""
    import torch

    try:
        yield
    except torch.OutOfMemoryError:
        raise  # not a backend bug: the OOM fallback handles it
    except (RuntimeError, ValueError, AssertionError) as exc:
        if plan.cache.strategy != "quantized":
            raise
        backend, axis = plan.backend, plan.axis
        raise KvpipeError(
            f"cache=quantized backend={backend.name} backend.nbits={backend.nbits} axis={axis.layout} "
            f"backend.q_group_size={backend.q_group_size} backend.residual_length={backend.residual_length} "
            f"failed inside the backend for batch {batch.input_ids.shape[0]} x {batch.prompt_tokens} prompt tokens: "
            f"{type(exc).__name__}: {first_line(exc)}"
        ) from exc


@contextmanager
def progress_bar(label: str, total: int):
    """A rich progress bar with ETA on a terminal; silent otherwise (logs, CI, pipes)."""
    if not sys.stderr.isatty():
        yield lambda: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, transient=True) as progress:
        task = progress.add_task(f"generate · {label}", total=total)
        yield lambda: progress.advance(task)


def measured_generate(plan: Plan, loaded: models.LoadedModel, setup: caches.CacheSetup, batch) -> _Call:
    """One generate() call with a fresh cache, timed per token and memory-probed."""
    import torch

    workload = plan.workload
    cache = setup.make_cache()
    clock = TokenClock(sync_cuda=loaded.device == "cuda")
    _release_freed_memory(loaded.device)
    torch.manual_seed(workload.seed)
    with torch.inference_mode(), PeakMemory(loaded.device) as peak, _backend_errors(plan, batch):
        clock.begin()
        output = loaded.model.generate(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            cache=cache,
            max_new_tokens=workload.max_new_tokens,
            # A fixed token count keeps runs comparable: EOS would end strategies at different steps.
            min_new_tokens=workload.max_new_tokens if workload.ignore_eos else None,
            do_sample=workload.do_sample,
            streamer=clock,
            pad_token_id=loaded.tokenizer.pad_token_id,
            **setup.generate_kwargs,
        )
        clock.end()
    return _Call(
        timing=Timing.from_clock(clock),
        peak=peak,
        batch_size=batch.input_ids.shape[0],
        prompt_tokens=batch.prompt_tokens,
        kv_bytes=caches.kv_cache_bytes(cache),
        kv_tokens=caches.cached_tokens(cache),
        new_tokens=output[:, batch.prompt_tokens :].cpu(),
    )


def _release_freed_memory(device: str) -> None:
    """Return freed memory to the OS, so one call's peak does not hide inside the last one's."""
    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()
        return
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _summarise(calls: list[_Call], loaded: models.LoadedModel, shape: models.ModelShape) -> dict[str, float]:
    metrics: dict[str, float] = {}

    def put(name: str, values: list[float]) -> None:
        metrics[name], metrics[name + "_std"] = mean_std(values)

    put("ttft_ms", [c.timing.ttft_ms for c in calls])
    put("tpot_ms", [c.timing.tpot_ms for c in calls])
    put("e2e_ms", [c.timing.e2e_ms for c in calls])
    put("decode_tokens_per_s", [c.batch_size * len(c.timing.itl_ms) / (sum(c.timing.itl_ms) / 1e3)
                                for c in calls if c.timing.itl_ms])
    put("prefill_tokens_per_s", [c.batch_size * c.prompt_tokens / (c.timing.ttft_ms / 1e3) for c in calls])
    itl = [ms for c in calls for ms in c.timing.itl_ms]
    for q in (50, 90, 99):
        metrics[f"itl_p{q}_ms"] = percentile(itl, q)

    largest = max(calls, key=lambda c: (c.kv_tokens * c.batch_size, c.kv_bytes))
    metrics["kv_cache_bytes"] = largest.kv_bytes
    metrics["kv_cache_tokens"] = largest.kv_tokens
    metrics["kv_cache_bytes_fp16"] = caches.dense_fp16_bytes(shape, largest.kv_tokens, largest.batch_size)
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
    metrics["roofline_fraction"] = metrics["decode_bytes_per_step"] * steps_per_s / bandwidth
    metrics["prompt_tokens"] = statistics.fmean(c.prompt_tokens for c in calls)
    metrics["new_tokens"] = statistics.fmean(c.timing.steps for c in calls)
    metrics["batch_size"] = calls[0].batch_size
    return metrics


def _texts(tokenizer, batches, calls: list[_Call]) -> list[dict[str, str]]:
    texts = []
    for batch, call in zip(batches, calls):
        for prompt, tokens in zip(batch.texts, call.new_tokens):
            texts.append({"prompt": prompt, "completion": tokenizer.decode(tokens, skip_special_tokens=True)})
    return texts


def _versions() -> dict[str, str]:
    import torch
    import transformers

    from kvpipe import __version__

    return {"torch_version": torch.__version__, "transformers_version": transformers.__version__,
            "kvpipe_version": __version__}
