"""The context read alone into the cache (its press compresses it as that forward ends), then the
question fed after it, then greedy decoding, every step on the clock: press.protocol=query_agnostic
(one question per prompt), and a workload that asks many questions of one compressed context.

Why not generate(): on a cache that already holds a compressed context, generate() would number the
question's positions from the cache's shorter length. As kvpress's pipeline does
(`kvpress/pipeline.py`: prefill the context with the press, then its own greedy loop with explicit
`position_ids`), each question token gets its true position (context length + i) and each new token
the next; the causal mask is sized by transformers from what each layer holds. The press fires once, on the
context, as kvpress's does; only a rolling press (`press.rolling=true`: streaming's window, which
query_agnostic leaves off by default) keeps trimming while the question and the answer are fed.

Many questions: each is answered from a fork of the compressed cache (`forked`): new layer objects
that share the context's tensors. Cropping the cache back after each answer (kvpress's way) would be
wrong under a rolling press, which has already evicted context tokens to make room for the answer,
and under a quantized layer, which has folded the answer's tokens into its quantized part; a deep
copy would pay the context's bytes for each question, and quanto's quantized tensors refuse it.
"""

from __future__ import annotations

import copy
import types
from dataclasses import dataclass

from kvpipe.measure.clock import Timing, TokenClock


def generate_after_context(model, batch, cache, clock, new_tokens: int, eos_ids: set[int], ignore_eos: bool, pad_id):
    """(ids [batch, prompt + new], the context's prefill and compression in ms) for an unpadded batch
    whose last `batch.question_tokens` are the question: what generate() returns for the same greedy
    call, EOS handled as generate() handles it (suppressed where the workload ignores EOS, else each row
    padded after its own EOS until every row has ended)."""
    import torch

    ids = batch.input_ids
    context_tokens = ids.shape[1] - batch.question_tokens
    clock.begin()
    context_ms = read_context(model, ids[:, :context_tokens], cache, clock)
    clock.put(ids)  # the prompt, as generate() puts it first
    new = answer(model, cache, ids[:, context_tokens:], context_tokens, clock, new_tokens, eos_ids, ignore_eos, pad_id)
    clock.end()
    return torch.cat([ids, new], dim=1), context_ms


@dataclass
class Answers:
    """Many questions answered from one compressed context."""

    context_ms: float  # reading and compressing it, once
    new_tokens: list  # LongTensor [1, steps] per question
    timings: list[Timing]  # per question: from its copy of the cache to its last token
    pad_id: int  # what follows an answer that ended before the longest

    def padded(self):
        """The answers as one LongTensor [questions, steps], each padded after its end as generate() pads."""
        import torch
        import torch.nn.functional as F

        steps = max(tokens.shape[1] for tokens in self.new_tokens)
        return torch.cat([F.pad(t, (0, steps - t.shape[1]), value=self.pad_id) for t in self.new_tokens])


def answers_after_context(model, context_ids, questions: list, cache, clock, new_tokens: int, eos_ids, ignore_eos, pad_id) -> Answers:  # fmt: skip
    """The context [1, tokens] read once into `cache` (which then holds it, compressed, as every
    question found it), then each question [1, tokens] fed after it on a copy of that cache and
    answered greedily; the clock restarted for each question, before its copy."""
    clock.begin()
    context_ms = read_context(model, context_ids, cache, clock)
    answered, timings = [], []
    for question in questions:
        clock.begin()
        copied = forked(cache)
        clock.put(question)  # the prompt, as generate() puts it first
        context = context_ids.shape[1]
        answered.append(answer(model, copied, question, context, clock, new_tokens, eos_ids, ignore_eos, pad_id))
        clock.end()
        timings.append(Timing.from_clock(clock))
    return Answers(context_ms, answered, timings, padding(pad_id, eos_ids))


def forked(cache):
    """A cache that starts where `cache` is and grows apart from it: each layer a new object holding the
    same tensors. Sharing them is safe because a layer that grows replaces its tensors (torch.cat, a new
    quantized block) rather than writing into them, and a preallocated layer writes past the context,
    where each question's own positions overwrite the last one's before its mask lets them be read."""
    copied = copy.copy(cache)
    copied.layers = [copy.copy(layer) for layer in cache.layers]
    for layer in copied.layers:
        own = vars(layer).get("update")  # a press's update, bound to the layer it was attached to
        if isinstance(own, types.MethodType):
            layer.update = types.MethodType(own.__func__, layer)
    return copied


def read_context(model, context_ids, cache, clock: TokenClock) -> float:
    """The context through the cache (where its press fires); ms since the clock began."""
    model(input_ids=context_ids, cache=cache, use_cache=True, logits_to_keep=1)
    return (clock.now() - clock.start_s) * 1e3


def answer(model, cache, question_ids, context_tokens: int, clock, new_tokens: int, eos_ids, ignore_eos, pad_id):
    """The question [batch, tokens] fed at its true positions after `context_tokens`, then greedy
    decoding; the new tokens [batch, steps], each step put on the clock."""
    import torch

    device, rows = question_ids.device, question_ids.shape[0]
    stops = torch.tensor(sorted(eos_ids), dtype=torch.long, device=device)
    pad = padding(pad_id, eos_ids)
    positions = torch.arange(context_tokens, context_tokens + question_ids.shape[1], device=device).expand(rows, -1)
    step_ids, generated = question_ids, []
    ended = torch.zeros(rows, dtype=torch.bool, device=device)
    for step in range(new_tokens):
        if step:
            step_ids, positions = generated[-1][:, None], positions[:, -1:] + 1
        logits = model(input_ids=step_ids, cache=cache, position_ids=positions, use_cache=True, logits_to_keep=1)
        scores = logits.logits[:, -1].float()
        if ignore_eos and len(stops):
            scores[:, stops] = float("-inf")
        next_ids = scores.argmax(dim=-1)
        if not ignore_eos and len(stops):
            next_ids = torch.where(ended, torch.full_like(next_ids, pad), next_ids)
            ended |= torch.isin(next_ids, stops)
        generated.append(next_ids)
        clock.put(next_ids)
        if bool(ended.all()):
            break
    return torch.stack(generated, dim=1)


def padding(pad_id, eos_ids: set[int]) -> int:
    """What follows an ended answer: the pad token, else (as generate() pads without one) an EOS."""
    return pad_id if pad_id is not None else min(eos_ids, default=0)
