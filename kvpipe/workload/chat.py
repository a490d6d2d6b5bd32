"""workload=chat: a few bundled prompts (or the user's, `workload.prompts`), each a user turn through
the model's chat template."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

from kvpipe.errors import ConfigError
from kvpipe.workload.base import Batch, Window, Workload, padded_batch


class Chat(Workload):
    name = "chat"
    order = 10
    chat_style = True
    context_fields = ("prompts",)

    @dataclass
    class Settings:
        prompts: List[str] = field(default_factory=list)

    def check(self) -> dict:
        if not self.settings.prompts:
            raise ConfigError("workload.prompts", [], "expected at least one prompt for workload=chat")
        return super().check()

    def prompt_ids(self, tokenizer) -> list[list[int]]:
        return [self.chat_ids(tokenizer, [{"role": "user", "content": p}]) for p in self.settings.prompts]

    def batches(self, tokenizer, device: str) -> list[Batch]:
        """Prompts cycled so that every batch is full: a short last batch would change the shapes."""
        prompts = self.prompt_ids(tokenizer)
        size = self.common.batch_size
        count = -(-len(prompts) // size) * size
        prompts = [prompts[i % len(prompts)] for i in range(count)]
        return [padded_batch(tokenizer, prompts[start : start + size], device) for start in range(0, count, size)]

    def windows(self, tokenizer, count: int, scored_tokens: int) -> list[Window]:
        """Its first `count` prompts as the model sees them; the reference writes what follows."""
        return [Window(ids, None) for ids in self.prompt_ids(tokenizer)[:count]]
