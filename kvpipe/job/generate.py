"""One measured generate() call: a fresh cache, per-token timestamps, peak memory, KV bytes (where a\nworkload asks many questions of one context: the context read once, then every question answered)."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from kvpipe.cache.accounting import cached_tokens, kv_cache_bytes, kv_cache_host_bytes
from kvpipe.errors import KvpipeError, first_line
from kvpipe.job.phases import eos_ids
from kvpipe.job.question_after_context import answers_after_context, generate_after_context
from kvpipe.measure.clock import Timing, TokenClock
from kvpipe.measure.memory import PeakMemory, release_freed_memory


@dataclass
class Call:
    """What one generate() call measured."""

    timing: Timing
    peak: PeakMemory
    batch_size: int
    prompt_tokens: int
    kv_bytes: int
    kv_tokens: int
    kv_host_bytes: int  # of kv_bytes, those in host memory while the model runs on an accelerator
    new_tokens: Any  # LongTensor [batch, steps]
    context_prefill_ms: float | None = None  # the context read and compressed alone, before any question
    question_timings: list[Timing] | None = None  # many questions on one context: each one's own


def measured_generate(spec, loaded, setup, batch) -> Call:
    """One generate() call with a fresh cache, timed per token and memory-probed."""
    import torch

    workload = spec.workload
    new_tokens = batch.max_new_tokens or workload.max_new_tokens  # a dataset row may set its own
    cache = setup.make_cache()
    clock = TokenClock(sync_cuda=loaded.device == "cuda")
    release_freed_memory(loaded.device)
    torch.manual_seed(workload.seed)
    with torch.inference_mode(), PeakMemory(loaded.device) as peak, _backend_errors(spec, batch):
        made = _generated(spec, loaded, setup, batch, cache, clock, new_tokens)
    return Call(
        timing=made.timing,
        peak=peak,
        batch_size=batch.input_ids.shape[0],
        prompt_tokens=batch.prompt_tokens,
        kv_bytes=kv_cache_bytes(cache),
        kv_tokens=cached_tokens(cache),
        kv_host_bytes=kv_cache_host_bytes(cache) if loaded.device != "cpu" else 0,
        new_tokens=made.new_tokens,
        context_prefill_ms=made.context_ms,
        question_timings=made.question_timings,
    )


@dataclass
class _Generated:
    timing: Timing
    new_tokens: Any  # LongTensor [rows, steps], on the CPU
    context_ms: float | None = None
    question_timings: list[Timing] | None = None


def _generated(spec, loaded, setup, batch, cache, clock: TokenClock, new_tokens: int) -> _Generated:
    """The call as its batch and press ask: generate() on the whole prompt; the question after the
    compressed context (press.protocol=query_agnostic); or many questions after one context."""
    stops = (eos_ids(loaded.model), spec.workload.ignore_eos, loaded.tokenizer.pad_token_id)
    if batch.questions is not None:
        answers = answers_after_context(
            loaded.model, batch.input_ids, batch.questions, cache, clock, new_tokens, *stops
        )
        timing = Timing(
            ttft_ms=answers.context_ms + answers.timings[0].ttft_ms,  # what the first question waited
            e2e_ms=answers.context_ms + sum(t.e2e_ms for t in answers.timings),
            itl_ms=[ms for t in answers.timings for ms in t.itl_ms],  # within each answer, never between two
            steps=sum(t.steps for t in answers.timings),
        )
        return _Generated(timing, answers.padded().cpu(), answers.context_ms, answers.timings)
    if spec.strategy.press.question_after_context:
        output, context_ms = generate_after_context(loaded.model, batch, cache, clock, new_tokens, *stops)
    else:
        output, context_ms = clocked_generate(spec.workload, loaded, setup, batch, cache, clock, new_tokens), None
    return _Generated(Timing.from_clock(clock), output[:, batch.prompt_tokens :].cpu(), context_ms)


def clocked_generate(workload, loaded, setup, batch, cache, clock: TokenClock, new_tokens: int):
    """generate() as kvpipe measures it: the cache given, every step timestamped by `clock`, and
    exactly new_tokens per row where the workload ignores EOS (EOS would end strategies at
    different steps). The serving job's static batches call it too."""
    clock.begin()
    output = loaded.model.generate(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        cache=cache,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens if workload.ignore_eos else None,
        do_sample=workload.do_sample,
        streamer=clock,
        pad_token_id=loaded.tokenizer.pad_token_id,
        **setup.generate_kwargs,
    )
    clock.end()
    return output


@contextmanager
def _backend_errors(spec, batch):
    """A lossy cache whose backend fails for some shape says which combination and shape, in one line."""
    import torch

    try:
        yield
    except torch.OutOfMemoryError:
        raise  # not a backend bug: the OOM fallback handles it
    except (RuntimeError, ValueError, AssertionError) as exc:
        if spec.strategy.lossless:
            raise
        raise KvpipeError(
            f"{spec.strategy.describe()} failed inside the backend for batch {batch.input_ids.shape[0]} x {batch.prompt_tokens} "
            f"prompt tokens: {type(exc).__name__}: {first_line(exc)}"
        ) from exc
