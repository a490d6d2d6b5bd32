"""Output quality against a full-precision DynamicCache reference of the same model, in the same process.

Scored teacher-forced, on the workload's own texts (its `windows`, handed in by the runner): long_context,
windows of its text at its prompt length, followed by the text's real continuation; chat, its
prompts, followed by the reference's own greedy continuation. Each window's prefix is read into
the cache under test, then the continuation is fed one token at a time, so every scored prediction
reads keys and values back from that cache. Windows are scored together, as one batch stepping token
by token, where that cannot change a score (`CacheStrategy.quality_batching`). A plain DynamicCache
in the model dtype is the reference itself: its scores are the reference's log-probabilities, which
scoring it again would recompute operation for operation; by default more tokens are scored than a quantized
cache keeps in its full-precision residual, so its re-quantization is exercised. Per window:
  * token_agreement: the fraction of scored positions where the top-1 token equals the reference's;
  * kl_vs_reference: the mean KL divergence of the reference's next-token distribution to ours;
  * ppl: perplexity of the continuation.
Each is the mean over windows, with its spread (`_std`). Static + compile is scored through the
compiled forward that its decoding uses. `first_divergence` compares free-running greedy tokens:
the first step at which any sequence leaves the reference's path (-1: none does).

References (the greedy tokens, the continuations and the reference's log-probabilities) are made
once per model, dtype, workload and quality settings, and reused by every later job in the process:
a sweep pays for them once. They are also kept on disk (`kvpipe.disk_cache`), keyed by the
weights' fingerprint, the dtype and device type, the versions that computed them, the workload and
the quality settings, so a later process pays nothing. The workload's side of the key is its own
defining fields, from the registry (`Workload.reference_key`), so two settings never share a reference.
"""

from __future__ import annotations

import math
import statistics

from kvpipe import disk_cache
from kvpipe.config import QualityConfig
from kvpipe.model.loading import LoadedModel, config_key

_REFERENCES: dict[tuple, object] = {}
_FINGERPRINTS: dict[str, str | None] = {}


def scored_tokens(spec) -> int:
    """quality.scored_tokens, or by default more than a quantized cache's residual (so it re-quantizes
    at least once while it is scored), and at least 64."""
    return spec.quality.scored_tokens or QualityConfig.default_scored_tokens(spec.residual_length)


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
    return teacher_forced_rows(loaded, make_cache, [prefix], [continuation], step)[0]


def teacher_forced_rows(loaded: LoadedModel, make_cache, prefixes, continuations, step=None):
    """teacher_forced for several windows at once, as one batch stepping token by token:
    [windows, len(continuation), vocab]. Continuations must be of one length. Prefixes of different
    lengths are left-padded, with an attention mask and each row's own positions, so every row sees
    exactly what it would see alone; prefixes of one length need neither."""
    import torch

    step = step or loaded.model
    device, rows = loaded.device, len(prefixes)
    longest, length = max(map(len, prefixes)), len(continuations[0])
    assert all(len(c) == length for c in continuations), "continuations of one batch must be of one length"
    padded = any(len(p) != longest for p in prefixes)
    pad = loaded.tokenizer.pad_token_id or 0
    ids = torch.tensor([[pad] * (longest - len(p)) + p for p in prefixes], device=device)
    mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prefixes], device=device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    masking = {"attention_mask": mask, "position_ids": positions} if padded else {}
    cache = make_cache(capacity=longest + length)
    tokens = torch.tensor(continuations, device=device)
    logprobs = []
    with torch.inference_mode():
        out = loaded.model(input_ids=ids, cache=cache, use_cache=True, **masking)
        logprobs.append(torch.log_softmax(out.logits[:, -1].float(), dim=-1))
        for offset in range(length - 1):
            # each row's own position, said outright: a cache a press evicted from holds fewer tokens than it has read
            masking = {"position_ids": positions[:, -1:] + offset + 1}
            if padded:
                mask = torch.cat([mask, mask.new_ones(rows, 1)], dim=-1)
                masking["attention_mask"] = mask
            out = step(input_ids=tokens[:, offset : offset + 1], cache=cache, use_cache=True, **masking)
            logprobs.append(torch.log_softmax(out.logits[:, -1].float(), dim=-1))
    return torch.stack(logprobs, dim=1)


def batches_of(windows: list, batching: str) -> list[list[int]]:
    """Indices of the windows scored together: every window of one continuation length ("padded"),
    those of one prefix length too ("equal_length": no padding, for caches whose groups or compiled
    graphs padding would change), or one at a time ("apart": a quantizer whose scale spans the batch)."""
    groups: dict[tuple, list[int]] = {}
    for index, (prefix, continuation, *_) in enumerate(windows):
        key = {"padded": (len(continuation),), "equal_length": (len(continuation), len(prefix))}.get(batching, (index,))
        groups.setdefault(key, []).append(index)
    return list(groups.values())


def scored_rows(loaded: LoadedModel, make_cache, windows: list, batching: str, step=None) -> list:
    """Each window's [len(continuation), vocab] log-probabilities, scored in batches_of(windows, batching)."""
    found: dict[int, object] = {}
    for group in batches_of(windows, batching):
        rows = teacher_forced_rows(
            loaded, make_cache, [windows[i][0] for i in group], [windows[i][1] for i in group], step
        )
        found.update(zip(group, rows))
    return [found[index] for index in range(len(windows))]


def measure(loaded: LoadedModel, spec, workload, batches, generated: list, setup) -> dict[str, float]:
    """Every quality metric of one job; `workload` is its kvpipe.workload.Workload (its windows, its
    reference key), handed in by the runner."""
    import torch

    metrics: dict[str, float] = {}
    # A sampled text has no greedy path to leave; some workloads score their answers their own way
    # (passkey, against its keys), which says more than where they left the reference's path.
    if not spec.workload.do_sample and workload.compares_greedy_path:
        reference = reference_tokens(loaded, spec, workload, batches)
        metrics["first_divergence"] = first_divergence(generated, reference)
    compile_config = setup.generate_kwargs.get("compile_config")
    step = loaded.model.get_compiled_call(compile_config) if compile_config is not None else None
    windows = _reference_windows(loaded, spec, workload)
    if setup.is_reference and step is None:  # the same cache, batches and operations as the reference's
        ours = [reference for _, _, reference in windows]
    else:
        batching = spec.strategy.quality_batching(compiled=compile_config is not None)
        ours = scored_rows(loaded, setup.make_cache, windows, batching, step)
    per_window = [
        window_scores(logprobs, reference, torch.tensor(continuation))
        for logprobs, (prefix, continuation, reference) in zip(ours, windows)
    ]
    for name in per_window[0]:
        values = [scores[name] for scores in per_window]
        metrics[name] = statistics.fmean(values)
        metrics[name + "_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
    metrics["quality_windows"] = len(per_window)
    metrics["quality_scored_tokens"] = len(windows[-1][1])
    return metrics


def reference_key(loaded: LoadedModel, spec, workload, what: str) -> tuple:
    """What a reference depends on: the model, its dtype, the workload's own defining fields (with
    how its calls generate, for the greedy tokens), and for windows the quality settings."""
    generation = what.startswith("tokens")
    quality = () if generation else (spec.quality.windows, scored_tokens(spec))
    return (what, config_key(spec.model), loaded.dtype, workload.reference_key(generation), quality)


def stored(loaded: LoadedModel, spec, workload, what: str, make):
    """The reference `what`: from this process, else from disk, else made (and stored on both)."""
    key = reference_key(loaded, spec, workload, what)
    if key not in _REFERENCES:
        on_disk = disk_key(loaded, spec, key)
        value = None if on_disk is None else disk_cache.load(on_disk, loaded.device)
        if value is None:
            value = make()
            if on_disk is not None:
                disk_cache.save(on_disk, value)
        _REFERENCES[key] = value
    return _REFERENCES[key]


def disk_key(loaded: LoadedModel, spec, key: tuple) -> str | None:
    """The on-disk key: the process key with the weights' fingerprint for the model config, the device
    type and the versions that compute it; None where the weights have no fingerprint."""
    import torch
    import transformers

    from kvpipe import __version__
    from kvpipe.model.fingerprint import fingerprint

    model_key = config_key(spec.model)
    if model_key not in _FINGERPRINTS:
        _FINGERPRINTS[model_key] = fingerprint(spec.model, loaded.model.config)
    weights = _FINGERPRINTS[model_key]
    if weights is None:
        return None
    what, _, dtype, workload_key, quality = key
    versions = (__version__, torch.__version__, transformers.__version__)
    return repr((disk_cache.FORMAT, what, weights, dtype, loaded.device.split(":")[0], workload_key, quality,
                 spec.model.attn_implementation, versions))  # fmt: skip


def reference_tokens(loaded: LoadedModel, spec, workload, batches) -> list:
    """Greedy tokens of the full-precision DynamicCache on the job's batches ([batch, steps] each),
    keyed by those batches too: a served job scores only the prompts it served, in its own batches,
    and another job on the same workload must not read that reference as its own."""
    what = f"tokens of {batches_digest(batches)}"
    return stored(loaded, spec, workload, what, lambda: _greedy_tokens(loaded, spec, batches))


def batches_digest(batches) -> str:
    """The batches' prompts and masks, hashed: equal for the same tokens in the same batches."""
    import hashlib

    digest = hashlib.sha256()
    for batch in batches:
        for tensor in (batch.input_ids, batch.attention_mask):
            digest.update(repr(tuple(tensor.shape)).encode() + tensor.cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def _greedy_tokens(loaded: LoadedModel, spec, batches) -> list:
    import torch
    from transformers import DynamicCache

    settings, outputs = spec.workload, []
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
    return outputs


def _reference_windows(loaded: LoadedModel, spec, workload) -> list[tuple[list[int], list[int], object]]:
    """(prefix, continuation, reference log-probabilities) per scoring window."""
    return stored(loaded, spec, workload, "windows", lambda: _scored_windows(loaded, spec, workload))


def _scored_windows(loaded: LoadedModel, spec, workload) -> list:
    """The workload's windows, each with its continuation (the reference's own greedy one where the
    workload has none; one window at a time, as a batch could flip a near-tie) and the reference's
    log-probabilities, scored together."""
    import torch
    from transformers import DynamicCache

    def dense(capacity: int = 0):
        return DynamicCache(config=loaded.model.config)

    scored, texts = scored_tokens(spec), []
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
        texts.append((window.prefix, continuation))
    logprobs = scored_rows(loaded, dense, texts, "padded")
    return [(prefix, continuation, ref) for (prefix, continuation), ref in zip(texts, logprobs)]
