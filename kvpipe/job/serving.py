"""One serving job: the workload's prompts as requests arriving under a load (kvpipe.load), served by
the cache strategy (kvpipe.job.servers), measured per request and over the run
(kvpipe.measure.serving). The runner hands a job with a load here; the rest is as a batch job's:
the same model loading, contention check, environment tags and quality pass."""

from __future__ import annotations

import time
from functools import partial

import torch

from kvpipe import model
from kvpipe.job.outcome import JobResult, resolved_params
from kvpipe.job.servers import replayed, requests_of, serve_continuously, serve_static_batches
from kvpipe.job.threads import use_threads
from kvpipe.measure import contention, quality
from kvpipe.measure.environment import environment, load_average
from kvpipe.measure.memory import PeakMemory, freeze_long_lived_objects, release_freed_memory
from kvpipe.measure.metrics import prompt_lengths
from kvpipe.measure.serving import serving_metrics
from kvpipe.workload import longest_prompt_of

SHOWN_TEXTS = 4  # completions kept in result.json, as a batch job keeps one per prompt


def run_serving_job(spec) -> JobResult:
    """Load the model, warm the server up on the first requests, then serve them all as the load says."""
    job_started, started_epoch_s = time.perf_counter(), time.time()
    imports_paid_s = model.import_libraries()
    shape = model.read_shape(spec.model)
    tokenizer = model.load_tokenizer(spec.model)
    device = model.resolve_device(spec.model.device)
    workload, load, strategy = spec.bound_workload, spec.bound_load, spec.strategy
    batches = workload.batches(tokenizer, device)
    workload.check_fits(shape, batches)
    count = load.request_count(len(batches))
    requests = requests_of(batches, count, spec.workload.max_new_tokens)
    own_times = replayed(requests, count) if load.replays_arrivals else None
    if own_times is not None:
        requests, count = own_times, len(own_times)
    # sized and checked as a batch job's caches are: the longest context less workload.max_new_tokens
    longest_prompt = longest_prompt_of(batches, spec.workload.max_new_tokens)
    strategy.check_for_model(shape, longest_prompt)

    load_started = time.perf_counter()
    loaded = model.load(spec.model)
    load_paid_ms = (time.perf_counter() - load_started) * 1e3
    freeze_long_lived_objects()
    threads = use_threads(spec.model, loaded.device)
    load_at_start, cpu_before = load_average(), contention.sample()

    setup = None if strategy.continuous else strategy.setup(loaded, longest_prompt)
    serve = (
        partial(serve_continuously, spec, loaded)
        if strategy.continuous
        else partial(serve_static_batches, spec, loaded, setup)
    )
    cap = load.in_flight(count)
    arrivals = [r.arrival_s for r in requests] if own_times is not None else load.arrivals(count)
    warmup_started = time.perf_counter()
    first = requests[:cap]  # what a warm-up pays once (allocation, kernels), at the run's largest batch
    for _ in range(spec.workload.warmup):
        serve(first, [0.0] * len(first), len(first), False)
    warmup_ms = (time.perf_counter() - warmup_started) * 1e3
    release_freed_memory(loaded.device)
    torch.manual_seed(spec.workload.seed)
    with PeakMemory(loaded.device) as peak:
        outcome = serve(requests, arrivals, cap, load.closed)
    cpu_after = contention.sample()

    metrics = serving_metrics(outcome.served, outcome.max_in_flight, spec.load.max_ttft_ms, spec.load.max_tpot_ms)
    metrics.update(
        peak_memory_bytes=float(peak.peak_bytes),
        peak_over_baseline_bytes=float(peak.peak_over_baseline_bytes),
        kv_cache_bytes=float(outcome.kv_bytes),
        **({"kv_held_bytes": float(outcome.kv_held_bytes)} if outcome.kv_held_bytes is not None else {}),
        weights_bytes=float(loaded.weights_bytes),
        load_ms=loaded.load_s * 1e3,
        warmup_ms=warmup_ms,
        measured_ms=metrics["serve_span_ms"],
        **prompt_lengths([len(r.ids) for r in requests]),
    )
    verdict = contention.judge(cpu_before, cpu_after, threads, load_at_start, loaded.device)
    busy = verdict.busy
    metrics.update(verdict.metrics())
    effective = setup.effective if setup else strategy.name
    notes = [*spec.warnings, *(setup.notes if setup else [])]
    if own_times is not None:
        notes.append(f"replayed the workload's own arrival times ({count} requests over {arrivals[-1]:.1f} s); "
                     f"load.rate={spec.load.rate:g} was not used")  # fmt: skip
    tags = {
        "cache.requested": setup.requested if setup else strategy.name,
        "cache.effective": effective,
        "load": load.label(),
        "device": loaded.device,
        "dtype": loaded.dtype,
        "peak_memory_source": peak.source,
        "noisy": "true" if busy else "unknown",  # one pass over the requests: no repeats to compare
        "contended": str(busy).lower(),
        **workload.tags(loaded.tokenizer),
        **environment(loaded.device),
    }
    if busy:
        notes.append(verdict.note())
    if spec.quality.enabled and not strategy.lossless:
        started = time.perf_counter()
        generated = [torch.tensor([served.tokens]) for served in outcome.served[: len(batches)]]
        metrics.update(quality.measure(loaded, spec, workload, batches, generated, setup))
        tags["quality_reference"] = f"DynamicCache, {loaded.dtype}"
        metrics["quality_ms"] = (time.perf_counter() - started) * 1e3
    elif spec.quality.enabled:
        notes.append(f"cache={strategy.name} keeps keys and values exactly (lossless): no quality pass needed")
    metrics["load_average_start"], metrics["load_average_end"] = load_at_start, load_average()
    job_ms = (time.perf_counter() - job_started) * 1e3
    spent = load_paid_ms + warmup_ms + metrics["measured_ms"] + metrics.get("quality_ms", 0.0)
    metrics["harness_ms"] = max(job_ms - spent, 0.0)
    texts = [
        {"prompt": request.text, "completion": tokenizer.decode(served.tokens, skip_special_tokens=True)}
        for request, served in list(zip(requests, outcome.served))[:SHOWN_TEXTS]
    ]
    params = resolved_params(loaded, threads, setup.params if setup else {})
    return JobResult(metrics=metrics, tags=tags, texts=texts, notes=notes, params=params,
                     started_epoch_s=started_epoch_s, ended_epoch_s=time.time(),
                     process_setup_s=imports_paid_s + load_paid_ms / 1e3)  # fmt: skip
