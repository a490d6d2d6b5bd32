"""A served job: the workload's prompts as requests that its load (kvpipe.load) picks and times,
served by the cache strategy (kvpipe.job.servers), measured per request and over its passes
(kvpipe.measure.request_figures). A round is one pass over every request, as the load says; the rest
is every job's (kvpipe.job.phases): the checks, the model, the verdict on noise, the quality pass."""

from __future__ import annotations

import statistics
import time
from types import SimpleNamespace

from kvpipe.job.arrivals import Scheduled
from kvpipe.job.phases import Job, eos_ids
from kvpipe.job.servers import Outcome, requests_of, serve_continuously, serve_static_batches
from kvpipe.measure.memory import PeakMemory, release_freed_memory
from kvpipe.measure.metrics import repeat_noise
from kvpipe.measure.request_figures import (
    SERVED_FIGURES,
    arrival_figures,
    certain_miss,
    pass_figures,
    request_rows,
    serving_metrics,
)

SHOWN_TEXTS = 4  # completions kept in result.json, as a batch job keeps one per prompt


class ServedJob(Job):
    """Every request of its load served once a round; its figures per request, pooled over rounds."""

    figures = SERVED_FIGURES

    def __init__(self, spec):
        super().__init__(spec)
        self.load = spec.bound_load
        self.passes: list[Outcome] = []
        self.peaks: list[PeakMemory] = []

    @property
    def calls_per_round(self) -> int:
        return len(self.requests)

    def plan(self) -> None:
        self.prompts = requests_of(self.batches, self.spec.workload.max_new_tokens)  # one per prompt
        self.requests = self.load.requests(self.prompts)
        self.arrivals = self.load.arrivals(self.requests)
        self.cap = self.load.in_flight(self.requests)

    def warm_up(self, longest_prompt: int) -> None:
        strategy = self.spec.strategy
        # sized and checked as a batch job's caches are: the longest context less workload.max_new_tokens
        self.setup = None if strategy.continuous else strategy.setup(self.loaded, longest_prompt)
        self.warm_up_requests()

    def warm_up_requests(self) -> None:
        """workload.warmup passes over the first requests, as many as are let in at once."""
        first = self.requests[: self.cap]  # what a warm-up pays once (allocation, kernels), at the largest batch
        for _ in range(self.spec.workload.warmup):
            started = time.perf_counter()
            self._serve(Scheduled(first, [0.0] * len(first), len(first), closed=False), len(first))
            self.warmup_ms.append((time.perf_counter() - started) * 1e3)

    def round(self, advance) -> dict[str, float]:
        import torch

        release_freed_memory(self.loaded.device)
        torch.manual_seed(self.spec.workload.seed)
        with self.peak_meter() as peak:
            outcome = self._serve(self.queue(), self.cap, stop=self.stop_rule())
        self.passes.append(outcome)
        self.peaks.append(peak)
        for _ in outcome.served:
            advance()
        return pass_figures(outcome.served)

    def peak_meter(self):
        """What measures a round's peak memory: this process's (weights, cache and activations)."""
        return PeakMemory(self.loaded.device)

    def queue(self):
        """A round's requests as they arrive (kvpipe.job.arrivals)."""
        return Scheduled(self.requests, self.arrivals, self.cap, self.load.closed)

    def stop_rule(self):
        """With load.stop_when_missed_at: a pass's rule for letting no more requests in, once its
        targets are missed at that percentile whatever the rest do (kvpipe.measure.request_figures)."""
        at, common, total = self.load.config.stop_when_missed_at, self.load.config, len(self.requests)
        if at is None:
            return None
        return lambda answered: certain_miss(answered, total, common.max_ttft_ms, common.max_tpot_ms, at)

    def _serve(self, queue, cap: int, kept=None, stop=None) -> Outcome:
        if self.setup is None:  # a continuous server builds its own cache
            return serve_continuously(self.spec, self.loaded, queue, cap, stop)
        return serve_static_batches(self.spec, self.loaded, self.setup, queue, cap, kept, stop)

    def summary(self) -> tuple[dict[str, float], list[str], dict[str, str]]:
        passes, common = self.passes, self.load.config
        most_in_flight = max(outcome.max_in_flight for outcome in passes)
        served = [o.served for o in passes]
        tokenizer, stops = self.loaded.tokenizer, eos_ids(self.loaded.model)
        answered = self.answered()  # the served answers as the workload's scoring reads them, made once
        verdicts = self.verdicts(tokenizer, stops, *answered)
        metrics = serving_metrics(served, most_in_flight, common.max_ttft_ms, common.max_tpot_ms, verdicts)
        self.request_rows = request_rows(served, verdicts, common.max_ttft_ms, common.max_tpot_ms)
        if not self.load.closed:  # a closed loop's arrivals are its own answers' ends, not an offered load
            metrics.update(arrival_figures(self.arrivals))
        held = [o.kv_held_bytes for o in passes if o.kv_held_bytes is not None]
        # what was measured of its memory: none of it where the server is not kvpipe's (engine=openai)
        memory = dict(
            peak_memory_bytes=[p.peak_bytes for p in self.peaks],
            peak_over_baseline_bytes=[p.peak_over_baseline_bytes for p in self.peaks],
            kv_cache_bytes=[o.kv_bytes for o in passes], kv_held_bytes=held, weights_bytes=[self.loaded.weights_bytes],
        )  # fmt: skip
        metrics.update({name: float(max(v)) for name, v in memory.items() if v and None not in v})
        metrics.update(
            measured_ms=metrics["serve_span_ms"] * len(passes),
            # the measured prompt length, as a batch job's: what compare weighs a run against a baseline at
            prompt_tokens=statistics.fmean(self.prompt_tokens()),
            # between rounds: a round's mean TTFT and TPOT, as a batch job's calls of one shape
            timing_noise_cv=repeat_noise(self.per_round, [()] * self.rounds_done()),
        )
        # The workload's own scoring (labelled answers, pass keys, tasks) of what each request was
        # answered under the load, as a batch job's calls are scored
        self.scored_answers = self.workload.score(tokenizer, stops, *answered)
        metrics.update(self.scored_answers.values())
        tags = {"load": self.load.served_label(self.requests), "peak_memory_source": self.peaks[0].source}
        notes = self.load.notes(self.requests) + [
            f"stopped after {len(o.served)} of its {len(self.requests)} requests (load.stop_when_missed_at): {o.stopped}"
            for o in passes if o.stopped
        ]  # fmt: skip
        if self.spec.press is not None:  # kvpipe.job.servers serves a pressed cache one request per call
            notes.append(f"press={self.spec.press.name} served one request per call: each prompt is pressed alone "
                         "(a left-padded batch would hand the press its pad positions as tokens)")  # fmt: skip
        return metrics, notes, tags

    def verdicts(self, tokenizer, stops: set[int], batches: list, calls: list) -> list[list[bool]] | None:
        """Per pass, per request: whether the answer it was served was right (`answered`'s batches and
        calls), each judged alone by the workload's own scoring (greedy passes too: under a load, one
        prompt's answers may differ); None where the workload judges no answers, or not every one."""
        if not batches:
            return None
        workload = self.workload
        judged = []
        for index, call in enumerate(calls):
            answers = workload.scored(
                workload.answers(tokenizer, stops, [batches[index % len(batches)]], [call])
            ).answers
            if not answers:
                return None
            judged.append(all(answer.correct for answer in answers))
        return [judged[start : start + len(batches)] for start in range(0, len(judged), len(batches))]

    def answered(self) -> tuple[list, list]:
        """Every served request of every pass as the workload's scoring reads a batch job's calls:
        each request's prompt batch (the load may ask a prompt more than once), and per pass a call
        per request holding the tokens it was answered (greedy passes are scored once: the workload's rule)."""
        import torch

        batch_of = {id(prompt): batch for batch, prompt in zip(self.batches, self.prompts)}
        # a pass stopped early (load.stop_when_missed_at, one pass) answered its first requests only
        batches = [batch_of[id(request)] for request in self.requests][: len(self.passes[0].served)]
        calls = [
            SimpleNamespace(new_tokens=torch.tensor([served.tokens], dtype=torch.long))
            for outcome in self.passes
            for served in outcome.served
        ]
        return batches, calls

    def prompt_tokens(self) -> list[int]:
        return [len(request.ids) for request in self.requests]

    def texts(self) -> list[dict[str, str]]:
        decode = self.loaded.tokenizer.decode
        return [
            {"prompt": request.text, "completion": decode(served.tokens, skip_special_tokens=True)}
            for request, served in list(zip(self.requests, self.passes[0].served))[:SHOWN_TEXTS]
        ]

    def quality_inputs(self) -> tuple[list, list]:
        """The batches whose prompt was served, each with its first answer in the first pass."""
        import torch

        answers: dict[int, object] = {}
        for request, served in zip(self.requests, self.passes[0].served):
            answers.setdefault(id(request), served)
        pairs = [(b, answers[id(p)]) for b, p in zip(self.batches, self.prompts) if id(p) in answers]
        return [batch for batch, _ in pairs], [torch.tensor([served.tokens]) for _, served in pairs]
