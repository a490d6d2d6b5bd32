"""engine=llama_cpp: llama.cpp's own server (`llama-server`), started by kvpipe for each job on
the model's GGUF file, with its KV cache types for keys and values set apart (engine.cache_type_k,
engine.cache_type_v: f16, q8_0, q4_0...; a quantized V needs flash attention), prompt caching on
or off (engine.cache_prompt), and every request sent as token ids to its native /completion
endpoint, streamed, so that each answer's tokens and their arrival times come back as generated.

The server is built from llama.cpp's source as pinned by `llama-cpp-python` (LLAMA_CPP_PYTHON) on the
package index, once per machine: `make engines` (kvpipe.engine.lifecycle.build). Its KV bytes are what its own
log reports (`llama_kv_cache: size = ... MiB`), to its two decimals of a MiB."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar, Optional

from kvpipe.disk_cache import cache_dir
from kvpipe.engine.base import Engine, ServerPlan
from kvpipe.errors import ConfigError, KvpipeError, choices

# The llama.cpp source kvpipe builds its server from: llama-cpp-python's sdist vendors llama.cpp at a
# pinned commit (0c1e570 for 0.3.36)
LLAMA_CPP_PYTHON = "0.3.36"
# llama.cpp's KV cache types (common/arg.cpp's kv_cache_types)
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
UNQUANTIZED = ("f32", "f16", "bf16")
FLASH_ATTN = ("on", "off", "auto")
# Where a user or CI points kvpipe at a llama-server of their own
SERVER_ENV = "KVPIPE_LLAMA_SERVER"
KV_LINE = re.compile(
    r"llama_kv_cache(?:_\w+)?: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers, +(\d+)/(\d+) seqs\), "
    r"K \((\w+)\): +([\d.]+) MiB, V \((\w+)\): +([\d.]+) MiB"
)
MIB = 1024 * 1024


def built_server() -> Path:
    """Where `make engines` leaves the server it builds."""
    return cache_dir() / "engines" / f"llama_cpp-{LLAMA_CPP_PYTHON}" / "llama-server"


class LlamaCpp(Engine):
    name = "llama_cpp"
    order = 10
    test_overrides: ClassVar[tuple[str, ...]] = ("model=smollm2_135m",)
    prefix_setting = "engine.cache_prompt=true"
    kv_settings = f"engine.cache_type_k and engine.cache_type_v ({', '.join(CACHE_TYPES)})"

    @dataclass
    class Settings:
        cache_type: Optional[str] = None  # keys and values alike (-ctk and -ctv); null: each its own below
        cache_type_k: str = "f16"  # the keys' type in llama.cpp's KV cache (-ctk)
        cache_type_v: str = "f16"  # the values' (-ctv); a quantized one needs flash attention
        flash_attn: str = "auto"  # -fa on|off|auto
        # reuse a slot's cached prompt prefix across requests (llama.cpp's default is on; off here so
        # that every request's prompt is computed, as kvpipe's own caches compute it)
        cache_prompt: bool = False
        server: Optional[str] = None  # the llama-server program; null: $KVPIPE_LLAMA_SERVER, make engines' build, PATH
        start_timeout_s: float = 180.0  # how long the server may take to load the model and answer /health

    # not what its server computes with: where its program is, how long it may take to start, and
    # cache_type, which resolved() has made both types
    unread = ("engine.cache_type", "engine.server", "engine.start_timeout_s")

    @classmethod
    def resolved(cls, engine_cfg):
        """engine.cache_type=q8_0 as what it means, -ctk q8_0 -ctv q8_0: the spec, its key and its params say so."""
        if engine_cfg.cache_type is None:
            return engine_cfg
        return replace(
            engine_cfg, cache_type_k=engine_cfg.cache_type, cache_type_v=engine_cfg.cache_type, cache_type=None
        )

    def check(self, spec) -> None:
        s = self.settings
        for key in ("cache_type_k", "cache_type_v"):
            if getattr(s, key) not in CACHE_TYPES:
                raise ConfigError(f"engine.{key}", getattr(s, key), choices(CACHE_TYPES, given=getattr(s, key)))
        if s.flash_attn not in FLASH_ATTN:
            raise ConfigError("engine.flash_attn", s.flash_attn, choices(FLASH_ATTN, given=s.flash_attn))
        if s.cache_type_v not in UNQUANTIZED and s.flash_attn == "off":
            raise ConfigError(
                "engine.flash_attn", "off",
                f"llama.cpp keeps a quantized V cache (engine.cache_type_v={s.cache_type_v}) only with flash "
                "attention: engine.flash_attn=on or auto",
            )  # fmt: skip
        if not s.start_timeout_s > 0:
            raise ConfigError("engine.start_timeout_s", s.start_timeout_s, "expected seconds above 0")
        self.check_served_workload(spec)
        if spec.model.source != "embedded":
            raise ConfigError(
                "model", spec.model.name,
                "engine=llama_cpp serves a GGUF file, which kvpipe has for the embedded model: model=smollm2_135m",
            )  # fmt: skip

    def model_file(self, model_cfg) -> Path:
        from kvpipe.model.embedded import embedded_gguf

        return embedded_gguf()

    def server_binary(self) -> Path:
        given = self.given_program("server", SERVER_ENV, "an executable llama-server")
        if given:
            return given
        for path in (built_server(), shutil.which("llama-server")):
            if path and Path(path).is_file():
                return Path(path)
        raise KvpipeError(
            "engine=llama_cpp needs llama.cpp's server, which is not built on this machine: run `make engines` "
            "(builds it once, ~8 min on 2 cores), or set engine.server=/path/to/llama-server"
        )

    def command(self, plan: ServerPlan, port: int) -> list[str]:
        s = self.settings
        words = [
            str(self.server_binary()), "-m", str(plan.model_file), "--host", "127.0.0.1", "--port", str(port),
            "-c", str(plan.slots * plan.context_tokens), "-np", str(plan.slots), "--no-kv-unified",
            "-t", str(plan.threads), "-tb", str(plan.threads),
            "-ctk", s.cache_type_k, "-ctv", s.cache_type_v, "-fa", s.flash_attn,
            "--metrics", "--no-webui",
            "-lv", "4",  # its KV cache's size line is logged at this level (info shows the server's alone)
        ]  # fmt: skip
        if not s.cache_prompt:
            words += ["--cache-ram", "0"]  # nor across slots: no prompt kept in RAM between requests
        return words

    def request(self, ids: list[int], new_tokens: int, workload_cfg) -> dict:
        body = {
            "prompt": ids,
            "n_predict": new_tokens,
            "stream": True,
            "return_tokens": True,
            "cache_prompt": self.settings.cache_prompt,
            "ignore_eos": bool(workload_cfg.ignore_eos),
            "seed": workload_cfg.seed,
        }
        if not workload_cfg.do_sample:
            body.update(temperature=0.0, top_k=1)  # greedy, as transformers' do_sample=False
        return body

    def streamed(self, chunk: dict) -> tuple[list[int], bool, int | None]:
        done = bool(chunk.get("stop"))
        cached = int((chunk.get("timings") or {}).get("cache_n", 0)) if done else None
        return [int(token) for token in chunk.get("tokens") or ()], done, cached

    def kv_report(self, log_text: str) -> dict[str, float]:
        """Its KV caches as its log reports them (a model with sliding-window layers reports two)."""
        found = KV_LINE.findall(log_text)
        if not found:
            return {}
        size = sum(float(line[0]) for line in found) * MIB
        cells = max(int(line[1]) for line in found)
        return {"kv_cache_bytes": round(size), "kv_cells": float(cells), "kv_bytes_per_token": size / cells}

    def use_words(self, plan: ServerPlan | None = None) -> str:
        s = self.settings
        words = ["llama-server", "-m", str(plan.model_file) if plan else "MODEL.gguf"]
        if plan:
            words += ["-c", str(plan.slots * plan.context_tokens), "-np", str(plan.slots)]
        words += ["-ctk", s.cache_type_k, "-ctv", s.cache_type_v, "-fa", s.flash_attn]
        if not s.cache_prompt:
            words += ["--cache-ram", "0"]
        return " ".join(words)

    def lossless(self) -> bool:
        return self.settings.cache_type_k in UNQUANTIZED and self.settings.cache_type_v in UNQUANTIZED

    def label(self) -> str:
        s = self.settings
        kv = s.cache_type_k if s.cache_type_k == s.cache_type_v else f"{s.cache_type_k}/{s.cache_type_v}"
        return f"llama_cpp {kv}" + (" prefix" if s.cache_prompt else "")
