"""The two servers a served job measures, and the requests they serve: the workload's prompts, picked
and timed by the load (kvpipe.job.served runs them and measures; kvpipe.measure.request_figures sums up).

Two servers. A strategy that batches continuously (cache=paged) gets transformers' continuous
batching manager: a request joins the running batch as soon as it arrives and leaves it when its
answer is done. Every other strategy is served the way `generate` can serve: static batches of up
to the load's in-flight limit, left-padded, each held until its longest request ends. That is the
honest baseline continuous batching is measured against.

A closed loop (load=concurrency) lets the next request in when one is answered: its arrival is
then. An open loop (load=rate, load=replay, load=offline) has its arrivals fixed in advance; a request that
arrives while the server is busy waits, and that wait counts in its TTFT.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass

from kvpipe.cache.accounting import kv_cache_bytes
from kvpipe.job.generate import clocked_generate
from kvpipe.measure.clock import TokenClock
from kvpipe.measure.request_figures import Served

# How long the continuous server's client waits for an answer before it looks at the clock again (to let
# in a request that has arrived meanwhile)
POLL_S = 0.01


@dataclass(frozen=True)
class Request:
    """One request: its prompt's token ids, how many tokens it asks for, and its prompt's text."""

    ids: list[int]
    new_tokens: int
    text: str
    arrival_s: float | None = None  # when the workload says it arrived (a dataset's timestamps), if it does


@dataclass
class Outcome:
    """What serving a list of requests gave: each request as served, the most in flight at once,
    the KV cache's bytes (a static batch's largest cache; a paged cache's whole pool, which it
    reserves), and for a paged cache the most its requests held at once."""

    served: list[Served]
    max_in_flight: int
    kv_bytes: int
    kv_held_bytes: int | None = None


def requests_of(batches, new_tokens: int) -> list[Request]:
    """The workload's prompts as requests, one per batch (a load serves one row per request), in the
    workload's order; the load picks which it serves (kvpipe.load)."""
    prompts = []
    for batch in batches:
        ids = batch.input_ids[0][batch.attention_mask[0].bool()].tolist()
        arrival = getattr(batch.rows[0], "arrival_s", None) if batch.rows else None
        prompts.append(Request(ids, batch.max_new_tokens or new_tokens, batch.texts[0], arrival))
    return prompts


def serve_static_batches(spec, loaded, setup, requests: list[Request], arrivals: list[float], cap: int,
                         closed: bool) -> Outcome:  # fmt: skip
    """Static batches of up to `cap` arrived requests, each one generate() call held to its longest."""
    import torch

    from kvpipe.workload.base import padded_batch

    workload = spec.workload
    served: list[Served | None] = [None] * len(requests)
    waiting = deque(range(len(requests)))
    start, free_at, kv_peak, most = time.perf_counter(), 0.0, 0, 0
    while waiting:
        now = time.perf_counter()
        due = free_at if closed else start + arrivals[waiting[0]]
        if due > now:
            time.sleep(due - now)
            continue
        taken = []
        while waiting and len(taken) < cap and (closed or start + arrivals[waiting[0]] <= now):
            taken.append(waiting.popleft())
        batch = padded_batch(loaded.tokenizer, [requests[i].ids for i in taken], loaded.device)
        longest = max(requests[i].new_tokens for i in taken)
        clock, cache = TokenClock(sync_cuda=loaded.device == "cuda"), setup.make_cache()
        torch.manual_seed(workload.seed)
        with torch.inference_mode():
            output = clocked_generate(workload, loaded, setup, batch, cache, clock, longest)
        finished = time.perf_counter()
        kv_peak, most = max(kv_peak, kv_cache_bytes(cache)), max(most, len(taken))
        prompt = batch.input_ids.shape[1]
        for row, index in enumerate(taken):
            wanted = requests[index].new_tokens
            arrival = (free_at or start) if closed else start + arrivals[index]
            served[index] = Served(
                arrival_s=arrival,
                started_s=clock.start_s,
                token_s=clock.step_s[:wanted],
                finished_s=finished,
                prompt_tokens=len(requests[index].ids),
                tokens=output[row, prompt : prompt + wanted].tolist(),
            )
        free_at = finished
    return Outcome([s for s in served if s is not None], most, kv_peak)


def serve_continuously(spec, loaded, requests: list[Request], arrivals: list[float], cap: int,
                       closed: bool) -> Outcome:  # fmt: skip
    """Requests added to transformers' continuous batching manager as they arrive (at most `cap` in
    flight), answers taken as they finish."""
    strategy = spec.strategy
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.WARNING)  # its start and stop lines, per run
    manager = strategy.start_manager(
        loaded,
        max_prompt_tokens=max(len(r.ids) for r in requests),
        max_new_tokens=max(r.new_tokens for r in requests),
        num_requests=min(cap, len(requests)),  # what is in flight at once: off CUDA, the pool's size
        seed=spec.workload.seed,
        ignore_eos=spec.workload.ignore_eos,
        do_sample=spec.workload.do_sample,
    )
    served: list[Served | None] = [None] * len(requests)
    in_flight: dict[str, tuple[int, float]] = {}
    start, next_index, done, most = time.perf_counter(), 0, 0, 0
    try:
        pool = strategy.pool_bytes(manager)
        while done < len(requests):
            now = time.perf_counter()
            while (
                next_index < len(requests) and len(in_flight) < cap and (closed or start + arrivals[next_index] <= now)
            ):
                request = requests[next_index]
                request_id = f"request_{next_index}"
                manager.add_request(
                    request.ids, request_id=request_id, max_new_tokens=request.new_tokens, record_timestamps=True
                )
                in_flight[request_id] = (next_index, now if closed else start + arrivals[next_index])
                next_index += 1
            most = max(most, len(in_flight))
            wait = POLL_S
            if not closed and next_index < len(requests) and len(in_flight) < cap:
                wait = min(POLL_S, max(start + arrivals[next_index] - time.perf_counter(), 0.001))
            answer = manager.get_result(timeout=wait)
            if answer is None:
                continue
            if answer.error:
                raise RuntimeError(f"continuous batching failed on {answer.request_id}: {answer.error}")
            index, arrival = in_flight.pop(answer.request_id)
            served[index] = Served(
                arrival_s=arrival,
                started_s=answer.lifespan[0],
                token_s=list(answer.timestamps or []),
                finished_s=answer.lifespan[1],
                prompt_tokens=len(requests[index].ids),
                tokens=list(answer.generated_tokens),
            )
            done += 1
        _, held_peak = strategy.peak_held(manager)
    finally:
        strategy.stop_manager(manager)
    return Outcome([s for s in served if s is not None], most, pool, held_peak)
