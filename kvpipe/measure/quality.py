"""Output quality against a full-precision DynamicCache reference of the same model, in the same process.

Scored teacher-forced, on the workload's own texts (its `windows`, handed in by the runner): long_context,
windows of its text at its prompt length, followed by the text's real continuation; chat, its
prompts, followed by the reference's own greedy continuation. Each window's prefix is read into
the cache under test, then the continuation is fed one token at a time, so every scored prediction
reads keys and values back from that cache; by default more tokens are scored than a quantized
cache keeps in its full-precision residual, so its re-quantization is exercised. Per window:
  * token_agreement: the fraction of scored positions where the top-1 token equals the reference's;
  * kl_vs_reference: the mean KL divergence of the reference's next-token distribution to ours;
  * ppl: perplexity of the continuation.
Each is the mean over windows, with its spread (`_std`). Static + compile is scored through the
compiled forward that its decoding uses. `first_divergence` compares free-running greedy tokens:
the first step at which any sequence leaves the reference's path (-1: none does).

References (the greedy tokens, the continuations and the reference's log-probabilities) are made
once per model, dtype, workload and quality settings, and reused by every later job in the process:
a sweep pays for them once. The workload's side of the key is its own defining fields, from the
registry (`Workload.reference_key`), so two settings never share a reference.
"""

from __future__ import annotations

import math
import statistics

from kvpipe.model.loading import LoadedModel, config_key

_REFERENCES: dict[tuple, object] = {}


def scored_tokens(spec) -> int:
    """quality.scored_tokens, or by default more than a quantized cache's residual (so it re-quantizes
    at least once while it is scored), and at least 64."""
    return spec.quality.scored_tokens or max(64, spec.backend.residual_length + 32)


def first_divergence(generated: list, reference: list) -> int:
    """First step where any sequence's greedy token differs from the reference's; -1 if none does.
    Both are lists of [batch, steps] token tensors, batch by batch."""
    first = -1
    for ours, theirs in zip(generated, reference):
        steps = min(ours.shape[1], theirs.shape[1])
        mismatched = (ours[:, :steps] != theirs[:, :steps]).any(dim=0).nonzero()
        if len(mismatched):
            position = int(mismatched[0])
            first = position if first < 0 else min(first, position)
    return first


def window_scores(logprobs, reference, targets) -> dict[str, float]:
    """One window's scores from [positions, vocab] log-probabilities (ours and the reference's) and
    the tokens that really came next: top-1 agreement, mean KL(reference || ours) in nats, perplexity."""
    import torch

    agreement = (logprobs.argmax(dim=-1) == reference.argmax(dim=-1)).float().mean().item()
    kl = torch.sum(reference.exp() * (reference - logprobs), dim=-1).mean().item()
    nll = -logprobs.gather(1, targets[:, None].to(logprobs.device)).mean().item()
    return {"token_agreement": agreement, "kl_vs_reference": max(kl, 0.0), "ppl": math.exp(nll)}


def teacher_forced(loaded: LoadedModel, make_cache, prefix: list[int], continuation: list[int], step=None):
    """Log-probabilities [len(continuation), vocab] of each continuation token's prediction: the prefix
    is prefilled into a fresh cache, then the continuation is fed one token at a time through `step`
    (the model's forward, or its compiled decode call)."""
    import torch

    step = step or loaded.model
    device = loaded.device
    cache = make_cache(capacity=len(prefix) + len(continuation))
    logprobs = []
    with torch.inference_mode():
        out = loaded.model(input_ids=torch.tensor([prefix], device=device), cache=cache, use_cache=True)
        logprobs.append(torch.log_softmax(out.logits[0, -1].float(), dim=-1))
        for offset, token in enumerate(continuation[:-1]):
            position = torch.tensor([len(prefix) + offset], device=device)
            out = step(input_ids=torch.tensor([[token]], device=device), cache=cache, use_cache=True,
                       cache_position=position)  # fmt: skip
            logprobs.append(torch.log_softmax(out.logits[0, -1].float(), dim=-1))
    return torch.stack(logprobs)


def measure(loaded: LoadedModel, spec, workload, batches, generated: list, setup) -> dict[str, float]:
    """Every quality metric of one job; `workload` is its kvpipe.workload.Workload (its windows, its
    reference key), handed in by the runner."""
    import torch

    metrics: dict[str, float] = {}
    # A sampled text has no greedy path to leave; some workloads score their answers their own way
    # (passkey, against its keys), which says more than where they left the reference's path.
    if not spec.workload.do_sample and workload.compares_greedy_path:
        reference = _reference_tokens(loaded, spec, workload, batches)
        metrics["first_divergence"] = first_divergence(generated, reference)
    compile_config = setup.generate_kwargs.get("compile_config")
    step = loaded.model.get_compiled_call(compile_config) if compile_config is not None else None
    per_window = []
    for prefix, continuation, reference in _reference_windows(loaded, spec, workload):
        logprobs = teacher_forced(loaded, setup.make_cache, prefix, continuation, step)
        per_window.append(window_scores(logprobs, reference, torch.tensor(continuation)))
    for name in per_window[0]:
        values = [scores[name] for scores in per_window]
        metrics[name] = statistics.fmean(values)
        metrics[name + "_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
    metrics["quality_windows"] = len(per_window)
    metrics["quality_scored_tokens"] = len(continuation)
    return metrics


def reference_key(loaded: LoadedModel, spec, workload, what: str) -> tuple:
    """What a reference depends on: the model, its dtype, the workload's own defining fields (with
    how its calls generate, for the greedy tokens), and for windows the quality settings."""
    generation = what == "tokens"
    quality = () if generation else (spec.quality.windows, scored_tokens(spec))
    return (what, config_key(spec.model), loaded.dtype, workload.reference_key(generation), quality)


def _reference_tokens(loaded: LoadedModel, spec, workload, batches) -> list:
    """Greedy tokens of the full-precision DynamicCache on the job's batches."""
    import torch
    from transformers import DynamicCache

    settings = spec.workload
    key = reference_key(loaded, spec, workload, "tokens")
    if key not in _REFERENCES:
        outputs = []
        with torch.inference_mode():
            for batch in batches:
                new_tokens = batch.max_new_tokens or settings.max_new_tokens
                out = loaded.model.generate(
                    input_ids=batch.input_ids,
                    attention_mask=batch.attention_mask,
                    cache=DynamicCache(config=loaded.model.config),
                    max_new_tokens=new_tokens,
                    min_new_tokens=new_tokens if settings.ignore_eos else None,
                    do_sample=False,
                    pad_token_id=loaded.tokenizer.pad_token_id,
                )
                outputs.append(out[:, batch.prompt_tokens :].cpu())
        _REFERENCES[key] = outputs
    return _REFERENCES[key]


def _reference_windows(loaded: LoadedModel, spec, workload) -> list[tuple[list[int], list[int], object]]:
    """(prefix, continuation, reference log-probabilities) per scoring window."""
    import torch
    from transformers import DynamicCache

    scored = scored_tokens(spec)
    key = reference_key(loaded, spec, workload, "windows")
    if key not in _REFERENCES:

        def dense(capacity: int = 0):
            return DynamicCache(config=loaded.model.config)

        made = []
        for window in workload.windows(loaded.tokenizer, spec.quality.windows, scored):
            continuation = window.continuation
            if continuation is None:  # what the reference itself writes after the prompt
                with torch.inference_mode():
                    out = loaded.model.generate(
                        input_ids=torch.tensor([window.prefix], device=loaded.device),
                        cache=dense(),
                        max_new_tokens=scored,
                        min_new_tokens=scored,
                        do_sample=False,
                        pad_token_id=loaded.tokenizer.pad_token_id,
                    )
                continuation = out[0, len(window.prefix) :].tolist()
            made.append((window.prefix, continuation, teacher_forced(loaded, dense, window.prefix, continuation)))
        _REFERENCES[key] = made
    return _REFERENCES[key]
