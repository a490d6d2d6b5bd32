"""engine=llama_cpp: what kvpipe refuses before a server starts, how it starts, waits for and stops
an engine's server (whatever happens, a SIGKILL of kvpipe included), the requests it streams to it and
the figures it reads back. The server here is tests/fake_llama_server.py, which speaks llama-server's
command line, log line and /completion stream, so that all of it runs where llama.cpp is not built;
where it is (`make engines`), the last tests run the real one on the embedded model."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from kvpipe.engine import get
from kvpipe.engine.base import ServerPlan
from kvpipe.engine.lifecycle.guard import STOP_WAIT_S
from kvpipe.engine.lifecycle.server import EngineServer
from kvpipe.engine.llama_cpp import LlamaCpp
from kvpipe.errors import ConfigError, KvpipeError
from kvpipe.jobspec import spec_from

from conftest import REPO

FAKE = str(REPO / "tests" / "fake_llama_server.py")
FAKE_VLLM = str(REPO / "tests" / "fake_vllm_server.py")
ENGINE = ("engine=llama_cpp", "model=smollm2_135m")


def llama(*overrides: str) -> LlamaCpp:
    spec = spec_from([*ENGINE, *overrides])
    return spec.bound_engine


@pytest.mark.parametrize(
    "overrides, field, says",
    [
        (["cache=static"], "cache", "engine.cache_type_k and engine.cache_type_v"),
        (["press=snapkv"], "press", "press=none"),
        (["engine.cache_type_v=q4_0", "engine.flash_attn=off"], "engine.flash_attn", "only with flash attention"),
        (["engine.cache_type_k=q3_0"], "engine.cache_type_k", "q8_0, q4_0"),
        (["engine.flash_attn=maybe"], "engine.flash_attn", "on, off, auto"),
        (["model=tiny_random"], "model", "model=smollm2_135m"),
        (
            ["workload=conversation", "workload.keep_session_cache=true", "load=concurrency"],
            "workload.keep_session_cache",
            "engine.cache_prompt=true",
        ),
        (["workload=shared_context"], "workload", "engine=transformers"),
    ],
)
def test_what_llama_cpp_cannot_do_is_refused_in_one_line_before_anything_starts(overrides, field, says):
    with pytest.raises(ConfigError) as refused:
        spec_from([*ENGINE, *overrides])
    message = str(refused.value)
    assert message.startswith(f"{field}=") and says in message and "\n" not in message


def test_kv_settings_become_llama_servers_own_flags():
    plan = ServerPlan(REPO / "model.gguf", slots=2, context_tokens=300, threads=2)
    engine = llama(
        f"engine.server={FAKE}", "engine.cache_type_k=q8_0", "engine.cache_type_v=q4_0", "engine.flash_attn=on"
    )
    words = engine.command(plan, 8123)
    assert words[0] == FAKE
    flags = {word: words[index + 1] for index, word in enumerate(words[:-1])}
    assert (flags["-ctk"], flags["-ctv"], flags["-fa"], flags["--port"]) == ("q8_0", "q4_0", "on", "8123")
    assert (flags["-c"], flags["-np"], flags["-t"]) == ("600", "2", "2")  # every slot holds a whole request
    assert flags["--cache-ram"] == "0"  # prompt caching off: nothing kept between requests
    assert "--cache-ram" not in llama(f"engine.server={FAKE}", "engine.cache_prompt=true").command(plan, 1)
    assert engine.use_words().startswith("llama-server -m MODEL.gguf -ctk q8_0 -ctv q4_0 -fa on")
    assert (engine.label(), engine.lossless()) == ("llama_cpp q8_0/q4_0", False)
    assert (llama().label(), llama().lossless()) == ("llama_cpp f16", True)


def test_the_kv_bytes_are_what_llama_cpps_own_log_line_says():
    line = ("llama_kv_cache: size =   22.50 MiB (  2048 cells,  30 layers,  1/1 seqs), K (q8_0):    5.98 MiB, "
            "V (f16):   11.25 MiB")  # fmt: skip
    report = llama().kv_report("loading...\n" + line + "\nserver is listening\n")
    assert report == {
        "kv_cache_bytes": round(22.5 * 2**20),
        "kv_cells": 2048.0,
        "kv_bytes_per_token": 22.5 * 2**20 / 2048,
    }
    assert llama().kv_report("no such line") == {}


def test_the_measurement_key_holds_what_the_server_computes_with_not_where_it_is():
    key = lambda *o: spec_from([*ENGINE, *o]).measurement_key()  # noqa: E731
    assert key() == key(f"engine.server={FAKE}", "engine.start_timeout_s=10")
    assert key() != key("engine.cache_type_k=q8_0") != key("engine.cache_prompt=true")
    assert key() != spec_from(["model=smollm2_135m"]).measurement_key()  # another engine, another measurement
    assert spec_from(["model=smollm2_135m", "engine=transformers"]).engine is None  # keyed as before engines
    params = spec_from([*ENGINE, "engine.cache_type_k=q8_0"]).params()
    assert params["engine.cache_type_k"] == "q8_0" and "engine.server" not in params


def fake_server(tmp_path, timeout_s: float = 20.0) -> EngineServer:
    plan = ServerPlan(tmp_path / "m.gguf", 2, 64, 1)
    engine = llama(f"engine.server={FAKE}")
    return EngineServer(
        "llama_cpp", lambda port: engine.command(plan, port), tmp_path / "server.log", "/health", timeout_s
    )


def fake_vllm_server(tmp_path, timeout_s: float = 20.0) -> EngineServer:
    from kvpipe.engine.vllm import Vllm

    plan = ServerPlan(tmp_path, 1, 64, 1)
    engine = spec_from(["engine=vllm", "model=smollm2_135m", f"engine.python={FAKE_VLLM}"]).bound_engine
    assert isinstance(engine, Vllm)
    return EngineServer(
        "vllm", lambda port: engine.command(plan, port), tmp_path / "server.log", "/health", timeout_s,
        engine.environment(plan),
    )  # fmt: skip


def gone(pid: int, within_s: float = 2 * STOP_WAIT_S + 5) -> bool:
    """Whether the process ends within the guard's bound: SIGTERM to the server's group, up to
    STOP_WAIT_S for it to end, then SIGKILL and up to STOP_WAIT_S more (in one CI run, the guard of a
    llama-server whose kvpipe was killed mid-job was still there 10 s later)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_a_server_is_waited_for_logged_beside_the_run_and_stopped(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_START_S", "0.5")
    with fake_server(tmp_path) as server:
        pid = server.pid
        assert server.start_s >= 0.5  # it waited for /health, not for the process to exist
    assert gone(pid)
    log = (tmp_path / "server.log").read_text()
    assert log.startswith(f"$ {FAKE} -m ") and "llama_kv_cache: size =" in log


def test_a_server_that_fails_to_start_is_one_error_with_its_logs_last_lines(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_EXIT", "3")
    with pytest.raises(KvpipeError, match=r"stopped while starting \(exit 3\)[\s\S]*the model could not be loaded"):
        fake_server(tmp_path).start()


def test_a_server_that_does_not_answer_in_time_is_stopped_and_named(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_START_S", "60")
    server = fake_server(tmp_path, timeout_s=1.0)
    with pytest.raises(KvpipeError, match="did not answer within engine.start_timeout_s=1"):
        server.start()
    assert server.process is None


@pytest.mark.parametrize("fake", ["llama", "vllm"])  # vLLM's starts a process of its own, as vLLM does
def test_no_server_nor_a_process_it_started_outlives_a_kvpipe_killed_with_sigkill(tmp_path, fake):
    code = f"""
import sys; sys.path.insert(0, {str(REPO / "tests")!r})
from pathlib import Path
from test_engines import fake_server, fake_vllm_server
server = (fake_server if {fake!r} == "llama" else fake_vllm_server)(Path({str(tmp_path)!r})).start()
print(*server.server_pids(), flush=True)
import time; time.sleep(60)
"""
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        pids = [int(pid) for pid in parent.stdout.readline().split()]
        assert len(pids) == (1 if fake == "llama" else 2)
        for pid in pids:
            os.kill(pid, 0)  # up
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        assert all(gone(pid) for pid in pids), "the server or a process it started outlived kvpipe"
    finally:
        parent.kill()


def test_requests_stream_their_tokens_and_times_under_the_loads_in_flight_limit(tmp_path, monkeypatch):
    from kvpipe.job.arrivals import Scheduled
    from kvpipe.job.engine_served import serve_over_http
    from kvpipe.job.servers import Request

    monkeypatch.setenv("FAKE_TOKEN_S", "0.02")
    requests = [Request(list(range(10 + i)), 4, "p") for i in range(4)]
    workload = SimpleNamespace(ignore_eos=True, seed=0, do_sample=False)
    for cache_prompt, cached in ((False, 0), (True, sum(len(r.ids) // 2 for r in requests))):
        engine = llama(f"engine.server={FAKE}", f"engine.cache_prompt={str(cache_prompt).lower()}")
        with fake_server(tmp_path) as server:
            outcome = serve_over_http(engine, server, workload, Scheduled(requests, [0.0] * 4, 2, closed=True), 2, 99)
        assert outcome.max_in_flight == 2 and outcome.kv_bytes == 99 and outcome.prefix_hit_tokens == cached
        for served in outcome.served:
            assert served.tokens == [100, 101, 102, 103]
            gaps = [b - a for a, b in zip(served.token_s, served.token_s[1:])]
            assert min(gaps) > 0.01 and served.ttft_ms > 15  # each token's own arrival, as streamed
        # two in flight at once: the last two waited for the first two
        assert min(s.started_s for s in outcome.served[2:]) >= min(s.finished_s for s in outcome.served[:2]) - 0.01


@pytest.mark.slow  # the embedded model's tokenizer, a served job's figures
def test_a_job_on_an_engine_reads_its_figures_from_the_server_and_stops_it(tmp_path, monkeypatch):
    from kvpipe.job.runner import run_job

    monkeypatch.chdir(REPO)
    spec = spec_from([*ENGINE, f"engine.server={FAKE}", "workload.max_new_tokens=4", "workload.repeats=2",
                      "workload.warmup=0", "tracking=off", "engine.cache_type_k=q8_0"])  # fmt: skip
    before = set(_servers())
    result = run_job(spec)
    metrics, tags = result.metrics, result.tags
    assert metrics["tpot_ms"] > 0 and metrics["ttft_ms"] > 0 and metrics["served_requests"] > 0
    # the fake's own KV line: 30 layers of 192 keys (q8_0) and values (f16) per cell, to llama.cpp's 0.01 MiB
    cells = metrics["kv_cells"]
    assert metrics["kv_cache_bytes"] == pytest.approx(cells * 30 * 192 * (34 / 32 + 2), abs=0.01 * 2**20)
    assert tags["cache.effective"] == "llama_cpp q8_0/f16" and tags["engine_lossless"] == "false"
    assert tags["engine_command"].startswith("llama-server -m ") and "-ctk q8_0 -ctv f16" in tags["engine_command"]
    assert tags["load"] == "concurrency(1)"  # no load given: one request at a time
    assert any("no quality pass" in note for note in result.notes)
    assert set(_servers()) == before, "its server is stopped"


@pytest.mark.slow  # the embedded model's tokenizer, a served job
def test_a_pass_through_an_engine_that_has_missed_its_target_sends_no_more_requests(monkeypatch):
    from kvpipe.job.runner import run_job

    monkeypatch.chdir(REPO)
    rate = ["load=rate", "load.rate=50", "load.requests=8", "load.max_ttft_ms=0.001", "workload.max_new_tokens=2",
            "workload.repeats=1", "workload.warmup=0", "tracking=off", f"engine.server={FAKE}"]  # fmt: skip
    stopped = run_job(spec_from([*ENGINE, *rate, "load.stop_when_missed_at=90"]))
    served = int(stopped.metrics["served_requests"])
    assert 1 <= served < 8 and stopped.metrics["within_targets"] == 0  # p90 of 8: the first miss decides it
    (note,) = [n for n in stopped.notes if "stop_when_missed_at" in n]
    assert note.startswith(f"stopped after {served} of its 8 requests") and "p90 TTFT misses it" in note
    assert run_job(spec_from([*ENGINE, *rate])).metrics["served_requests"] == 8  # unset: every request sent


def _servers(named: str = "llama") -> list[int]:
    """The engine servers this process started and that still run (its children), by a word of their command."""
    import psutil

    children = psutil.Process().children(recursive=True)
    return [c.pid for c in children if any(named in word for word in _cmdline(c))]


def _cmdline(process) -> list[str]:
    import psutil

    try:
        return process.cmdline()
    except psutil.Error:
        return []


def test_the_engine_registry_names_every_engine():
    assert get("transformers").in_process and not get("llama_cpp").in_process and not get("vllm").in_process


# ---- the real llama-server, where `make engines` built it ---------------------------------------

REAL = LlamaCpp(SimpleNamespace(**{f: getattr(LlamaCpp.Settings(), f) for f in LlamaCpp.Settings.__dataclass_fields__}))
needs_llama_server = pytest.mark.skipif(
    bool(REAL.missing()), reason=f"llama-server is not built here ({REAL.missing()})"
)
QUICK = ("workload=dataset", "workload.path=examples/questions.jsonl", "workload.repeats=1", "workload.warmup=0")


@pytest.mark.slow
@needs_llama_server
def test_the_labelled_questions_through_llama_cpp_are_scored_and_its_server_stopped(tmp_path, existing_store):
    import json

    from conftest import kvpipe_here

    existing_store(tmp_path)
    (tmp_path / "examples").symlink_to(REPO / "examples")
    before = set(_servers())
    done = kvpipe_here(["engine=llama_cpp", *QUICK], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert set(_servers()) == before, "its server is stopped"
    result = json.loads(next(tmp_path.glob("outputs/runs/*/*/result.json")).read_text())
    metrics = result["metrics"]
    assert metrics["served_requests"] == 28 and 0 < metrics["task_accuracy"] <= 1
    # llama.cpp's own count: SmolLM2-135M's 30 layers of 3 KV heads of 64, f16 keys and values, per cell
    assert metrics["kv_cache_bytes"] == pytest.approx(metrics["kv_cells"] * 30 * 192 * 2 * 2, abs=0.01 * 2**20)
    assert "llama_kv_cache: size =" in next(tmp_path.glob("outputs/runs/*/*/llama_cpp-server.log")).read_text()


@pytest.mark.slow
@needs_llama_server
def test_a_sweep_of_llama_cpps_kv_types_is_paired_against_its_f16_cache_and_recommended_in_its_words(
    tmp_path, existing_store
):
    from conftest import kvpipe_here

    existing_store(tmp_path)
    (tmp_path / "examples").symlink_to(REPO / "examples")
    # four requests in flight: the server's four slots, each a whole request's context
    done = kvpipe_here(
        ["-m", "engine=llama_cpp", "engine.cache_type=f16,q8_0", *QUICK, "load=concurrency", "load.requests=8"],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    said = done.stdout + done.stderr
    assert "2 finished" in said and "TPOT vs llama_cpp" in said  # the f16 cache is the baseline
    log = next(tmp_path.glob("outputs/multiruns/*/*/1/llama_cpp-server.log")).read_text()
    assert "-np 4" in log.splitlines()[0] and "K (q8_0)" in log
    assert not _servers()
    recommended = kvpipe_here(["recommend", "--min-accuracy", "0.5"], tmp_path)
    use = next(line for line in recommended.stdout.splitlines() if line.strip().startswith("use:"))
    assert use.split()[1] == "llama-server" and "-ctk" in use and "-ctv" in use
    assert "generate() call" not in recommended.stdout


@pytest.mark.slow
@needs_llama_server
def test_no_llama_server_outlives_a_kvpipe_killed_mid_job(tmp_path, existing_store):
    import psutil

    existing_store(tmp_path)
    (tmp_path / "examples").symlink_to(REPO / "examples")
    words = [sys.executable, "-m", "kvpipe", "engine=llama_cpp", *QUICK, "workload.repeats=50"]
    kvpipe = subprocess.Popen(words, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline, server = time.monotonic() + 120, None
        while server is None and time.monotonic() < deadline and kvpipe.poll() is None:
            children = psutil.Process(kvpipe.pid).children()
            server = next((c for c in children if "llama-server" in " ".join(_cmdline(c))), None)
            time.sleep(0.2)
        assert server is not None, "its server started"
        time.sleep(2)  # serving
        kvpipe.send_signal(signal.SIGKILL)
        kvpipe.wait(10)
        assert gone(server.pid), "the server outlived kvpipe"
    finally:
        kvpipe.kill()


def test_a_servers_log_goes_beside_a_hydra_run_and_to_a_new_folder_outside_one(tmp_path):
    """A worker that composed a config with Hydra's own (an earlier test, the API) holds a Hydra config
    without a run folder: the log goes to a new folder then, not to an error."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict, read_write

    from kvpipe.job.engine_served import EngineJob
    from kvpipe.jobspec import compose

    job = EngineJob(spec_from([*ENGINE, f"engine.server={FAKE}"]))
    held = HydraConfig.instance().cfg
    try:
        composed = compose(["model=tiny_random"], with_hydra=True)
        HydraConfig.instance().set_config(composed)
        assert job.server_log().parent.name.startswith("kvpipe-engine-")
        composed = compose(["model=tiny_random"], with_hydra=True)
        with read_write(composed), open_dict(composed):
            composed.hydra.runtime.output_dir = str(tmp_path)
        HydraConfig.instance().set_config(composed)
        assert job.server_log() == tmp_path / "llama_cpp-server.log"
    finally:
        HydraConfig.instance().cfg = held


@pytest.mark.slow  # the embedded model's tokenizer
def test_an_open_loop_of_requests_arrives_at_an_engine_as_the_load_says(monkeypatch):
    from kvpipe.job.runner import run_job

    monkeypatch.chdir(REPO)
    spec = spec_from([*ENGINE, f"engine.server={FAKE}", "load=rate", "load.rate=20", "load.requests=8",
                      "workload.max_new_tokens=4", "workload.repeats=1", "workload.warmup=0", "tracking=off"])  # fmt: skip
    result = run_job(spec)
    assert result.tags["load"] == "rate(20/s)" and result.metrics["served_requests"] == 8
    # the seeded arrivals: the last of eight 0.34 s after the first, which the pass waits for
    last = spec.bound_load.arrivals(list(range(8)))[-1]
    assert result.metrics["serve_span_ms"] >= last * 1e3


@pytest.mark.slow  # the embedded model's tokenizer, a served job's turns
def test_a_conversation_through_an_engine_re_sends_each_history_and_counts_its_prompt_cache_hits(monkeypatch):
    from kvpipe.job.engine_served import EngineSessionsJob
    from kvpipe.job.runner import job_for
    from kvpipe.schedule import run_rounds

    monkeypatch.chdir(REPO)
    spec = spec_from([*ENGINE, f"engine.server={FAKE}", "engine.cache_prompt=true", "workload=conversation",
                      "workload.sessions=2", "workload.turns=3", "workload.think_time_s=0.01", "load=concurrency",
                      "load.concurrency=2", "workload.max_new_tokens=3", "workload.repeats=1", "workload.warmup=0",
                      "tracking=off"])  # fmt: skip
    job = job_for(spec)
    assert isinstance(job, EngineSessionsJob)
    try:
        job.prepare()
        # every slot holds a whole session: the last turn's history and its answer
        assert job.plan_used.context_tokens == job.longest_turn + 3 and job.plan_used.slots == 2
        run_rounds([job], seed=0, shuffle=False)
        turns = sorted(job.turns_served(), key=lambda item: item[:2])
        assert len(turns) == 6 and [turn for _, turn, _, _ in turns] == [0, 1, 2] * 2
        for (_, _, before, answer), (_, turn, after, _) in zip(turns, turns[1:]):
            if turn:  # a later turn's prompt holds its session's earlier one
                assert len(after.ids) > len(before.ids) + len(answer.tokens) - 1
        metrics, _, _ = job.summary()
    finally:
        job.close()
    prompt_tokens = sum(len(request.ids) for _, _, request, _ in turns)
    # the stand-in serves half of each prompt from its cache (cache_prompt), as each response counts it
    assert metrics["prefix_hit_rate"] == pytest.approx(sum(len(r.ids) // 2 for _, _, r, _ in turns) / prompt_tokens)
    assert metrics["ttft_first_turn_p50_ms"] > 0 and metrics["ttft_later_turns_p50_ms"] > 0


def test_capacity_walks_an_engines_kv_settings_as_it_walks_kvpipes_caches():
    from kvpipe.orchestrate.capacity.walker import split_arguments, swept

    choices, fixed = split_arguments([*ENGINE, "engine.cache_type=f16,q8_0", "cache=dynamic"])
    assert choices == ["engine.cache_type=f16", "engine.cache_type=q8_0"] and fixed == [*ENGINE, "cache=dynamic"]
    assert swept(choices) == "engine.cache_type=f16,q8_0"
    assert split_arguments(list(ENGINE)) == (["dynamic"], list(ENGINE))  # its one cache: its settings choose it
    assert split_arguments(["cache=dynamic,paged"])[0] == ["dynamic", "paged"]
    with pytest.raises(ConfigError, match=r"^engine.flash_attn=.*only one of cache=, engine= or an engine"):
        split_arguments([*ENGINE, "engine.cache_type=f16,q8_0", "engine.flash_attn=on,off"])


@pytest.mark.slow  # a capacity search: a ceiling and a few rate points per KV type, each its own stand-in server
def test_capacity_through_an_engine_searches_each_of_its_kv_types_and_names_them_in_its_words(tmp_path, existing_store):
    from conftest import kvpipe_here

    existing_store(tmp_path)
    words = ["capacity", *ENGINE, f"engine.server={FAKE}", "engine.cache_type=f16,q8_0", "workload.max_new_tokens=2",
             "model.threads=1", "--max-ttft-ms", "5000", "--requests", "2", "--resolution", "0.5"]  # fmt: skip
    done = kvpipe_here(words, tmp_path)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "capacity: llama_cpp f16, llama_cpp q8_0 within" in done.stdout
    table = done.stdout[done.stdout.rindex("\ncache ") + 1 :]  # capacity's own, after the sweep's compare
    rows = sorted(line.split("  ")[0] for line in table.splitlines()[1:3])
    assert rows == ["llama_cpp f16", "llama_cpp q8_0"] and "paged" not in table, table
    # what each request was given of the server's cache; plan's memory bound is kvpipe's caches', not the engine's
    assert "KV per request" in table.splitlines()[0] and re.search(r"\d (KiB|MiB) ", table.splitlines()[1])
    assert all(line.rstrip().endswith("–") for line in table.splitlines()[1:3])
    best = done.stdout.split("capacity: llama_cpp ")[-1].split(" carries the most")[0]
    assert "use: kvpipe engine=llama_cpp model=smollm2_135m" in done.stdout
    assert f"engine.cache_type={best}" in done.stdout.split("use: ")[-1]
