"""One job in phases, batch or served: prepare() reads the workload's prompts, checks them against the
model and the cache, loads the model and warms the cache up; measure_round() measures one round
(kvpipe.schedule); result() summarises. A batch job (kvpipe.job.runner) and a served one
(kvpipe.job.served) differ only in how a round calls the model and in the figures they summarise;
the rest is here, once: the checks, the verdict on contention and noise, the quality pass, the tags.

A job measures; it never records (that is kvpipe.record)."""

from __future__ import annotations

import time
from typing import ClassVar

from kvpipe import cache, model
from kvpipe.job.outcome import JobResult, resolved_params
from kvpipe.job.threads import use_threads
from kvpipe.measure import contention, quality
from kvpipe.measure.environment import environment, load_average
from kvpipe.measure.memory import freeze_long_lived_objects
from kvpipe.measure.metrics import prompt_lengths
from kvpipe.measure.round_figures import call_tags, mean, over_rounds, round_tags
from kvpipe.schedule import RoundTaker
from kvpipe.workload import Scored, shortest_and_padded


class Job(RoundTaker):
    """What every job does; a subclass says what a round measures (`figures`, `round`), how it warms
    up (`warm_up`) and what its rounds sum up to (`summary`, `texts`, `quality_inputs`)."""

    figures: ClassVar[tuple[str, ...]]  # what a round gives (kvpipe.measure.round_figures)

    def __init__(self, spec):
        super().__init__(spec.strategy.describe(), spec.workload, self.figures)
        self.spec = spec
        self.ran = spec  # what it measured: another strategy's spec after an out-of-memory fallback
        self.setup = None  # the cache it builds (CacheSetup); None where its server builds its own
        self.warmup_ms: list[float] = []
        self.scored_answers = Scored()  # the workload's own scoring of its answers (none by default)
        self.request_rows: list[dict] = []  # a served job's requests, each as it was served
        self.own_s = 0.0  # its own phases' wall time: a sweep's turns of other jobs are not its harness
        self.started_epoch_s: float | None = None  # when prepare() began: the job's own start
        self.process_setup_s: float | None = None  # set by prepare(): see JobResult.process_setup_s

    def figure_rounds(self) -> dict[str, list[float]]:
        """The round figures its figures and their intervals are read from: its rounds as measured,
        unless a kind of job keeps its calls and left some out (BatchJob)."""
        return self.per_round

    @property
    def cache_names(self) -> tuple[str, str]:
        """Its cache as asked for and as it ran (its setup's, after warm-up), or its strategy's name."""
        if self.setup:
            return self.setup.requested, self.setup.effective
        return self.ran.strategy.name, self.ran.strategy.name

    @property
    def cache_label(self) -> str:
        """Its cache as compare's tables name it."""
        return cache.table_label(*self.cache_names)

    @property
    def compare_baseline(self) -> bool:
        """Whether compare's default baseline names it: its cache, as tables name it, is the dynamic one."""
        return self.cache_label == cache.DEFAULT_BASELINE

    # ---- what a kind of job says ---------------------------------------------------------------

    def plan(self) -> None:
        """What it serves, from the checked batches, before the weights load (a load's refusal is then
        as quick as a config error's)."""

    def warm_up(self, longest_prompt: int) -> None:
        """Build its cache (self.setup, self.ran) and warm it up (self.warmup_ms), the model loaded."""
        raise NotImplementedError

    def round(self, advance) -> dict[str, float]:
        """One round's calls, advancing the progress bar by one per call; its figures."""
        raise NotImplementedError

    def summary(self) -> tuple[dict[str, float], list[str], dict[str, str]]:
        """Its rounds summed up: metrics (`measured_ms` and `timing_noise_cv` among them), notes and
        its own tags."""
        raise NotImplementedError

    def prompt_tokens(self) -> list[int]:
        """Each measured prompt's length in tokens, over one round."""
        raise NotImplementedError

    def texts(self) -> list[dict[str, str]]:
        """Prompts and completions for result.json."""
        raise NotImplementedError

    def quality_inputs(self) -> tuple[list, list]:
        """The batches the quality pass scores, and what this job generated for each."""
        raise NotImplementedError

    def loads_anew(self) -> bool:
        """Whether load_model() will pay a load (an earlier job in this process may have paid it)."""
        return not model.is_loaded(self.spec.model)

    def load_model(self):
        """The model it measures (kvpipe.model.LoadedModel), loaded once per process."""
        return model.load(self.spec.model)

    def close(self) -> None:
        """Stop what it started for its rounds (an engine's server); nothing for a job in this process."""

    @property
    def quality_refusal(self) -> str:
        """Why the quality pass has no cache of its to score, where it builds none (self.setup is None)."""
        return (
            f"cache={self.ran.strategy.name} builds its cache inside its server (continuous batching), where "
            "the quality pass cannot score it: no quality pass"
        )

    # ---- the phases ----------------------------------------------------------------------------

    def prepare(self) -> None:
        started = time.perf_counter()
        self.started_epoch_s = time.time()
        spec = self.spec
        shape = model.read_shape(spec.model)
        self.workload = spec.bound_workload
        self.workload.check_fits_config(shape)  # what the settings alone refuse, before the imports
        imports_paid_s = model.import_libraries()  # once per process, with the collector off
        tokenizer = model.load_tokenizer(spec.model)
        self.batches = self.workload.batches(tokenizer, model.resolve_device(spec.model.device))
        self.workload.check_fits(shape, self.batches)
        longest_prompt = self.workload.longest_prompt(tokenizer, self.batches)
        spec.strategy.check_for_model(shape, longest_prompt)
        spec.strategy.check_prompts(*shortest_and_padded(self.batches))
        self.plan()

        load_started, paid = time.perf_counter(), self.loads_anew()
        self.loaded = loaded = self.load_model()
        # 0 where an earlier job loaded it: a lookup is no set-up, however long a busy machine makes it
        self.load_paid_ms = (time.perf_counter() - load_started) * 1e3 if paid else 0.0
        self.process_setup_s = imports_paid_s + self.load_paid_ms / 1e3
        freeze_long_lived_objects()
        self.load_at_start = load_average()
        self.threads = use_threads(spec.model, loaded.device)
        self.on_cpu = loaded.device == "cpu"
        self.cpu_before = contention.sample()
        self.warm_up(longest_prompt)
        self.own_s += time.perf_counter() - started

    def measure_round(self, advance=lambda: None) -> None:
        started = time.perf_counter()
        use_threads(self.spec.model, self.loaded.device)  # jobs that take turns may each set their own
        self.add_round(self.round(advance))
        self.own_s += time.perf_counter() - started

    def measure_call(self, index: int, advance) -> None:
        started = time.perf_counter()
        use_threads(self.spec.model, self.loaded.device)
        self.call(index, advance)
        self.own_s += time.perf_counter() - started

    def call(self, index: int, advance) -> None:
        """One call of a round (kvpipe.schedule's turns by call); by default the whole round is one."""
        self.add_round(self.round(advance))
        self.call_is_round()

    def result(self, order_tags: dict[str, str]) -> JobResult:
        if self.failed is not None:
            raise self.failed
        started = time.perf_counter()
        spec, loaded, ran, setup = self.spec, self.loaded, self.ran, self.setup
        verdict = contention.judge(
            self.cpu_before, contention.sample(), self.threads, self.load_at_start, loaded.device
        )
        metrics, summary_notes, own_tags = self.summary()
        notes = [*spec.warnings, *(setup.notes if setup else []), *summary_notes]
        figure_rounds = self.figure_rounds()
        metrics.update(over_rounds(figure_rounds))
        if figure_rounds is not self.per_round:  # some calls left out: each figure from its interval's rounds
            metrics.update({name: mean(values) for name, values in figure_rounds.items()})
        notes += self._rounds_notes(metrics)
        metrics["warmup_ms"] = sum(self.warmup_ms)
        metrics.update(prompt_lengths(self.prompt_tokens()))
        metrics["load_ms"] = loaded.load_s * 1e3
        threshold = spec.workload.noise_threshold
        requested, effective = self.cache_names
        tags = {
            "cache.requested": requested,
            "cache.effective": effective,
            "device": loaded.device,
            "dtype": loaded.dtype,
            "noisy": "true" if verdict.busy else noisy(metrics["timing_noise_cv"], threshold),
            "contended": str(verdict.busy).lower(),
            **own_tags,
            **self.workload.tags(loaded.tokenizer),
            **environment(loaded.device),
            **round_tags(self.per_round),
            **(call_tags(self.paired_calls(), self.call_keys()) if self.turn == "call" else {}),
            **({"rounds_stopped_by": self.stopped_by} if self.stopped_by else {}),
            **order_tags,
        }
        metrics.update(verdict.metrics())
        if verdict.busy:
            notes.append(verdict.note())
        elif tags["noisy"] == "true":
            notes.append(
                f"noisy: TTFT or TPOT varied by {metrics['timing_noise_cv']:.0%} between calls of one shape, between "
                f"rounds or between a call's tokens (threshold workload.noise_threshold={threshold:g}); rerun on an "
                "idle machine or with more repeats"
            )
        params = resolved_params(loaded, self.threads, setup.params if setup else {})
        if ran.quality.enabled:
            self._quality(metrics, tags, notes, params)
        metrics["load_average_start"], metrics["load_average_end"] = self.load_at_start, load_average()
        # The harness's own cost: the job's own wall time less what it is there to do
        own_ms = (self.own_s + time.perf_counter() - started) * 1e3
        spent = self.load_paid_ms + metrics["warmup_ms"] + metrics["measured_ms"] + metrics.get("quality_ms", 0.0)
        metrics["harness_ms"] = max(own_ms - spent, 0.0)
        return JobResult(metrics=metrics, tags=tags, texts=self.texts(), notes=notes, params=params,
                         scored=self.scored_answers, requests=self.request_rows, started_epoch_s=self.started_epoch_s, ended_epoch_s=time.time(),
                         process_setup_s=self.process_setup_s)  # fmt: skip

    def _rounds_notes(self, metrics: dict) -> list[str]:
        """How its rounds ended and what they left out: repeats=auto's verdict (its own, or its
        sweep's where the paired ratios decided), calls taken under other processes' load, and where
        its own figure is less firm than its paired ratio."""
        notes = []
        if self.turn == "call":
            metrics["calls_excluded"] = float(self.excluded_calls)
            calls = len(self.call_kept)
            if self.excluded_calls == calls:
                notes.append(
                    f"all {calls} calls ran while other processes held a core they needed: none clean to "
                    "keep, so its figures and paired ratios are over contended calls"
                )
            elif self.excluded_calls:
                notes.append(
                    f"{self.excluded_calls} of {calls} calls ran while other processes held a core the call "
                    "needed: left out of the paired ratios and of its TPOT and TTFT"
                )
        if self.stopped_by:  # a sweep on repeats=auto: its paired ratios' rule, not its own interval's
            metrics["rounds_decided"] = float(self.stopped_by == "decided")
            if self.stopped_by != "decided":
                notes.append(
                    f"repeats=auto stopped at {self.stopped_by} (workload.max_repeats={self.timing.max_repeats}, "
                    f"workload.max_measure_s={self.timing.max_measure_s:g}) before every paired TPOT ratio was within "
                    f"±workload.decide_within={self.timing.decide_within:g} or clearly different"
                )
        elif self.auto:
            metrics["rounds_converged"] = float(self.converged())
            if not self.converged():
                notes.append(self.not_converged_note())
        if self.paired_note:
            notes.append(self.paired_note)
        return notes

    def _quality(self, metrics: dict, tags: dict, notes: list, params: dict) -> None:
        """The quality pass, lossless caches too (a dense cache's reuses the reference's own scores:
        kvpipe.measure.quality), on the cache the job built; a server that builds its own has none
        to score."""
        if self.setup is None:
            notes.append(self.quality_refusal)
            return
        started = time.perf_counter()
        batches, generated = self.quality_inputs()
        metrics.update(quality.measure(self.loaded, self.ran, self.workload, batches, generated, self.setup))
        if self.scored_answers.rows and self.workload.compares_greedy_path and not self.ran.workload.do_sample:
            # its answers beside the reference's own, which the pass above made (and keeps)
            reference = quality.reference_tokens(self.loaded, self.ran, self.workload, batches)
            rows = self.workload.against_reference(
                self.loaded.tokenizer, eos_ids(self.loaded.model), batches, reference, self.scored_answers.rows
            )
            self.scored_answers = self.workload.scored(rows)
            metrics.update(self.scored_answers.values())
            answers = self.scored_answers.answers
            if answers and all(answer.reference_correct is not None for answer in answers):
                metrics["reference_accuracy"] = sum(a.reference_correct for a in answers) / len(answers)
        tags["quality_reference"] = f"DynamicCache, {self.loaded.dtype}"  # the same weights and dtype as the run
        metrics["quality_ms"] = (time.perf_counter() - started) * 1e3
        params["quality.scored_tokens"] = str(int(metrics["quality_scored_tokens"]))


def eos_ids(model) -> set[int]:
    """The tokens that end the model's answer (its generation config may name several)."""
    eos = model.generation_config.eos_token_id
    return set(eos if isinstance(eos, list) else [] if eos is None else [eos])


def noisy(timing_noise_cv: float, threshold: float) -> str:
    """'true', 'false', or 'unknown' when a single repeat gave nothing to compare."""
    if timing_noise_cv != timing_noise_cv:  # NaN
        return "unknown"
    return "true" if timing_noise_cv > threshold else "false"
