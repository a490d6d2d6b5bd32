"""One measured generate() call: a fresh cache, per-token timestamps, peak memory, KV bytes."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from kvpipe.cache.accounting import cached_tokens, kv_cache_bytes, kv_cache_host_bytes
from kvpipe.errors import KvpipeError, first_line
from kvpipe.job.phases import eos_ids
from kvpipe.job.question_after_context import generate_after_context
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
    context_prefill_ms: float | None = None  # press.protocol=query_agnostic: the context read and compressed


def measured_generate(spec, loaded, setup, batch) -> Call:
    """One generate() call with a fresh cache, timed per token and memory-probed."""
    import torch

    workload = spec.workload
    new_tokens = batch.max_new_tokens or workload.max_new_tokens  # a dataset row may set its own
    cache = setup.make_cache()
    clock = TokenClock(sync_cuda=loaded.device == "cuda")
    release_freed_memory(loaded.device)
    torch.manual_seed(workload.seed)
    context_ms = None
    with torch.inference_mode(), PeakMemory(loaded.device) as peak, _backend_errors(spec, batch):
        if spec.strategy.press.question_after_context:
            output, context_ms = generate_after_context(
                loaded.model, batch, cache, clock, new_tokens,
                eos_ids(loaded.model), workload.ignore_eos, loaded.tokenizer.pad_token_id,
            )  # fmt: skip
        else:
            output = clocked_generate(workload, loaded, setup, batch, cache, clock, new_tokens)
    return Call(
        timing=Timing.from_clock(clock),
        peak=peak,
        batch_size=batch.input_ids.shape[0],
        prompt_tokens=batch.prompt_tokens,
        kv_bytes=kv_cache_bytes(cache),
        kv_tokens=cached_tokens(cache),
        kv_host_bytes=kv_cache_host_bytes(cache) if loaded.device != "cpu" else 0,
        new_tokens=output[:, batch.prompt_tokens :].cpu(),
        context_prefill_ms=context_ms,
    )


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
