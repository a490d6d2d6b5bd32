"""engine=openai: an OpenAI-compatible server you already run (vLLM, llama.cpp's llama-server,
SGLang, a hosted endpoint), at its base URL. kvpipe starts and stops nothing: it sends the
workload's prompts as token ids to its /completions, streamed, and reads each answer's tokens and
their arrival times from the stream, its prompt tokens served from cache from each response's usage
(`prompt_tokens_details.cached_tokens`, where the server counts them).

What kvpipe cannot read of a server that is not its own is not reported: its peak memory, its KV
cache's bytes, its weights. Its KV settings are what you say you started it with (engine.kv_cache,
in the server's own words, recorded as given and never checked), and whether they keep keys and
values at full precision (engine.lossless: a sweep's and compare's baseline among such runs).
Prompts are built, and streamed text counted, with kvpipe's model= tokenizer: name the model the
server serves (model=hf model.name_or_path=<its folder>, or the embedded model's own)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Optional
from urllib.parse import urlsplit

from kvpipe.engine.base import Engine, ServerPlan
from kvpipe.errors import ConfigError, KvpipeError


def completion_body(model: str, ids: list[int], new_tokens: int, workload_cfg) -> dict:
    """One streamed completion of prompt `ids` in the OpenAI API's words, its usage in a last event;
    greedy as transformers' do_sample=False."""
    body = {
        "model": model,
        "prompt": ids,
        "max_tokens": new_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "seed": workload_cfg.seed,
    }
    if not workload_cfg.do_sample:
        body["temperature"] = 0.0
    return body


def stream_end(chunk: dict) -> tuple[bool, int | None]:
    """Whether an event ends the answer (the last one before [DONE] carries the usage, with
    include_usage), and then the prompt tokens served from cache as the usage counts them (0 where it
    does not), else None."""
    usage = chunk.get("usage")
    if not usage:
        return False, None
    return True, int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


class OpenAI(Engine):
    name = "openai"
    order = 30
    test_overrides: ClassVar[tuple[str, ...]] = ("model=smollm2_135m", "engine.base_url=http://127.0.0.1:8000/v1", "engine.model=kvpipe")  # fmt: skip
    ready_path = "/models"
    completion_path = "/completions"
    reports_kv = False  # its server is not kvpipe's to read
    kv_settings = "the server's own flags, where you start it (engine.kv_cache records them)"
    prefix_setting = "the server's own prefix caching"

    @dataclass
    class Settings:
        base_url: Optional[str] = None  # the API's root, e.g. http://127.0.0.1:8000/v1 (required)
        model: Optional[str] = None  # the model's name in its API, as GET /models lists it (required)
        # the server's KV settings as you started it, in its own words, e.g. "--kv-cache-dtype fp8":
        # recorded as given (the run's label, key and params), never checked
        kv_cache: Optional[str] = None
        lossless: bool = True  # whether that KV cache keeps keys and values at full precision
        api_key_env: Optional[str] = None  # the environment variable holding its API key (never recorded)
        token_ids: bool = False  # ask for each answer's token ids (vLLM's return_token_ids); else counted from its text
        start_timeout_s: float = 30.0  # how long to wait for it to answer GET /models

    unread = ("engine.api_key_env", "engine.start_timeout_s")

    def __init__(self, engine_cfg):
        super().__init__(engine_cfg)
        self.tokenizer = None  # the model's (started): what an answer's streamed text is counted with

    def check(self, spec) -> None:
        s = self.settings
        parts = urlsplit(s.base_url or "")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(
                "engine.base_url", s.base_url, "expected the server's API root, e.g. http://127.0.0.1:8000/v1"
            )
        if not s.model:
            raise ConfigError("engine.model", s.model, "expected the model's name in its API, as GET /models lists it")
        if s.api_key_env and not os.environ.get(s.api_key_env):
            raise ConfigError("engine.api_key_env", s.api_key_env, f"${s.api_key_env} is not set: export it, or leave engine.api_key_env null")  # fmt: skip
        if not s.start_timeout_s > 0:
            raise ConfigError("engine.start_timeout_s", s.start_timeout_s, "expected seconds above 0")
        self.check_served_workload(spec)

    def model_file(self, model_cfg) -> Path | None:
        return None  # the server's files are its own

    def missing(self) -> str | None:
        """Nothing to build: why no job can run now is that nothing answers at its base URL."""
        try:
            status, _ = self.server_for(None, None).get(self.ready_path, timeout_s=2)
        except OSError as exc:
            return f"nothing answers at engine.base_url={self.settings.base_url} ({exc})"
        return None if status == 200 else f"the server at engine.base_url={self.settings.base_url} answered {status}"

    def server_for(self, plan: ServerPlan, log_path: Path):
        from kvpipe.engine.lifecycle.remote import RemoteServer

        s = self.settings
        key = os.environ.get(s.api_key_env) if s.api_key_env else None
        return RemoteServer(self.name, s.base_url, self.ready_path, s.start_timeout_s, key)

    def weights_bytes(self, plan: ServerPlan) -> int | None:
        return None

    def kv_of(self, server) -> dict[str, float]:
        """Nothing measured; but the model it names must be one the server serves."""
        import json

        _, text = server.get(self.ready_path)
        try:
            served = [entry.get("id") for entry in json.loads(text).get("data") or ()]
        except (ValueError, AttributeError):
            served = []
        if served and self.settings.model not in served:
            raise KvpipeError(
                f"engine.model={self.settings.model} is not served at {self.settings.base_url}: it serves "
                f"{', '.join(map(str, served))}"
            )
        return {}

    def started(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def request(self, ids: list[int], new_tokens: int, workload_cfg) -> dict:
        body = completion_body(self.settings.model, ids, new_tokens, workload_cfg)
        if workload_cfg.ignore_eos:
            body["ignore_eos"] = True  # vLLM's and llama.cpp's, beside the OpenAI API's own
        if self.settings.token_ids:
            body["return_token_ids"] = True
        return body

    def streamed(self, chunk: dict) -> tuple[list[int], bool, int | None]:
        tokens = []
        for choice in chunk.get("choices") or ():
            if choice.get("token_ids") is not None:
                tokens += [int(t) for t in choice["token_ids"]]
            elif choice.get("text"):  # one piece of the answer's text: its tokens, as the model's tokenizer reads it
                tokens += self.tokenizer.encode(choice["text"], add_special_tokens=False)
        return tokens, *stream_end(chunk)

    def untold(self, last_chunk: dict, counted: int) -> list[int]:
        """Where the usage counts more answer tokens than its text pieces held (the end-of-sequence
        token has no text; a server writes out a character split over tokens with its last one), the
        rest as end-of-sequence tokens: its stop, as transformers' and llama.cpp's answers count it."""
        told = int((last_chunk.get("usage") or {}).get("completion_tokens") or 0)
        return [self.tokenizer.eos_token_id] * max(0, told - counted)

    def use_words(self, plan: ServerPlan | None = None) -> str:
        s = self.settings
        return f"the server at {s.base_url} serving {s.model}, started with {s.kv_cache or 'its own KV settings'}"

    def notes(self) -> list[str]:
        s = self.settings
        declared = (
            f"its KV settings as given: {s.kv_cache}" if s.kv_cache else "its KV settings not given (engine.kv_cache)"
        )
        return [
            f"engine=openai: a server kvpipe did not start ({s.base_url}): its peak memory, KV bytes and weights "
            f"are not measured; {declared}, {'full' if s.lossless else 'reduced'} precision as engine.lossless says"
        ]

    def lossless(self) -> bool:
        return bool(self.settings.lossless)

    def label(self) -> str:
        return f"openai {self.settings.kv_cache or self.settings.model}"
