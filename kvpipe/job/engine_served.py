"""A job served by an engine's own server (engine=llama_cpp, vllm): kvpipe starts the server for the
job (kvpipe.engine.lifecycle.server), or reaches one the user runs (engine=openai,
kvpipe.engine.lifecycle.remote), sends the workload's prompts to it as token ids over HTTP, as the load picks
and times them, and reads each answer's tokens as they stream back: when each arrived is its TTFT and
inter-token gaps, as a client of that server would see them. Everything above the engine is a served
job's (kvpipe.job.served): the load, the figures, the workload's scoring of every answer.

What the engine reports of itself is read from the engine: its KV cache's bytes, its prompt tokens
served from cache (each request's own count), and its process's peak memory. A job without a load
serves one request at a time (load=concurrency with 1 in flight), which is what a batch job of one
prompt a call measures."""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from kvpipe import load as loads
from kvpipe import model
from kvpipe.engine import get as engine_class
from kvpipe.engine.base import ServerPlan
from kvpipe.errors import KvpipeError
from kvpipe.job.served import ServedJob
from kvpipe.job.served_sessions import SessionsJob
from kvpipe.job.servers import POLL_S, Outcome
from kvpipe.job.threads import threads_for
from kvpipe.jobspec import schema
from kvpipe.measure import contention
from kvpipe.measure.memory import peak_of, reset_peak_of
from kvpipe.measure.request_figures import Served

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 600.0  # one request's longest wait for its server's next line


@dataclass
class EngineAnswer:
    """One streamed answer: its tokens, when each arrived, and its prompt tokens served from cache."""

    sent_s: float
    token_s: list[float]
    tokens: list[int]
    finished_s: float
    cached_tokens: int


@dataclass
class ServerPeak:
    """The server's peak resident memory over a block, a round (Linux's VmHWM, reset as it starts):
    PeakMemory's figures, for the processes that hold the cache. A server of several processes (vLLM:
    its API server, engine core and worker) counts each one's peak: their sum bounds the peak of
    the whole from above, as their peaks need not coincide."""

    pids: list[int]
    peak_bytes: int | None = None  # None: no process of the server is kvpipe's to read (engine=openai)
    baseline_bytes: int = 0
    source: str = "not measured: the server's processes are not kvpipe's"

    def __post_init__(self):
        if self.pids:
            self.source = "engine server's VmHWM"
        if len(self.pids) > 1:
            self.source = f"engine server's VmHWM, summed over its {len(self.pids)} processes"

    @property
    def peak_over_baseline_bytes(self) -> int | None:
        return None if self.peak_bytes is None else max(0, self.peak_bytes - self.baseline_bytes)

    def __enter__(self) -> ServerPeak:
        self.baseline_bytes = sum(reset_peak_of(pid) for pid in self.pids)
        return self

    def __exit__(self, *exc) -> None:
        if self.pids:
            self.peak_bytes = sum(peak_of(pid) for pid in self.pids)


class EngineJob(ServedJob):
    """Its requests served by its engine's server, started in prepare() and stopped by close()."""

    def __init__(self, spec):
        super().__init__(spec)
        self.engine = engine_class(spec.engine.name)(spec.engine)
        if self.load is None:  # one request at a time: a batch job's one prompt a call
            option = schema.option_schema(loads.get("concurrency"))
            self.load = loads.get("concurrency")(option(concurrency=1))
        self.server = None  # its EngineServer, or the RemoteServer of a server the user runs
        self.adopted: list[int] = []  # that server's processes, where they run on this machine
        self.plan_used: ServerPlan | None = None  # what its server was started for (load_model)
        self.kv: dict[str, float] = {}

    def loads_anew(self) -> bool:
        return True  # every job starts its own server, which loads the model

    @property
    def cache_names(self) -> tuple[str, str]:
        return self.engine.label(), self.engine.label()  # its KV cache is the engine's: llama_cpp q8_0

    @property
    def compare_baseline(self) -> bool:
        return self.engine.lossless()  # its engine's full-precision KV cache, as dynamic is transformers'

    @property
    def quality_refusal(self) -> str:
        return f"engine={self.engine.name} keeps its KV cache inside its server, where the quality pass cannot score it: no quality pass"

    def load_model(self):
        """The tokenizer and generation config from the model's folder; the weights load in the server."""
        spec = self.spec
        self.plan_used = plan = self.server_plan()
        self.server = self.engine.server_for(plan, self.server_log())
        self.server.start()
        # a server the user runs on this machine works for the job: its CPU is not a neighbour's
        self.adopted = self.server.local_pids()
        contention.adopt(self.adopted)
        self.kv = self.engine.kv_of(self.server)
        if self.engine.reports_kv and "kv_cache_bytes" not in self.kv:
            raise KvpipeError(f"{self.engine.name}'s server reported no KV cache size in {self.server.log_path}")
        from kvpipe.model.shape import config_dict

        config = config_dict(spec.model)[0]  # the architecture it records, from the model's config.json
        generation = model.generation_config(spec.model)
        tokenizer = model.load_tokenizer(spec.model)
        self.engine.started(tokenizer)
        served = f"weights of {plan.model_file.name}" if plan.model_file else f"served at {self.server.base_url}"
        return SimpleNamespace(
            tokenizer=tokenizer, shape=model.read_shape(spec.model),
            model=SimpleNamespace(generation_config=generation, config=SimpleNamespace(to_dict=lambda: config)),
            device="cpu", dtype=f"{self.engine.name} ({served})",
            weights_bytes=self.engine.weights_bytes(plan), load_s=self.server.start_s or 0.0,
        )  # fmt: skip

    def server_plan(self) -> ServerPlan:
        spec = self.spec
        return ServerPlan(self.engine.model_file(spec.model), self.cap, self.longest_request(), threads_for(spec.model))

    def longest_request(self) -> int:
        """The most tokens one request holds in a slot: its prompt and its answer."""
        return max(len(request.ids) + request.new_tokens for request in self.requests)

    def server_log(self) -> Path:
        """Beside the run: in the job's output folder where Hydra made one, else a new temporary folder."""
        import tempfile

        from hydra.core.hydra_config import HydraConfig
        from omegaconf import OmegaConf

        # a job Hydra runs has its folder; a config composed without running one (a test, the API) has none
        hydra = HydraConfig.get() if HydraConfig.initialized() else None
        run_dir = OmegaConf.select(hydra, "runtime.output_dir", throw_on_missing=False) if hydra else None
        folder = Path(run_dir) if run_dir else Path(tempfile.mkdtemp(prefix="kvpipe-engine-"))
        return folder / f"{self.engine.name}-server.log"

    def warm_up(self, longest_prompt: int) -> None:
        self.setup = None  # the server keeps its own cache
        self.warm_up_requests()

    def peak_meter(self) -> ServerPeak:
        return ServerPeak(self.server.server_pids())  # the server holds the cache, not kvpipe's process

    def _serve(self, queue, cap: int, kept=None, stop=None) -> Outcome:
        kv_bytes = int(self.kv["kv_cache_bytes"]) if "kv_cache_bytes" in self.kv else None
        return serve_over_http(self.engine, self.server, self.spec.workload, queue, cap, kv_bytes, stop)

    def summary(self):
        metrics, notes, tags = super().summary()
        hits = [o.prefix_hit_tokens for o in self.passes]
        prompt_tokens = sum(self.prompt_tokens()) * len(self.passes)
        metrics["prefix_hit_tokens"] = float(sum(hits))
        metrics["prefix_hit_rate"] = sum(hits) / prompt_tokens if prompt_tokens else 0.0
        metrics.update({name: self.kv[name] for name in ("kv_bytes_per_token", "kv_cells") if name in self.kv})
        if self.server.start_s is not None:  # a server kvpipe started
            metrics["server_start_ms"] = self.server.start_s * 1e3
        tags.update(engine=self.engine.name, engine_command=self.engine.use_words(self.plan_used),
                    engine_lossless=str(self.engine.lossless()).lower())  # fmt: skip
        if self.server.log_path is not None:
            tags["engine_log"] = str(self.server.log_path)
        notes += self.engine.notes()
        return metrics, notes, tags

    def close(self) -> None:
        contention.release(self.adopted)
        if self.server is not None:
            self.server.stop()


class EngineSessionsJob(EngineJob, SessionsJob):
    """A workload in sessions (workload=conversation) through an engine's server: each turn re-sends
    the session's history as one request, which the engine's prefix or prompt caching may serve
    from its cache (prefix_hit_rate)."""

    def longest_request(self) -> int:
        return self.longest_turn + self.spec.workload.max_new_tokens  # a later turn holds the history


def serve_over_http(engine, server, workload_cfg, queue, cap: int, kv_bytes: int | None, stop=None) -> Outcome:
    """Requests sent to the server as they arrive (from `queue`: kvpipe.job.arrivals; at most `cap` in
    flight, each on a client thread of its own), answers taken as they finish. `stop(answered)`: why
    to send no more requests (the pass has missed its targets whatever the rest do); those in flight
    are answered, as kvpipe's own servers do."""
    served: dict[int, Served] = {}
    hits, most, stopped = 0, 0, ""
    start = time.perf_counter()
    queue.begin(start)
    with ThreadPoolExecutor(max_workers=cap, thread_name_prefix="engine-client") as clients:
        in_flight = {}
        while len(served) < queue.total and not (stopped and not in_flight):
            for arrival in [] if stopped else queue.take(time.perf_counter(), cap - len(in_flight)):
                body = engine.request(arrival.request.ids, arrival.request.new_tokens, workload_cfg)
                in_flight[clients.submit(stream_completion, engine, server, body)] = arrival
            most = max(most, len(in_flight))
            timeout, due = POLL_S, None if stopped else queue.next_s()
            if due is not None and len(in_flight) < cap:
                timeout = min(POLL_S, max(due - time.perf_counter(), 0.001))
            done, _ = wait(in_flight, timeout=timeout, return_when=FIRST_COMPLETED)
            for future in done:
                arrival = in_flight.pop(future)
                answer = future.result()  # a failed request fails the round, with the server's words
                served[arrival.index] = Served(
                    arrival_s=arrival.arrival_s, started_s=answer.sent_s, token_s=answer.token_s,
                    finished_s=answer.finished_s, prompt_tokens=len(arrival.request.ids), tokens=answer.tokens,
                    prefix_hit_tokens=answer.cached_tokens,
                )  # fmt: skip
                hits += answer.cached_tokens
                queue.answered(arrival.index, answer.finished_s, answer.tokens)
            if stop is not None and not stopped and queue.untaken:
                stopped = stop(served.values()) or ""
    return Outcome([served[i] for i in sorted(served)], most, kv_bytes, None, hits, stopped=stopped)


def stream_completion(engine, server, body: dict) -> EngineAnswer:
    """One completion, streamed (server-sent events, read by `engine.streamed`): each token's arrival
    time as this client saw it."""
    connection = server.connection(REQUEST_TIMEOUT_S)
    headers = {"Content-Type": "application/json", **server.headers}
    try:
        sent = time.perf_counter()
        connection.request("POST", server.path(engine.completion_path), json.dumps(body), headers)
        response = connection.getresponse()
        if response.status != 200:
            raise KvpipeError(f"the engine's server refused a request ({response.status}): {response.read()[:300]!r}")
        token_s, tokens, cached = [], [], 0
        for line in response:
            if not line.startswith(b"data: "):
                continue
            if line[6:].strip() == b"[DONE]":  # the OpenAI stream's end
                break
            chunk = json.loads(line[6:])
            brought, done, counted = engine.streamed(chunk)
            now = time.perf_counter()
            tokens += brought
            token_s += [now] * len(brought)
            cached = counted if counted is not None else cached
            if done:
                untold = engine.untold(chunk, len(tokens))  # tokens the stream carried no text for
                tokens += untold
                token_s += [now] * len(untold)
                break
        return EngineAnswer(sent, token_s, tokens, time.perf_counter(), cached)
    finally:
        connection.close()
