"""Workloads: the prompts a job generates from, tokenized into batches."""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvpipe import config
from kvpipe.config import WorkloadConfig
from kvpipe.errors import ConfigError
from kvpipe.job import passkey
from kvpipe.job.texts import long_context_ids


@dataclass
class Batch:
    """One generate() call: left-padded input ids, their attention mask and the prompt texts."""

    input_ids: object  # torch.LongTensor [batch, prompt_len]
    attention_mask: object
    texts: list[str]
    needles: list[passkey.PasskeyPrompt] | None = None  # passkey: each row's key, depth and trial

    @property
    def prompt_tokens(self) -> int:
        return int(self.input_ids.shape[1])


def reads(kind: str, param: str) -> bool:
    """Whether a workload of this kind reads `workload.<field>` (unknown kinds: assume it does)."""
    return config.reads(config.KIND_FIELDS, kind, param.removeprefix("workload."))


def check_fits(workload: WorkloadConfig, shape, prompt_tokens: int) -> None:
    """Prompt plus new tokens must fit the model's positions; checked before the weights load."""
    positions, new = shape.max_positions, workload.max_new_tokens
    if not positions or prompt_tokens + new <= positions:
        return
    # Name the setting that made it so: the prompt length where the user chose it, else what grew past it
    if workload.kind == "long_context":
        field, value, expected = "workload.prompt_tokens", workload.prompt_tokens, f"at most {positions - new}"
    elif workload.kind == "passkey":
        field, value, expected = (
            "workload.context_tokens",
            workload.context_tokens,
            f"lengths of at most {positions - new}",
        )
    elif prompt_tokens >= positions:
        field, value, expected = "workload.prompts", f"{prompt_tokens} tokens", f"prompts under {positions} tokens"
    else:
        field, value, expected = "workload.max_new_tokens", new, f"at most {positions - prompt_tokens}"
    raise ConfigError(
        field,
        value,
        f"expected {expected}: prompt ({prompt_tokens}) + new tokens ({new}) exceed the model's {positions} positions",
    )


def build_batches(workload: WorkloadConfig, tokenizer, device: str) -> list[Batch]:
    """Every batch of the workload, on the device."""
    if workload.kind == "long_context":
        return [_long_context_batch(workload, tokenizer, device)]
    if workload.kind == "passkey":
        return _passkey_batches(workload, tokenizer, device)
    return _chat_batches(workload, tokenizer, device)


@dataclass
class Window:
    """A text that quality is scored on: a prefix read into the cache, and what follows it (the
    workload's own text; None for chat, whose continuation the reference model writes)."""

    prefix: list[int]
    continuation: list[int] | None


def scoring_windows(workload: WorkloadConfig, tokenizer, count: int, scored_tokens: int) -> list[Window]:
    """What quality scores, following the workload: long_context, `count` windows of its own text at
    its own prompt length, each followed by `scored_tokens` tokens of that text; chat, its first
    `count` prompts as the model sees them; passkey, `count` of its longest prompts, one per depth
    in turn (the reference writes what follows, as for chat)."""
    if workload.kind == "long_context":
        windows = []
        for index in range(count):
            ids = long_context_ids(tokenizer, workload.prompt_tokens + scored_tokens, offset=index * _ROW_STRIDE)
            windows.append(Window(ids[: workload.prompt_tokens], ids[workload.prompt_tokens :]))
        return windows
    if workload.kind == "passkey":
        longest = passkey.prompts(replace(workload, context_tokens=[max(workload.context_tokens)]), tokenizer)
        by_depth_first = sorted(longest, key=lambda p: (p.trial, workload.depths.index(p.depth)))
        return [Window(p.input_ids, None) for p in by_depth_first[:count]]
    texts = [_chat_text(tokenizer, prompt) for prompt in workload.prompts[:count]]
    return [Window(tokenizer(text, add_special_tokens=False)["input_ids"], None) for text in texts]


def _chat_batches(workload: WorkloadConfig, tokenizer, device: str) -> list[Batch]:
    prompts = list(workload.prompts)
    size = workload.batch_size
    # Cycle the prompts so that every batch is full: a short last batch would change the shapes.
    count = -(-len(prompts) // size) * size
    prompts = [prompts[i % len(prompts)] for i in range(count)]
    batches = []
    for start in range(0, count, size):
        texts = [_chat_text(tokenizer, prompt) for prompt in prompts[start : start + size]]
        encoded = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        batches.append(Batch(encoded["input_ids"].to(device), encoded["attention_mask"].to(device), texts))
    return batches


def _chat_text(tokenizer, prompt: str) -> str:
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
    return prompt


_ROW_STRIDE = 7919  # tokens between the starts of two rows (or quality windows): each its own text


def _long_context_batch(workload: WorkloadConfig, tokenizer, device: str) -> Batch:
    import torch

    # Each row starts at a different place in the text, so a batch is not B copies of one prompt.
    rows = [
        long_context_ids(tokenizer, workload.prompt_tokens, offset=i * _ROW_STRIDE) for i in range(workload.batch_size)
    ]
    input_ids = torch.tensor(rows, dtype=torch.long, device=device)
    texts = [tokenizer.decode(row) for row in rows]
    return Batch(input_ids, torch.ones_like(input_ids), texts)


def _passkey_batches(workload: WorkloadConfig, tokenizer, device: str) -> list[Batch]:
    """Prompts of one length share batches of batch_size (equal lengths: no padding); a length's
    last batch may be smaller, as no prompt is repeated to fill it."""
    import torch

    batches = []
    prompts = passkey.prompts(workload, tokenizer)
    for length in workload.context_tokens:
        same = [p for p in prompts if p.context_tokens == length]
        for start in range(0, len(same), workload.batch_size):
            rows = same[start : start + workload.batch_size]
            input_ids = torch.tensor([p.input_ids for p in rows], dtype=torch.long, device=device)
            texts = [tokenizer.decode(p.input_ids) for p in rows]
            batches.append(Batch(input_ids, torch.ones_like(input_ids), texts, needles=rows))
    return batches
