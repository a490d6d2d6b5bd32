"""One job: spec -> model + cache -> measured generation -> JobResult (a job with a load:
kvpipe.job.serving).

The runner measures; it never records (that is kvpipe.record).
"""

from __future__ import annotations

import logging
import time

from kvpipe import model
from kvpipe.job.fallback import with_fallback
from kvpipe.job.generate import Call, measured_generate
from kvpipe.job.outcome import JobResult, resolved_params
from kvpipe.job.progress import progress_bar
from kvpipe.job.threads import use_threads
from kvpipe.measure import contention, quality
from kvpipe.measure.environment import environment, load_average
from kvpipe.measure.memory import freeze_long_lived_objects
from kvpipe.measure.metrics import prompt_lengths, summarise
from kvpipe.spec import Spec
from kvpipe.workload import longest_prompt_of

log = logging.getLogger(__name__)


def run_job(spec: Spec) -> JobResult:
    """Load (or reuse) the model, build the cache, generate with warm-up and repeats, measure."""
    if spec.load is not None:  # many requests under a load, not batches one after another
        from kvpipe.job.serving import run_serving_job

        return run_serving_job(spec)
    job_started = time.perf_counter()
    model.import_libraries()  # once per process, with the collector off
    shape = model.read_shape(spec.model)
    tokenizer = model.load_tokenizer(spec.model)
    device = model.resolve_device(spec.model.device)
    workload = spec.bound_workload
    batches = workload.batches(tokenizer, device)
    workload.check_fits(shape, batches)
    new_tokens = spec.workload.max_new_tokens
    longest_prompt = longest_prompt_of(batches, new_tokens)
    spec.strategy.check_for_model(shape, longest_prompt)

    load_started = time.perf_counter()
    loaded = model.load(spec.model)
    load_paid_ms = (time.perf_counter() - load_started) * 1e3  # 0 where an earlier job loaded it
    freeze_long_lived_objects()
    load_at_start = load_average()

    threads = use_threads(spec.model, loaded.device)
    cpu_before = contention.sample()

    def measure(attempt: Spec):
        setup = attempt.strategy.setup(loaded, longest_prompt)
        return setup, *_measure(attempt, loaded, setup, batches, workload.warmup_key)

    ran, (setup, calls, warmup_ms), fallback_tags = with_fallback(spec, loaded, measure)
    cpu_after = contention.sample()
    verdict = contention.judge(cpu_before, cpu_after, threads, load_at_start, loaded.device)
    busy = verdict.busy
    if fallback_tags:
        setup.notes.append(
            f"cache={spec.cache.strategy} ran out of memory; measured cache={ran.cache.strategy} instead"
        )
        setup.requested = spec.cache.strategy
    metrics, metric_notes = summarise(calls, loaded, ran.strategy)
    setup.notes.extend(metric_notes)
    metrics["warmup_ms"] = sum(warmup_ms)
    metrics.update(prompt_lengths([n for batch in batches for n in batch.row_tokens]))
    # The workload's own scoring (passkey: its keys), on the measured calls themselves
    scores, answers = workload.score(loaded.tokenizer, eos_ids(loaded.model), batches, calls)
    metrics.update(scores)
    metrics["load_ms"] = loaded.load_s * 1e3
    if "compile_config" in setup.generate_kwargs:
        # The first call compiles; its extra time over a steady call of the same batch is compile time.
        steady_first_batch = [c.timing.e2e_ms for c in calls[:: len(batches)]]
        metrics["compile_ms"] = max(0.0, warmup_ms[0] - min(steady_first_batch))
    tags = {
        "cache.requested": setup.requested,
        "cache.effective": setup.effective,
        "device": loaded.device,
        "dtype": loaded.dtype,
        "peak_memory_source": calls[0].peak.source,
        "noisy": "true" if busy else noisy(metrics["timing_noise_cv"], spec.workload.noise_threshold),
        "contended": str(busy).lower(),
        **fallback_tags,
        **workload.tags(loaded.tokenizer),
        **environment(loaded.device),
    }
    metrics.update(verdict.metrics())
    if busy:
        setup.notes.append(verdict.note())
    elif tags["noisy"] == "true":
        setup.notes.append(
            f"noisy: TTFT or TPOT varied by {metrics['timing_noise_cv']:.0%} between calls of one shape or between a "
            f"call's tokens (threshold workload.noise_threshold={spec.workload.noise_threshold:g}); rerun on an idle "
            "machine or with more repeats"
        )
    if ran.quality.enabled:
        started = time.perf_counter()
        generated = [c.new_tokens for c in calls[: len(batches)]]
        metrics.update(quality.measure(loaded, ran, workload, batches, generated, setup))
        tags["quality_reference"] = f"DynamicCache, {loaded.dtype}"  # the same weights and dtype as the run
        metrics["quality_ms"] = (time.perf_counter() - started) * 1e3
    metrics["load_average_start"], metrics["load_average_end"] = load_at_start, load_average()
    # The harness's own cost: the job's wall time less what it is there to do
    metrics["measured_ms"] = sum(c.timing.e2e_ms for c in calls)
    job_ms = (time.perf_counter() - job_started) * 1e3
    spent = load_paid_ms + metrics["warmup_ms"] + metrics["measured_ms"] + metrics.get("quality_ms", 0.0)
    metrics["harness_ms"] = max(job_ms - spent, 0.0)
    texts = _texts(loaded.tokenizer, batches, calls[: len(batches)])
    params = resolved_params(loaded, threads, setup.params)
    if ran.quality.enabled:
        params["quality.scored_tokens"] = str(int(metrics["quality_scored_tokens"]))
    notes = [*spec.warnings, *setup.notes]
    return JobResult(metrics=metrics, tags=tags, texts=texts, notes=notes, params=params, answers=answers)


def eos_ids(model) -> set[int]:
    """The tokens that end the model's answer (its generation config may name several)."""
    eos = model.generation_config.eos_token_id
    return set(eos if isinstance(eos, list) else [] if eos is None else [eos])


def noisy(timing_noise_cv: float, threshold: float) -> str:
    """'true', 'false', or 'unknown' when a single repeat gave nothing to compare."""
    if timing_noise_cv != timing_noise_cv:  # NaN
        return "unknown"
    return "true" if timing_noise_cv > threshold else "false"


def _measure(spec: Spec, loaded, setup, batches, warmup_key) -> tuple[list[Call], list[float]]:
    """Warm-up calls (timed, not measured) on one batch of each shape, then the measured calls:
    repeat after repeat over every batch."""
    compiles = "compile_config" in setup.generate_kwargs
    if compiles and spec.workload.warmup == 0:
        setup.notes.append("cache.compile needs a warm-up call to compile outside the timings; ran 1")
    warmup_calls = max(spec.workload.warmup, 1 if compiles else 0)
    # What a warm-up pays for once (allocation, kernels, a compile) is per shape, not per prompt.
    first_of_shape: dict[tuple, object] = {}
    for batch in batches:
        first_of_shape.setdefault(warmup_key(batch), batch)
    shapes = list(first_of_shape.values())  # the first batch first: compile_ms compares against it
    warmup_ms: list[float] = []
    calls: list[Call] = []
    total = warmup_calls * len(shapes) + spec.workload.repeats * len(batches)
    with progress_bar(setup.effective, total) as advance:
        for _ in range(warmup_calls):
            for batch in shapes:
                warmup_ms.append(measured_generate(spec, loaded, setup, batch).timing.e2e_ms)
                advance()
        for _ in range(spec.workload.repeats):
            for batch in batches:
                calls.append(measured_generate(spec, loaded, setup, batch))
                advance()
    return calls, warmup_ms


def _texts(tokenizer, batches, calls: list[Call]) -> list[dict[str, str]]:
    texts = []
    for batch, call in zip(batches, calls):
        for prompt, tokens in zip(batch.texts, call.new_tokens):
            texts.append({"prompt": prompt, "completion": tokenizer.decode(tokens, skip_special_tokens=True)})
    return texts
