"""What an engine is: one class per way of generating, registered by subclassing. The default,
transformers, runs in kvpipe's own process and builds kvpipe's caches (kvpipe.cache); any other is a
server of its own (kvpipe.engine.lifecycle.server; or, engine=openai, one the user runs:
kvpipe.engine.lifecycle.remote) whose KV cache is the engine's, chosen by its own settings
(engine.*), and whose answers come back over HTTP. An engine says how to start its server for a
job, what it refuses before anything starts, what its own reports say of its KV cache, and how a
user would start the same server (its `use:` line)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from kvpipe.errors import ConfigError, KvpipeError
from kvpipe.registry import Registered, Registry


@dataclass
class NoSettings:
    """An engine that reads no engine.* field beyond its name."""


@dataclass(frozen=True)
class ServerPlan:
    """What one job's server is started for: the model file, how many requests it holds at once
    (its slots), the tokens each may hold (prompt and answer), and the CPU threads it may use."""

    model_file: Path | None  # None: a server the user runs, whose files kvpipe does not read
    slots: int
    context_tokens: int
    threads: int


class Engine(Registered):
    """Base class: subclass it with `name`, its `Settings`, and, for a server, `command`,
    `kv_report` and `use_words`."""

    registry: ClassVar[Registry[Engine]] = Registry("engine.name")
    Settings: ClassVar[type] = NoSettings
    in_process: ClassVar[bool] = False  # transformers: kvpipe's own process generates, with kvpipe's caches
    ready_path: ClassVar[str] = "/health"  # answers 200 once the server has loaded its model
    completion_path: ClassVar[str] = "/completion"  # where a request's body (request()) is posted, streamed
    kv_settings: ClassVar[str] = ""  # the engine.* settings that choose its KV cache, as a refusal names them
    prefix_setting: ClassVar[str] = ""  # the engine.* setting that reuses a prompt's cached prefix (`=true`)
    # engine.* settings its server does not compute with (where its program is, how long it may take to
    # start): neither keyed nor logged
    unread: ClassVar[tuple[str, ...]] = ()
    reports_kv: ClassVar[bool] = True  # its server says what its KV cache holds (kv_of): a job without it fails

    def __init__(self, engine_cfg):
        self.config = engine_cfg
        self.settings = self.Settings(
            **{f.name: getattr(engine_cfg, f.name) for f in dataclasses.fields(self.Settings)}
        )

    @classmethod
    def resolved(cls, engine_cfg):
        """Its config as what it means (a setting that stands for others replaced by them)."""
        return engine_cfg

    def read_fields(self) -> tuple[str, ...]:
        """The engine.* fields its measurement depends on (its key, its params): all but `unread`."""
        fields = ("engine.name", *(f"engine.{f.name}" for f in dataclasses.fields(self.Settings)))
        return tuple(field for field in fields if field not in self.unread)

    @classmethod
    def mapped_cache(cls, cache_cfg, backend_cfg) -> dict[str, object] | None:
        """The engine settings that mean what kvpipe's cache choice means (cache=quantized backend=fp8:
        vLLM's engine.kv_cache_dtype=fp8), or None where none does: that choice is refused."""
        return None

    maps: ClassVar[str] = ""  # kvpipe's cache choices that mapped_cache takes, as a refusal names them

    def check(self, spec) -> None:
        """What the engine refuses of a job, from its settings alone, before anything starts: a
        one-line ConfigError naming the field and what would work (kvpipe's own caches and presses
        are refused by kvpipe.jobspec, which knows them)."""

    def check_served_workload(self, spec) -> None:
        """A server of requests refuses what only kvpipe's own process serves: many questions after
        one read context, and a session's cache kept in kvpipe between its turns (an engine keeps a
        session's history its own way, by its prefix or prompt caching)."""
        if spec.bound_workload.questions_after_context:
            raise ConfigError(
                "workload", spec.workload.kind,
                f"engine={self.name} serves whole prompts; a workload that answers many questions from one read "
                "context runs on engine=transformers",
            )  # fmt: skip
        if spec.bound_workload.keeps_session_cache:
            raise ConfigError(
                "workload.keep_session_cache", True,
                f"engine={self.name} keeps a session's history in its own cache: expected false, and "
                f"{self.prefix_setting} to reuse it",
            )  # fmt: skip

    def model_file(self, model_cfg) -> Path:
        """The file its server loads for `model_cfg`."""
        raise NotImplementedError

    def server_binary(self) -> Path:
        """The server's program, found or refused with the command that builds it."""
        raise NotImplementedError

    def given_program(self, field: str, env: str, what: str) -> Path | None:
        """The program the user names for the server, by engine.<field> or else $<env>, refused in one
        line where it is not an executable file (`what` says what it should be); None where neither names one."""
        setting = getattr(self.settings, field)
        given = setting or os.environ.get(env)
        if not given:
            return None
        path = Path(given).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise KvpipeError(f"{f'engine.{field}' if setting else f'${env}'}={given} is not {what}")
        return path

    def command(self, plan: ServerPlan, port: int) -> list[str]:
        """The server's command line for a job (`plan`) on a loopback port."""
        raise NotImplementedError

    def request(self, ids: list[int], new_tokens: int, workload_cfg) -> dict:
        """The JSON body of one streamed completion of prompt `ids`."""
        raise NotImplementedError

    def environment(self, plan: ServerPlan) -> dict[str, str]:
        """What its server's environment adds to kvpipe's (settings an engine reads only from there)."""
        return {}

    def streamed(self, chunk: dict) -> tuple[list[int], bool, int | None]:
        """One server-sent event of a streamed answer, as JSON: the token ids it brings, whether the
        answer is over, and the prompt tokens served from cache where the event says so (else None)."""
        raise NotImplementedError

    def server_for(self, plan: ServerPlan, log_path: Path):
        """The server a job sends its requests to, not yet started: by default one kvpipe starts for
        the job on a loopback port and stops after it (kvpipe.engine.lifecycle.server)."""
        from kvpipe.engine.lifecycle.server import EngineServer

        return EngineServer(
            self.name, lambda port: self.command(plan, port), log_path, self.ready_path,
            self.settings.start_timeout_s, self.environment(plan),
        )  # fmt: skip

    def weights_bytes(self, plan: ServerPlan) -> int | None:
        """The bytes of the weights its server loads: its model file's, or a folder's weight files."""
        path = plan.model_file
        if not path.is_dir():
            return path.stat().st_size
        return sum(f.stat().st_size for pattern in ("*.safetensors", "*.bin") for f in path.glob(pattern))

    def started(self, tokenizer) -> None:
        """What it learns once its server answers: the model's tokenizer (an engine whose answers
        stream as text counts their tokens with it)."""

    def untold(self, last_chunk: dict, counted: int) -> list[int]:
        """The tokens an answer's last event says it had beyond the `counted` ones its events brought
        (a stream of text carries none for the end-of-sequence token); none by default."""
        return []

    def kv_report(self, log_text: str) -> dict[str, float]:
        """What the server's own log says of its KV cache (bytes, bytes per token, cells)."""
        return {}

    def kv_of(self, server) -> dict[str, float]:
        """What the running server (kvpipe.engine.lifecycle.server.EngineServer) reports of its KV
        cache: by default its log's words (kv_report)."""
        return self.kv_report(server.log_text())

    def use_words(self, plan: ServerPlan | None = None) -> str:
        """How a user starts the same server, in the engine's own words."""
        raise NotImplementedError

    def lossless(self) -> bool:
        """Whether its KV cache keeps keys and values at full precision: a sweep's and compare's
        baseline among this engine's runs, as the dynamic cache is among transformers'."""
        return True

    def missing(self) -> str | None:
        """Why its server cannot start on this machine (not built), or None."""
        try:
            self.server_binary()
        except Exception as exc:  # noqa: BLE001 - a KvpipeError saying how to build it
            return str(exc)
        return None

    def notes(self) -> list[str]:
        """What a run through it should say of its figures (what it could not measure, and why)."""
        return []

    def label(self) -> str:
        """How tables and titles name its KV choice (`llama_cpp q8_0/q8_0`)."""
        return self.name


registered = Engine.registry.registered
names = Engine.registry.names
get = Engine.registry.get  # raises a one-line ConfigError naming the registered ones
