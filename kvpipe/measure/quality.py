"""Output quality against a full-precision DynamicCache reference, in the same process.

Two views, both computed against references that are made once per model + workload and
reused by every later job in the process (a sweep pays for them once):
  * token agreement: the job's greedy tokens against the reference's, position by position;
  * teacher-forced perplexity and KL: a prefix of reference text is prefilled into the cache
    under test, then the continuation is fed one token at a time, so every scored prediction
    attends to keys and values read back from that cache.
"""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass

from kvpipe.config import QualityConfig, WorkloadConfig
from kvpipe.job.workloads import long_context_ids
from kvpipe.model.loading import LoadedModel

_REFERENCE_TOKENS: dict[tuple, list] = {}
_REFERENCE_LOGPROBS: dict[tuple, object] = {}


@dataclass
class Agreement:
    token_agreement: float
    first_divergence: int  # first differing position over all sequences, -1 if none


def compare_tokens(generated: list, reference: list) -> Agreement:
    """Position-wise agreement of [batch, steps] token tensors, batch by batch."""
    same = total = 0
    first = -1
    for ours, theirs in zip(generated, reference):
        steps = min(ours.shape[1], theirs.shape[1])
        equal = ours[:, :steps] == theirs[:, :steps]
        same += int(equal.sum())
        total += equal.numel()
        mismatched = (~equal).any(dim=0).nonzero()
        if len(mismatched):
            position = int(mismatched[0])
            first = position if first < 0 else min(first, position)
    return Agreement(token_agreement=same / total if total else float("nan"), first_divergence=first)


def reference_tokens(loaded: LoadedModel, model_key: tuple, workload: WorkloadConfig, batches) -> list:
    """Greedy tokens of the full-precision DynamicCache on these batches, made once per process."""
    import torch
    from transformers import DynamicCache

    key = (
        model_key,
        workload.kind,
        tuple(workload.prompts),
        workload.prompt_tokens,
        workload.max_new_tokens,
        workload.batch_size,
        workload.ignore_eos,
    )
    if key not in _REFERENCE_TOKENS:
        outputs = []
        with torch.inference_mode():
            for batch in batches:
                out = loaded.model.generate(
                    input_ids=batch.input_ids,
                    attention_mask=batch.attention_mask,
                    cache=DynamicCache(config=loaded.model.config),
                    max_new_tokens=workload.max_new_tokens,
                    min_new_tokens=workload.max_new_tokens if workload.ignore_eos else None,
                    do_sample=False,
                    pad_token_id=loaded.tokenizer.pad_token_id,
                )
                outputs.append(out[:, batch.prompt_tokens :].cpu())
        _REFERENCE_TOKENS[key] = outputs
    return _REFERENCE_TOKENS[key]


def teacher_forced(loaded: LoadedModel, make_cache, quality: QualityConfig):
    """Log-probabilities [scored_tokens, vocab] of the model reading from the cache under test,
    and the true next tokens they should predict."""
    import torch

    ids = torch.tensor([long_context_ids(loaded.tokenizer, quality.context_tokens + 1)], device=loaded.device)
    prefix_len = quality.context_tokens - quality.scored_tokens
    cache = make_cache(capacity=quality.context_tokens)
    logprobs = []
    with torch.inference_mode():
        loaded.model(input_ids=ids[:, :prefix_len], cache=cache, use_cache=True)
        for position in range(prefix_len, quality.context_tokens):
            out = loaded.model(
                input_ids=ids[:, position : position + 1],
                cache=cache,
                use_cache=True,
                cache_position=torch.tensor([position], device=loaded.device),
            )
            logprobs.append(torch.log_softmax(out.logits[0, -1].float(), dim=-1))
    targets = ids[0, prefix_len + 1 : quality.context_tokens + 1]
    return torch.stack(logprobs), targets


def reference_logprobs(loaded: LoadedModel, model_key: tuple, quality: QualityConfig):
    """teacher_forced() through a full-precision DynamicCache, made once per process."""
    from transformers import DynamicCache

    key = (model_key, quality.context_tokens, quality.scored_tokens)
    if key not in _REFERENCE_LOGPROBS:
        _REFERENCE_LOGPROBS[key] = teacher_forced(
            loaded, lambda capacity: DynamicCache(config=loaded.model.config), quality
        )[0]
    return _REFERENCE_LOGPROBS[key]


def perplexity_and_kl(logprobs, targets, reference) -> tuple[float, float]:
    """(perplexity of the true continuation, mean KL(reference || test) per position, in nats)."""
    import torch

    nll = -logprobs.gather(1, targets[:, None].to(logprobs.device)).mean().item()
    kl = torch.sum(reference.exp() * (reference - logprobs), dim=-1).mean().item()
    return math.exp(nll), max(kl, 0.0)


def measure(
    loaded: LoadedModel,
    model_cfg,
    workload: WorkloadConfig,
    quality: QualityConfig,
    batches,
    generated: list,
    make_cache,
) -> dict[str, float]:
    """All quality metrics for one job."""
    metrics: dict[str, float] = {}
    model_key = astuple(model_cfg)
    if not workload.do_sample:  # agreement with a greedy reference means nothing for sampled text
        agreement = compare_tokens(generated, reference_tokens(loaded, model_key, workload, batches))
        metrics["token_agreement"] = agreement.token_agreement
        metrics["first_divergence"] = agreement.first_divergence
    logprobs, targets = teacher_forced(loaded, make_cache, quality)
    metrics["ppl"], metrics["kl_vs_reference"] = perplexity_and_kl(
        logprobs, targets, reference_logprobs(loaded, model_key, quality)
    )
    return metrics
