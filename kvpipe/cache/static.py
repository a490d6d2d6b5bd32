"""cache=static: StaticCache preallocated for max_cache_len, optionally under torch.compile."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from kvpipe.cache.accounting import static_bytes
from kvpipe.cache.base import CacheSetup, CacheStrategy
from kvpipe.errors import ConfigError


class Static(CacheStrategy):
    name = "static"
    family = "static"
    order = 20
    in_label = ("cache.compile",)
    search_variants = ({}, {"cache.compile": "true"})

    @dataclass
    class Settings:
        max_cache_len: Optional[int] = None  # default: longest prompt + workload.max_new_tokens
        compile: bool = False  # torch.compile the decode step (CUDA graphs on GPU, inductor on CPU)

    @classmethod
    def refusal(cls, setting: str) -> str | None:
        if setting == "compile":
            return "torch.compile is offered with cache=static only; expected cache=static or cache.compile=false"
        return None

    def check(self, overridden=frozenset()) -> list[str]:
        if self.settings.max_cache_len is not None and self.settings.max_cache_len <= 0:
            raise ConfigError("cache.max_cache_len", self.settings.max_cache_len, "expected a positive integer or null")
        return super().check(overridden)

    def check_for_model(self, shape, prompt_tokens: int) -> None:
        super().check_for_model(shape, prompt_tokens)
        new_tokens = self.choice.max_new_tokens
        total = prompt_tokens + new_tokens
        if self.settings.max_cache_len is not None and self.settings.max_cache_len < total:
            raise ConfigError(
                "cache.max_cache_len",
                self.settings.max_cache_len,
                f"expected at least prompt + workload.max_new_tokens = {prompt_tokens} + {new_tokens} = {total}",
            )

    def max_cache_len(self, prompt_tokens: int) -> int:
        return self.settings.max_cache_len or prompt_tokens + self.choice.max_new_tokens

    def build(self, loaded, longest_prompt: int) -> CacheSetup:
        """Sized once for the longest prompt, so every call of a job (and of later jobs with the same
        size) shares one shape: torch.compile then compiles once."""
        from transformers import StaticCache

        max_cache_len = self.max_cache_len(longest_prompt)

        def make(capacity: int = 0):
            return StaticCache(
                config=loaded.model.config,
                max_cache_len=max(max_cache_len, capacity),
                **self.offloading_kwargs(),
            )

        kwargs: dict = {}
        if self.settings.compile:
            kwargs["compile_config"] = _compile_config(loaded.device)
        else:
            kwargs["disable_compile"] = True  # eager static stays eager on CUDA too, so the two can be compared
        return CacheSetup(requested=self.name, effective=self.label(), make_cache=make, generate_kwargs=kwargs)

    def label(self) -> str:
        return self.name + ("+compile" if self.settings.compile else "")

    def predict_kv_bytes(self, kv, prompt_tokens: int, new_tokens: int) -> int:
        return static_bytes(kv, max(self.max_cache_len(prompt_tokens), prompt_tokens + new_tokens))


def _compile_config(device: str):
    from transformers import CompileConfig

    # CUDA graphs pay off on GPU only; transformers compiles on CUDA by itself, elsewhere on request.
    config = CompileConfig(mode="reduce-overhead" if device == "cuda" else "default")
    # Private, and the only switch transformers offers for compiling off CUDA (generate() checks it);
    # kept here, in one place, so a rename upstream breaks one line.
    config._compile_all_devices = True
    return config
