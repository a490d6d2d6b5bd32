"""press.protocol=query_agnostic: the context read alone into the cache (its press compresses it as
that forward ends), then the question fed after it, then greedy decoding, every step on the clock.

Why not generate(): on a cache that already holds a compressed context, generate() would number the
question's positions from the cache's shorter length. As kvpress's pipeline does (`kvpipe` follows
`kvpress/pipeline.py`: prefill the context with the press, then its own greedy loop with explicit
`position_ids`), each question token gets its true position (context length + i) and each new token
the next; the causal mask is sized by transformers from what each layer holds. A bounded press
(streaming) keeps trimming while the question and the answer are fed, as it does under generate().
"""

from __future__ import annotations

import time


def generate_after_context(model, batch, cache, clock, new_tokens: int, eos_ids: set[int], ignore_eos: bool, pad_id):
    """(ids [batch, prompt + new], the context's prefill and compression in ms) for an unpadded batch
    whose last `batch.question_tokens` are the question: what generate() returns for the same greedy
    call, EOS handled as generate() handles it (suppressed where the workload ignores EOS, else each row
    padded after its own EOS until every row has ended)."""
    import torch

    ids, question_tokens = batch.input_ids, batch.question_tokens
    context_tokens = ids.shape[1] - question_tokens
    sync = ids.device.type == "cuda"
    clock.begin()
    model(input_ids=ids[:, :context_tokens], cache=cache, use_cache=True, logits_to_keep=1)
    context_ms = (_now(sync) - clock.start_s) * 1e3
    clock.put(ids)  # the prompt, as generate() puts it first
    stops = torch.tensor(sorted(eos_ids), dtype=torch.long, device=ids.device)
    positions = torch.arange(context_tokens, ids.shape[1], device=ids.device).expand(ids.shape[0], -1)
    step_ids, generated = ids[:, context_tokens:], []
    ended = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    for step in range(new_tokens):
        if step:
            step_ids, positions = generated[-1][:, None], positions[:, -1:] + 1
        logits = model(input_ids=step_ids, cache=cache, position_ids=positions, use_cache=True, logits_to_keep=1)
        scores = logits.logits[:, -1].float()
        if ignore_eos and len(stops):
            scores[:, stops] = float("-inf")
        next_ids = scores.argmax(dim=-1)
        if not ignore_eos and len(stops):
            next_ids = torch.where(ended, torch.full_like(next_ids, pad_id), next_ids)
            ended |= torch.isin(next_ids, stops)
        generated.append(next_ids)
        clock.put(next_ids)
        if bool(ended.all()):
            break
    clock.end()
    return torch.cat([ids, torch.stack(generated, dim=1)], dim=1), context_ms


def _now(sync: bool) -> float:
    """The clock's own reading: after the device has finished what it was given."""
    if sync:
        import torch

        torch.cuda.synchronize()
    return time.perf_counter()
