"""The two servers a served job measures, and the requests they serve: the workload's prompts, picked
and timed by the load (kvpipe.job.served runs them and measures; kvpipe.measure.request_figures sums up).

Two servers. A strategy that batches continuously (cache=paged) gets transformers' continuous
batching manager: a request joins the running batch as soon as it arrives and leaves it when its
answer is done. Every other strategy is served the way `generate` can serve: static batches of up
to the load's in-flight limit, left-padded, each held until its longest request ends. That is the
honest baseline continuous batching is measured against.

A closed loop (load=concurrency) lets the next request in when one is answered: its arrival is
then. An open loop (load=rate, load=replay, load=offline) has its arrivals fixed in advance; a request that
arrives while the server is busy waits, and that wait counts in its TTFT. Sessions of turns
(kvpipe.job.session_turns) arrive as their own clients send them: a turn a think time after the
previous turn's answer. The servers take whatever has arrived from a queue (kvpipe.job.arrivals) and
tell it when each request is answered.
"""

from __future__ import annotations

import logging
import time
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
    session: int | None = None  # the session it is a turn of (kvpipe.job.session_turns), if any
    last_turn: bool = True  # a session's last turn: nothing to keep for it after


@dataclass
class Outcome:
    """What serving a list of requests gave: each request as served, the most in flight at once,
    the KV cache's bytes (a static batch's largest cache; a paged cache's whole pool, which it
    reserves), and for a paged cache the most its requests held at once. Where prompts can be served
    from cache (a paged pool's shared blocks, a session's kept cache): the prompt tokens that were;
    with kept session caches, the most bytes they held at once between turns."""

    served: list[Served]
    max_in_flight: int
    kv_bytes: int | None  # None: not reported (a server the user runs)
    kv_held_bytes: int | None = None
    prefix_hit_tokens: int | None = None
    session_kv_held_bytes: int | None = None
    stopped: str = ""  # why the pass stopped letting requests in before the last (`stop`), if it did


def requests_of(batches, new_tokens: int) -> list[Request]:
    """The workload's prompts as requests, one per batch (a load serves one row per request), in the
    workload's order; the load picks which it serves (kvpipe.load)."""
    prompts = []
    for batch in batches:
        ids = batch.input_ids[0][batch.attention_mask[0].bool()].tolist()
        arrival = getattr(batch.rows[0], "arrival_s", None) if batch.rows else None
        prompts.append(Request(ids, batch.max_new_tokens or new_tokens, batch.texts[0], arrival))
    return prompts


def serve_static_batches(spec, loaded, setup, queue, cap: int, kept=None, stop=None) -> Outcome:
    """Static batches of up to `cap` arrived requests (from `queue`: kvpipe.job.arrivals), each one
    generate() call held to its longest. With `kept` (kvpipe.job.kept_caches), a session's turn
    continues from the cache its previous turn left, one request per call: caches of different
    lengths do not batch. A pressed cache serves one request per call too: a left-padded row would
    hand the press its pad positions as tokens (streaming would keep them as its sinks), and what
    each row keeps differs in length. `stop(answered)`: why to let no more requests in (the pass
    has missed its targets whatever the rest do), or None."""
    import torch

    from kvpipe.workload.base import padded_batch

    workload = spec.workload
    served: dict[int, Served] = {}
    start, kv_peak, most, stopped = time.perf_counter(), 0, 0, ""
    queue.begin(start)
    while queue.untaken and not stopped:
        now = time.perf_counter()
        taken = queue.take(now, 1 if kept is not None or spec.press is not None else cap)
        if not taken:  # nothing in flight here between calls: the next arrival is known
            time.sleep(max(queue.next_s() - now, 0.0))
            continue
        rows = [arrival.request for arrival in taken]
        batch = padded_batch(loaded.tokenizer, [request.ids for request in rows], loaded.device)
        longest = max(request.new_tokens for request in rows)
        reused_before = None if kept is None else kept.reused_tokens
        cache = setup.make_cache() if kept is None else kept.resume(rows[0], setup.make_cache)
        clock = TokenClock(sync_cuda=loaded.device == "cuda")
        torch.manual_seed(workload.seed)
        with torch.inference_mode():
            output = clocked_generate(workload, loaded, setup, batch, cache, clock, longest)
        finished = time.perf_counter()
        kv_peak, most = max(kv_peak, kv_cache_bytes(cache)), max(most, len(taken))
        prompt = batch.input_ids.shape[1]
        for row, arrival in enumerate(taken):
            wanted = arrival.request.new_tokens
            served[arrival.index] = Served(
                arrival_s=arrival.arrival_s,
                started_s=clock.start_s,
                token_s=clock.step_s[:wanted],
                finished_s=finished,
                prompt_tokens=len(arrival.request.ids),
                tokens=output[row, prompt : prompt + wanted].tolist(),
                # a session's turn resumed from its kept cache: what it did not prefill
                prefix_hit_tokens=None if kept is None else kept.reused_tokens - reused_before,
            )
        if kept is not None:
            kept.keep(rows[0], cache, served[taken[0].index].tokens)
        for arrival in taken:
            queue.answered(arrival.index, finished, served[arrival.index].tokens)
        stopped = (stop(served.values()) or "") if stop is not None and queue.untaken else ""
    held = None if kept is None else kept.held_peak_bytes
    hits = None if kept is None else kept.reused_tokens
    return Outcome([served[i] for i in sorted(served)], most, kv_peak, None, hits, held, stopped)


def serve_continuously(spec, loaded, queue, cap: int, stop=None) -> Outcome:
    """Requests added to transformers' continuous batching manager as they arrive (from `queue`:
    kvpipe.job.arrivals; at most `cap` in flight), answers taken as they finish. `stop(answered)`:
    why to let no more requests in, or None (those in flight are still answered)."""
    strategy = spec.strategy
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.WARNING)  # its start and stop lines, per run
    manager = strategy.start_manager(
        loaded,
        max_prompt_tokens=queue.max_prompt_tokens,
        max_new_tokens=queue.max_new_tokens,
        num_requests=min(cap, queue.total),  # what is in flight at once: off CUDA, the pool's size
        seed=spec.workload.seed,
        ignore_eos=spec.workload.ignore_eos,
        do_sample=spec.workload.do_sample,
    )
    served: dict[int, Served] = {}
    in_flight: dict[str, object] = {}  # request id -> its kvpipe.job.arrivals.Arrival
    start, most, stopped = time.perf_counter(), 0, ""
    queue.begin(start)
    try:
        matches = strategy.prefix_matches(manager)
        pool = strategy.pool_bytes(manager)
        while len(served) < queue.total and not (stopped and not in_flight):
            for arrival in [] if stopped else queue.take(time.perf_counter(), cap - len(in_flight)):
                request_id = f"request_{arrival.index}"
                manager.add_request(
                    arrival.request.ids, request_id=request_id, max_new_tokens=arrival.request.new_tokens,
                    record_timestamps=True,
                )  # fmt: skip
                in_flight[request_id] = arrival
            most = max(most, len(in_flight))
            wait, due = POLL_S, None if stopped else queue.next_s()
            if due is not None and len(in_flight) < cap:
                wait = min(POLL_S, max(due - time.perf_counter(), 0.001))
            answer = manager.get_result(timeout=wait)
            if answer is None:
                continue
            if answer.error:
                raise RuntimeError(f"continuous batching failed on {answer.request_id}: {answer.error}")
            arrival = in_flight.pop(answer.request_id)
            served[arrival.index] = Served(
                arrival_s=arrival.arrival_s,
                started_s=answer.lifespan[0],
                token_s=list(answer.timestamps or []),
                finished_s=answer.lifespan[1],
                prompt_tokens=len(arrival.request.ids),
                tokens=list(answer.generated_tokens),
                prefix_hit_tokens=matches.get(answer.request_id, 0),  # 0 with block sharing off
            )
            queue.answered(arrival.index, time.perf_counter(), served[arrival.index].tokens)
            if stop is not None and not stopped and queue.untaken:
                stopped = stop(served.values()) or ""
        _, held_peak = strategy.peak_held(manager)
    finally:
        strategy.stop_manager(manager)
    hits = sum(matches.get(f"request_{index}", 0) for index in served)
    return Outcome([served[i] for i in sorted(served)], most, pool, held_peak, hits, stopped=stopped)
