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
from kvpipe.job.rounds import run_rounds
from kvpipe.job.threads import use_threads
from kvpipe.measure import contention, quality
from kvpipe.measure.environment import environment, load_average
from kvpipe.measure.memory import freeze_long_lived_objects
from kvpipe.measure.metrics import prompt_lengths, summarise
from kvpipe.measure.rounds import MIN_ROUNDS, ROUND_FIGURES, over_rounds, relative_half_width, round_figures, round_tags
from kvpipe.spec import Spec
from kvpipe.workload import longest_prompt_of, shortest_and_padded

log = logging.getLogger(__name__)


def run_job(spec: Spec, tags: dict[str, str] | None = None) -> JobResult:
    """Load (or reuse) the model, build the cache, warm up, measure its rounds, summarise; tags:
    how it was measured (a sweep's), added to its own."""
    if spec.load is not None:  # many requests under a load, not batches one after another
        from kvpipe.job.serving import run_serving_job

        served = run_serving_job(spec)
        served.tags.update({"measured_order": "alone", **(tags or {})})
        return served
    job = BatchJob(spec)
    job.prepare()
    run_rounds([job], spec.workload.seed, shuffle=False)
    return job.result({"measured_order": "alone", **(tags or {})})


def measured_together(labelled: list[tuple[str, Spec]], seed: int = 0, on_prepared=lambda label: None) -> list:
    """BatchJobs prepared one by one (each named by its label), then measured in shared rounds in a
    shuffled order, as a sweep's are: how the benchmarks set configurations side by side."""
    jobs = []
    for label, spec in labelled:
        job = BatchJob(spec)
        job.label = label
        job.prepare()  # loaded, cache built, warmed up
        jobs.append(job)
        on_prepared(label)
    run_rounds(jobs, seed, shuffle=True)  # each round calls every job once
    return jobs


class BatchJob:
    """One batch job in the phases interleaving needs: prepare() loads the model, builds the cache
    and warms it up; measure_round() calls every batch once; result() summarises. A sweep's jobs
    that take turns are prepared one by one, measured in shared rounds (kvpipe.job.rounds), then
    summarised; a job alone runs the same phases back to back."""

    def __init__(self, spec: Spec):
        self.spec = spec
        self.label = spec.strategy.describe()  # a sweep names its jobs by number instead
        self.auto = spec.workload.repeats == "auto"
        self.fixed_rounds = None if self.auto else int(spec.workload.repeats)
        self.calls: list[Call] = []
        self.per_round: dict[str, list[float]] = {name: [] for name in ROUND_FIGURES}
        self.own_s = 0.0  # its own phases' wall time: a sweep's turns of other jobs are not its harness
        self.failed: BaseException | None = None  # set by the rounds where a call raised
        self.started_epoch_s: float | None = None  # when prepare() began: the job's own start
        self.process_setup_s: float | None = None  # set by prepare(): see JobResult.process_setup_s

    @property
    def calls_per_round(self) -> int:
        return len(self.batches)

    def prepare(self) -> None:
        started = time.perf_counter()
        self.started_epoch_s = time.time()
        spec = self.spec
        imports_paid_s = model.import_libraries()  # once per process, with the collector off
        shape = model.read_shape(spec.model)
        tokenizer = model.load_tokenizer(spec.model)
        workload = spec.bound_workload
        self.batches = workload.batches(tokenizer, model.resolve_device(spec.model.device))
        workload.check_fits(shape, self.batches)
        longest_prompt = longest_prompt_of(self.batches, spec.workload.max_new_tokens)
        spec.strategy.check_for_model(shape, longest_prompt)
        spec.strategy.check_prompts(*shortest_and_padded(self.batches))

        load_started = time.perf_counter()
        self.loaded = loaded = model.load(spec.model)
        self.load_paid_ms = (time.perf_counter() - load_started) * 1e3  # 0 where an earlier job loaded it
        self.process_setup_s = imports_paid_s + self.load_paid_ms / 1e3
        freeze_long_lived_objects()
        self.load_at_start = load_average()
        self.threads = use_threads(spec.model, loaded.device)
        self.cpu_before = contention.sample()

        def warm_up(attempt: Spec):
            setup = attempt.strategy.setup(loaded, longest_prompt)
            warmup_ms = _warm_up(attempt, loaded, setup, self.batches, workload.warmup_key)
            # with no warm-up, the first round runs here, where an out-of-memory error can still fall back
            first = [] if warmup_ms else [measured_generate(attempt, loaded, setup, b) for b in self.batches]
            return setup, warmup_ms, first

        self.ran, (self.setup, self.warmup_ms, first), self.fallback_tags = with_fallback(spec, loaded, warm_up)
        if first:
            self._add_round(first)
        self.own_s += time.perf_counter() - started

    # ---- rounds (kvpipe.job.rounds.RoundJob) ---------------------------------------------------

    def rounds_done(self) -> int:
        return len(self.per_round["tpot_ms"])

    def wants_more(self, measured_s: float) -> bool:
        if not self.auto:
            return self.rounds_done() < self.fixed_rounds
        return self.may_go_on(measured_s) and not self.converged()

    def may_go_on(self, measured_s: float) -> bool:
        common = self.spec.workload
        return self.rounds_done() < common.max_repeats and measured_s < common.max_measure_s

    def converged(self) -> bool:
        """Enough rounds, and the TPOT interval over them within workload.target_interval."""
        if self.rounds_done() < MIN_ROUNDS:
            return False
        return relative_half_width(self.per_round["tpot_ms"]) <= self.spec.workload.target_interval

    def measure_round(self, advance=lambda: None) -> None:
        started = time.perf_counter()
        use_threads(self.spec.model, self.loaded.device)  # jobs that take turns may each set their own
        calls = []
        for batch in self.batches:
            calls.append(measured_generate(self.ran, self.loaded, self.setup, batch))
            advance()
        self._add_round(calls)
        self.own_s += time.perf_counter() - started

    def _add_round(self, calls: list[Call]) -> None:
        self.calls += calls
        for name, value in round_figures(calls).items():
            self.per_round[name].append(value)

    # ---- the summary ---------------------------------------------------------------------------

    def result(self, order_tags: dict[str, str]) -> JobResult:
        if self.failed is not None:
            raise self.failed
        started = time.perf_counter()
        spec, loaded, setup, ran, calls = self.spec, self.loaded, self.setup, self.ran, self.calls
        batches, workload = self.batches, spec.bound_workload
        cpu_after = contention.sample()
        verdict = contention.judge(self.cpu_before, cpu_after, self.threads, self.load_at_start, loaded.device)
        busy = verdict.busy
        if self.fallback_tags:
            setup.notes.append(
                f"cache={spec.cache.strategy} ran out of memory; measured cache={ran.cache.strategy} instead"
            )
            setup.requested = spec.cache.strategy
        metrics, metric_notes = summarise(calls, loaded, ran.strategy)
        setup.notes.extend(metric_notes)
        metrics.update(over_rounds(self.per_round))
        if self.auto:
            converged = self.converged()
            metrics["rounds_converged"] = float(converged)
            if not converged:
                setup.notes.append(self._not_converged_note())
        metrics["warmup_ms"] = sum(self.warmup_ms)
        metrics.update(prompt_lengths([n for batch in batches for n in batch.row_tokens]))
        # The workload's own scoring (passkey: its keys), on the measured calls themselves
        scored = workload.score(loaded.tokenizer, eos_ids(loaded.model), batches, calls)
        metrics.update(scored.values())
        metrics["load_ms"] = loaded.load_s * 1e3
        if "compile_config" in setup.generate_kwargs:
            # The first call compiles; its extra time over a steady call of the same batch is compile time.
            steady_first_batch = [c.timing.e2e_ms for c in calls[:: len(batches)]]
            metrics["compile_ms"] = max(0.0, self.warmup_ms[0] - min(steady_first_batch))
        tags = {
            "cache.requested": setup.requested,
            "cache.effective": setup.effective,
            "device": loaded.device,
            "dtype": loaded.dtype,
            "peak_memory_source": calls[0].peak.source,
            "noisy": "true" if busy else noisy(metrics["timing_noise_cv"], spec.workload.noise_threshold),
            "contended": str(busy).lower(),
            **self.fallback_tags,
            **workload.tags(loaded.tokenizer),
            **environment(loaded.device),
            **round_tags(self.per_round),
            **order_tags,
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
            quality_started = time.perf_counter()
            generated = [c.new_tokens for c in calls[: len(batches)]]
            metrics.update(quality.measure(loaded, ran, workload, batches, generated, setup))
            tags["quality_reference"] = f"DynamicCache, {loaded.dtype}"  # the same weights and dtype as the run
            metrics["quality_ms"] = (time.perf_counter() - quality_started) * 1e3
        metrics["load_average_start"], metrics["load_average_end"] = self.load_at_start, load_average()
        # The harness's own cost: the job's own wall time less what it is there to do
        metrics["measured_ms"] = sum(c.timing.e2e_ms for c in calls)
        own_ms = (self.own_s + time.perf_counter() - started) * 1e3
        spent = self.load_paid_ms + metrics["warmup_ms"] + metrics["measured_ms"] + metrics.get("quality_ms", 0.0)
        metrics["harness_ms"] = max(own_ms - spent, 0.0)
        texts = _texts(loaded.tokenizer, batches, calls[: len(batches)])
        params = resolved_params(loaded, self.threads, setup.params)
        if ran.quality.enabled:
            params["quality.scored_tokens"] = str(int(metrics["quality_scored_tokens"]))
        notes = [*spec.warnings, *setup.notes]
        return JobResult(metrics=metrics, tags=tags, texts=texts, notes=notes, params=params, scored=scored,
                         started_epoch_s=self.started_epoch_s, ended_epoch_s=time.time(),
                         process_setup_s=self.process_setup_s)  # fmt: skip

    def _not_converged_note(self) -> str:
        common = self.spec.workload
        width = relative_half_width(self.per_round["tpot_ms"])
        return (
            f"repeats=auto stopped after {self.rounds_done()} rounds (workload.max_repeats={common.max_repeats}, "
            f"workload.max_measure_s={common.max_measure_s:g}) with TPOT within ±{width:.1%}, wider than "
            f"workload.target_interval={common.target_interval:g}"
        )


def eos_ids(model) -> set[int]:
    """The tokens that end the model's answer (its generation config may name several)."""
    eos = model.generation_config.eos_token_id
    return set(eos if isinstance(eos, list) else [] if eos is None else [eos])


def noisy(timing_noise_cv: float, threshold: float) -> str:
    """'true', 'false', or 'unknown' when a single repeat gave nothing to compare."""
    if timing_noise_cv != timing_noise_cv:  # NaN
        return "unknown"
    return "true" if timing_noise_cv > threshold else "false"


def _warm_up(spec: Spec, loaded, setup, batches, warmup_key) -> list[float]:
    """Warm-up calls (timed, not measured) on one batch of each shape; their milliseconds."""
    compiles = "compile_config" in setup.generate_kwargs
    if compiles and spec.workload.warmup == 0:
        setup.notes.append("cache.compile needs a warm-up call to compile outside the timings; ran 1")
    warmup_calls = max(spec.workload.warmup, 1 if compiles else 0)
    # What a warm-up pays for once (allocation, kernels, a compile) is per shape, not per prompt.
    first_of_shape: dict[tuple, object] = {}
    for batch in batches:
        first_of_shape.setdefault(warmup_key(batch), batch)
    shapes = list(first_of_shape.values())  # the first batch first: compile_ms compares against it
    return [
        measured_generate(spec, loaded, setup, batch).timing.e2e_ms for _ in range(warmup_calls) for batch in shapes
    ]


def _texts(tokenizer, batches, calls: list[Call]) -> list[dict[str, str]]:
    texts = []
    for batch, call in zip(batches, calls):
        for prompt, tokens in zip(batch.texts, call.new_tokens):
            texts.append({"prompt": prompt, "completion": tokenizer.decode(tokens, skip_special_tokens=True)})
    return texts
