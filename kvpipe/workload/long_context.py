"""workload=long_context: prompts of exactly `prompt_tokens` tokens of plain text cut from Python's
own documentation, BOS included where the tokenizer adds one; no template, no instruction: the
model continues the text."""

from __future__ import annotations

from dataclasses import dataclass

from kvpipe.errors import ConfigError
from kvpipe.workload._encoding import default_prefix
from kvpipe.workload._texts import long_context_ids
from kvpipe.workload.base import Batch, Window, Workload

ROW_STRIDE = 7919  # tokens between the starts of two rows (or quality windows): each its own text


class LongContext(Workload):
    name = "long_context"
    order = 20
    context_fields = ("prompt_tokens",)

    @dataclass
    class Settings:
        prompt_tokens: int = 1000  # tokens per prompt, BOS included

    def check(self) -> dict:
        if self.settings.prompt_tokens <= 0:
            raise ConfigError("workload.prompt_tokens", self.settings.prompt_tokens, "expected a positive integer")
        return super().check()

    def size_label(self) -> str:
        return f"{self.settings.prompt_tokens}+{self.common.max_new_tokens}"

    def longest_prompt_from_config(self) -> int:
        return self.settings.prompt_tokens

    def too_long(self, prompt_tokens, new_tokens, positions):
        return "workload.prompt_tokens", self.settings.prompt_tokens, f"at most {positions - new_tokens}"

    def text_ids(self, tokenizer, tokens: int, offset: int) -> list[int]:
        """The tokenizer's default prefix, then text: `tokens` ids in all."""
        prefix = default_prefix(tokenizer)
        return prefix + long_context_ids(tokenizer, tokens - len(prefix), offset=offset)

    def batches(self, tokenizer, device: str) -> list[Batch]:
        import torch

        # Each row starts at a different place in the text, so a batch is not B copies of one prompt.
        rows = [
            self.text_ids(tokenizer, self.settings.prompt_tokens, i * ROW_STRIDE) for i in range(self.common.batch_size)
        ]
        input_ids = torch.tensor(rows, dtype=torch.long, device=device)
        return [Batch(input_ids, torch.ones_like(input_ids), [tokenizer.decode(row) for row in rows])]

    def windows(self, tokenizer, count: int, scored_tokens: int) -> list[Window]:
        """`count` windows of its own text at its own prompt length, each followed by `scored_tokens`
        tokens of that text."""
        length = self.settings.prompt_tokens
        windows = []
        for index in range(count):
            ids = self.text_ids(tokenizer, length + scored_tokens, index * ROW_STRIDE)
            windows.append(Window(ids[:length], ids[length:]))
        return windows

    def dataset_input(self, tags):
        return f"{self.name} prompts ({self.settings.prompt_tokens} tokens)", None
