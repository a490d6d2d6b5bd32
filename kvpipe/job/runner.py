"""One job: spec -> model + cache -> measured rounds -> JobResult. A batch job (`BatchJob`) calls the
workload's batches one after another; a job with a load serves its requests (kvpipe.job.served). Both
are kvpipe.job.phases' `Job`.

The runner measures; it never records (that is kvpipe.record).
"""

from __future__ import annotations

import logging
import math

from kvpipe.job.fallback import with_fallback
from kvpipe.job.generate import Call, measured_generate
from kvpipe.job.phases import Job, eos_ids
from kvpipe.job.served import ServedJob
from kvpipe.job.served_sessions import SessionsJob
from kvpipe.jobspec import Spec
from kvpipe.measure.metrics import TIMINGS, summarise
from kvpipe.measure.round_figures import BATCH_FIGURES, batch_round
from kvpipe.schedule import run_rounds

log = logging.getLogger(__name__)


def run_job(spec: Spec, tags: dict[str, str] | None = None):
    """Load (or reuse) the model, build the cache, warm up, measure its rounds, summarise; tags:
    how it was measured (a sweep's), added to its own. Returns its JobResult."""
    job = job_for(spec)
    try:
        job.prepare()
        run_rounds([job], spec.workload.seed, shuffle=False)
        return job.result({"measured_order": "alone", **(tags or {})})
    finally:
        job.close()


def job_for(spec: Spec) -> Job:
    """The job a spec makes: its requests served under its load, or its batches one after another."""
    if spec.engine is not None:
        from kvpipe.job.engine_served import EngineJob, EngineSessionsJob

        return EngineSessionsJob(spec) if spec.bound_workload.in_sessions else EngineJob(spec)
    if spec.load is None:
        return BatchJob(spec)
    return SessionsJob(spec) if spec.bound_workload.in_sessions else ServedJob(spec)


def measured_together(labelled: list[tuple[str, Spec]], seed: int = 0, on_prepared=lambda label: None) -> list[Job]:
    """Jobs (batch or served) prepared one by one (each named by its label), then measured in shared
    rounds, call by call in a counterbalanced order, as a sweep's are: how the benchmarks set configurations side by side."""
    jobs = []
    for label, spec in labelled:
        job = job_for(spec)
        job.label = label
        job.prepare()  # loaded, cache built, warmed up
        jobs.append(job)
        on_prepared(label)
    run_rounds(jobs, seed, shuffle=True, turn="call")  # each call a turn, every job taking it
    return jobs


class BatchJob(Job):
    """A job whose round calls every batch of its workload once, each a generate() call with a fresh
    cache; after an out-of-memory error while it warms up, it falls back to the next strategy of
    `fallback` (kvpipe.job.fallback)."""

    figures = BATCH_FIGURES

    def __init__(self, spec: Spec):
        super().__init__(spec)
        self.calls: list[Call] = []
        self.round_started = 0  # the index in self.calls of the round's first call (turn=call)
        self.fallback_tags: dict[str, str] = {}

    @property
    def calls_per_round(self) -> int:
        return len(self.batches)

    @property
    def kept(self) -> list[bool]:
        """Per call of self.calls: False where the guard left it out. The rounds' own record
        (call_kept) covers the calls taken in turns, the last ones; a first round measured while the
        job warmed up came before them and counts whole (its calls are never judged)."""
        return [True] * (len(self.calls) - len(self.call_kept)) + self.call_kept

    def warm_up(self, longest_prompt: int) -> None:
        loaded = self.loaded

        def warm_up(attempt: Spec):
            setup = attempt.strategy.setup(loaded, longest_prompt)
            warmup_ms = _warm_up(attempt, loaded, setup, self.batches, self.workload.warmup_key)
            # with no warm-up, the first round runs here, where an out-of-memory error can still fall back
            first = [] if warmup_ms else [measured_generate(attempt, loaded, setup, b) for b in self.batches]
            return setup, warmup_ms, first

        self.ran, (self.setup, self.warmup_ms, first), self.fallback_tags = with_fallback(self.spec, loaded, warm_up)
        if first:
            self.calls += first
            self.add_round(batch_round(first))

    def round(self, advance) -> dict[str, float]:
        calls = []
        for batch in self.batches:
            calls.append(measured_generate(self.ran, self.loaded, self.setup, batch))
            advance()
        self.calls += calls
        return batch_round(calls)

    def call_keys(self) -> list:
        """Each batch's shape and prompt: two jobs' calls pair where they run the same tokens."""
        return [(tuple(b.input_ids.shape), tuple(b.input_ids.flatten().tolist())) for b in self.batches]

    def call(self, index: int, advance) -> None:
        if index == 0:
            self.round_started = len(self.calls)
        made = measured_generate(self.ran, self.loaded, self.setup, self.batches[index])
        advance()
        self.calls.append(made)
        self.add_call({"ttft_ms": made.timing.ttft_ms, "tpot_ms": made.timing.tpot_ms})

    def close_round(self) -> None:
        """The round's figures over the calls that were not left out; over all of them where every
        one was (a round whose figures are all contended is still a round: its notes say so)."""
        calls = self.calls[self.round_started :]
        kept = [c for c, keep in zip(calls, self.kept[self.round_started :]) if keep]
        self.add_round(batch_round(kept or calls))

    def figure_rounds(self) -> dict[str, list[float]]:
        """Where some calls were left out and some kept: each round's figures over its kept calls
        (NaN where it kept none), so that a figure, its interval and its paired ratio all come from the
        same calls; its rounds as measured otherwise (every call kept, or none: then the notes say so)."""
        flags = self.kept  # derived from the rounds' record: read once
        if all(flags) or not any(flags):
            return self.per_round
        n = self.calls_per_round
        rounds = [
            [c for c, keep in zip(self.calls[i : i + n], flags[i : i + n]) if keep]
            for i in range(0, len(self.calls), n)
        ]
        by_round = [batch_round(kept) if kept else dict.fromkeys(BATCH_FIGURES, math.nan) for kept in rounds]
        return {name: [figures[name] for figures in by_round] for name in BATCH_FIGURES}

    def kept_timings(self, loaded, strategy) -> dict[str, float]:
        """Its timings over the calls not taken under other processes' load (in a sweep's turns, the
        same turns as every other job's), where some were left out and some kept; else nothing to
        replace. Its bytes and prompt lengths stay over every call: they do not depend on the load."""
        kept = [c for c, keep in zip(self.calls, self.kept) if keep]
        if not kept or len(kept) == len(self.calls):
            return {}
        metrics, _ = summarise(kept, loaded, strategy)
        timed = (*TIMINGS, "itl_", "timing_noise_cv")
        return {name: value for name, value in metrics.items() if name.startswith(timed)}

    def summary(self) -> tuple[dict[str, float], list[str], dict[str, str]]:
        spec, loaded, setup, ran, calls = self.spec, self.loaded, self.setup, self.ran, self.calls
        batches, workload = self.batches, self.workload
        if self.fallback_tags:
            setup.notes.append(
                f"cache={spec.cache.strategy} ran out of memory; measured cache={ran.cache.strategy} instead"
            )
            setup.requested = spec.cache.strategy
        metrics, metric_notes = summarise(calls, loaded, ran.strategy)
        metrics.update(self.kept_timings(loaded, ran.strategy))
        # The workload's own scoring (passkey: its keys), on the measured calls themselves
        self.scored_answers = workload.score(loaded.tokenizer, eos_ids(loaded.model), batches, calls)
        metrics.update(self.scored_answers.values())
        if "compile_config" in setup.generate_kwargs:
            # The first call compiles; its extra time over a steady call of the same batch is compile time.
            steady_first_batch = [c.timing.e2e_ms for c in calls[:: len(batches)]]
            metrics["compile_ms"] = max(0.0, self.warmup_ms[0] - min(steady_first_batch))
        metrics["measured_ms"] = sum(c.timing.e2e_ms for c in calls)
        return metrics, metric_notes, {"peak_memory_source": calls[0].peak.source, **self.fallback_tags}

    def prompt_tokens(self) -> list[int]:
        return [n for batch in self.batches for n in batch.row_tokens]

    def texts(self) -> list[dict[str, str]]:
        texts = []
        for batch, call in zip(self.batches, self.calls[: len(self.batches)]):
            for prompt, tokens in zip(batch.texts, call.new_tokens):
                texts.append(
                    {"prompt": prompt, "completion": self.loaded.tokenizer.decode(tokens, skip_special_tokens=True)}
                )
        return texts

    def quality_inputs(self) -> tuple[list, list]:
        return self.batches, [c.new_tokens for c in self.calls[: len(self.batches)]]


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
