"""engine=vllm: what kvpipe refuses before vLLM's server starts, the command line and environment it
starts it with, the KV cache it reads from the server's /metrics, and a job's figures from its
streamed answers. The server here is tests/fake_vllm_server.py (given as engine.python), which speaks
vLLM's command line, /metrics and /v1/completions stream, so that all of it runs where vLLM's
environment is not built; where it is (`make engines`), the last test runs the real one on the
embedded model."""

from __future__ import annotations

import json

import pytest

from kvpipe.engine.base import ServerPlan
from kvpipe.engine.vllm import Vllm
from kvpipe.errors import ConfigError
from kvpipe.jobspec import spec_from

from conftest import REPO

FAKE = str(REPO / "tests" / "fake_vllm_server.py")
ENGINE = ("engine=vllm", "model=smollm2_135m")
PER_TOKEN = 30 * 3 * 64 * 2  # SmolLM2-135M's keys and values per token: 30 layers of 3 KV heads of 64


def vllm(*overrides: str) -> Vllm:
    return spec_from([*ENGINE, *overrides]).bound_engine


@pytest.mark.parametrize(
    "overrides, field, says",
    [
        (["cache=static"], "cache", "engine.kv_cache_dtype"),
        (["cache=quantized", "backend=quanto"], "cache", "cache=quantized backend=fp8 (engine.kv_cache_dtype=fp8)"),
        (["cache=quantized", "backend=fp8", "engine.kv_cache_dtype=auto"], "engine.kv_cache_dtype", "give one of them"),
        (["cache=paged", "cache.block_size=16", "load=concurrency"], "engine.block_size", "a multiple of 32"),
        (["press=snapkv"], "press", "press=none"),
        (["engine.kv_cache_dtype=int8"], "engine.kv_cache_dtype", "auto, fp8, fp8_e4m3, fp8_e5m2"),
        (["engine.dtype=float64"], "engine.dtype", "bfloat16"),
        (["engine.kv_cache_space_gib=0"], "engine.kv_cache_space_gib", "whole GiB"),
        (["engine.block_size=-32"], "engine.block_size", "a multiple of 32"),
        (["engine.block_size=16"], "engine.block_size", "a multiple of 32"),
        (["model=tiny_random"], "model", "a folder of weights"),
        (
            ["workload=conversation", "workload.keep_session_cache=true", "load=concurrency"],
            "workload.keep_session_cache",
            "engine.prefix_caching=true",
        ),
        (["workload=shared_context"], "workload", "engine=transformers"),
    ],
)
def test_what_vllm_cannot_do_is_refused_in_one_line_before_anything_starts(overrides, field, says):
    with pytest.raises(ConfigError) as refused:
        spec_from([*ENGINE, *overrides])
    message = str(refused.value)
    assert message.startswith(f"{field}=") and says in message and "\n" not in message


@pytest.mark.parametrize(
    "kvpipes, vllms",
    [
        (["cache=quantized", "backend=fp8"], ["engine.kv_cache_dtype=fp8"]),
        (["cache=paged", "load=concurrency"], ["engine.prefix_caching=true", "engine.block_size=32", "load=concurrency"]),
        (["cache=paged", "cache.allow_block_sharing=false", "cache.block_size=64", "load=concurrency"],
         ["engine.block_size=64", "load=concurrency"]),
    ],
)  # fmt: skip
def test_kvpipes_cache_choices_that_mean_vllms_settings_run_as_them_and_say_so(kvpipes, vllms):
    mapped, own = spec_from([*ENGINE, *kvpipes]), spec_from([*ENGINE, *vllms])
    assert mapped.measurement_key() == own.measurement_key() and mapped.engine == own.engine
    assert mapped.params() == own.params() and mapped.cache.strategy == "dynamic"
    given = " ".join(w for w in kvpipes if w.split("=")[0].split(".")[0] in ("cache", "backend"))
    (note,) = mapped.warnings  # nothing said of ignored settings: what it was given as runs
    assert note.startswith(f"{given} runs as vllm's own ")
    assert all(w in note for w in vllms if w.startswith("engine."))


def test_kv_settings_become_vllms_own_flags_and_environment():
    plan = ServerPlan(REPO / "weights", slots=3, context_tokens=300, threads=2)
    engine = vllm(f"engine.python={FAKE}", "engine.kv_cache_dtype=fp8", "engine.block_size=64",
                  "engine.prefix_caching=true", "engine.kv_cache_space_gib=2")  # fmt: skip
    words = engine.command(plan, 8123)
    assert words[:3] == [FAKE, "-m", "vllm.entrypoints.openai.api_server"]
    flags = {word: words[index + 1] for index, word in enumerate(words[:-1])}
    assert (flags["--kv-cache-dtype"], flags["--block-size"], flags["--port"]) == ("fp8", "64", "8123")
    assert (flags["--max-model-len"], flags["--max-num-seqs"], flags["--model"]) == ("300", "3", str(plan.model_file))
    assert "--enable-prefix-caching" in words and "--enforce-eager" in words
    assert "--no-enable-prefix-caching" in vllm(f"engine.python={FAKE}").command(plan, 1)  # off unless asked
    assert engine.environment(plan) == {
        "VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "2"
    }  # fmt: skip
    assert engine.use_words().startswith("VLLM_CPU_KVCACHE_SPACE=2 python -m vllm.entrypoints.openai.api_server")
    assert "--kv-cache-dtype fp8 --enable-prefix-caching --block-size 64" in engine.use_words()
    assert (engine.label(), engine.lossless()) == ("vllm fp8 prefix", False)
    assert (vllm().label(), vllm().lossless()) == ("vllm auto", True)


def test_the_kv_bytes_are_what_vllms_own_metrics_say():
    text = ('# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n'
            'vllm:cache_config_info{block_size="128",cache_dtype="fp8",kv_cache_memory_bytes="1073741824",'
            'kv_cache_size_tokens="93184",num_gpu_blocks="728"} 1.0\n')  # fmt: skip
    assert Vllm.kv_report_metrics(text) == {
        "kv_cache_bytes": 2**30, "kv_cells": 93184.0, "kv_bytes_per_token": 2**30 / 93184
    }  # fmt: skip
    # its blocks' slots, not kv_cache_size_tokens, which counts at most --max-model-len (80) a block
    short = text.replace('kv_cache_size_tokens="93184"', 'kv_cache_size_tokens="58240"')
    assert Vllm.kv_report_metrics(short)["kv_cells"] == 93184.0
    assert Vllm.kv_report_metrics("vllm:num_requests_running 0.0\n") == {}


def test_the_measurement_key_holds_what_the_server_computes_with_not_where_it_is():
    key = lambda *o: spec_from([*ENGINE, *o]).measurement_key()  # noqa: E731
    assert key() == key(f"engine.python={FAKE}", "engine.start_timeout_s=10")
    assert len({key(), key("engine.kv_cache_dtype=fp8"), key("engine.prefix_caching=true")}) == 3
    assert key() != spec_from([*ENGINE[:1], "model=smollm2_135m", "engine=llama_cpp"]).measurement_key()


def test_a_streamed_vllm_event_brings_its_token_ids_and_the_last_its_cached_prompt_tokens():
    engine = vllm()
    assert engine.streamed({"choices": [{"index": 0, "text": "ass", "token_ids": [520]}]}) == ([520], False, None)
    last = {"choices": [], "usage": {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 4}}}
    assert engine.streamed(last) == ([], True, 4)
    assert engine.streamed({"choices": [], "usage": {"prompt_tokens": 9}}) == ([], True, 0)  # no details: none counted


@pytest.mark.slow  # the embedded model's tokenizer, a served job's figures
@pytest.mark.parametrize("prefix_caching", [False, True])
def test_a_job_on_vllm_reads_its_kv_cache_from_its_metrics_and_stops_its_server(prefix_caching, monkeypatch):
    from test_engines import _servers

    from kvpipe.job.runner import run_job

    monkeypatch.chdir(REPO)
    spec = spec_from([*ENGINE, f"engine.python={FAKE}", "workload.max_new_tokens=4", "workload.repeats=2",
                      "workload.warmup=0", "tracking=off", "engine.kv_cache_dtype=fp8",
                      f"engine.prefix_caching={str(prefix_caching).lower()}"])  # fmt: skip
    before = set(_servers("fake_vllm"))
    result = run_job(spec)
    metrics, tags = result.metrics, result.tags
    assert metrics["tpot_ms"] > 0 and metrics["ttft_ms"] > 0 and metrics["served_requests"] > 0
    # the fake's 1 GiB (VLLM_CPU_KVCACHE_SPACE=1) in blocks of 128 fp8 tokens
    assert metrics["kv_cache_bytes"] == 2**30 and metrics["kv_cells"] == 2**30 // (128 * PER_TOKEN) * 128
    assert metrics["prefix_hit_rate"] == pytest.approx(0.5 if prefix_caching else 0.0, abs=0.02)
    assert tags["cache.effective"] == "vllm fp8" + (" prefix" if prefix_caching else "")
    assert tags["engine_command"].startswith("VLLM_CPU_KVCACHE_SPACE=1 python -m vllm.entrypoints.openai.api_server")
    log = open(tags["engine_log"]).read()
    assert "'VLLM_CPU_KVCACHE_SPACE': '1'" in log and "'VLLM_CPU_OMP_THREADS_BIND': 'nobind'" in log
    assert set(_servers("fake_vllm")) == before, "its server is stopped"


# ---- the real vLLM, where `make engines` built its environment ----------------------------------

REAL = Vllm(spec_from(ENGINE).engine)
needs_vllm = pytest.mark.skipif(bool(REAL.missing()), reason=f"vLLM is not built here ({REAL.missing()})")


@pytest.mark.slow  # vLLM's server starts in ~30 s on 2 cores
@needs_vllm
def test_the_labelled_questions_through_vllm_with_an_fp8_cache_are_scored_and_its_server_stopped(
    tmp_path, existing_store
):
    from test_engines import _servers

    from conftest import kvpipe_here

    existing_store(tmp_path)
    (tmp_path / "examples").symlink_to(REPO / "examples")
    before = set(_servers("vllm"))
    words = ["engine=vllm", "engine.kv_cache_dtype=fp8", "workload=dataset", "workload.path=examples/questions.jsonl"]
    done = kvpipe_here([*words, "workload.limit=8", "workload.repeats=1", "workload.warmup=0"], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert set(_servers("vllm")) == before, "its server is stopped"
    metrics = json.loads(next(tmp_path.glob("outputs/runs/*/*/result.json")).read_text())["metrics"]
    assert metrics["served_requests"] == 8 and 0 <= metrics["task_accuracy"] <= 1
    # vLLM's own report: fp8 keys and values, a byte each, in whole blocks of its memory
    assert PER_TOKEN <= metrics["kv_bytes_per_token"] < PER_TOKEN * 1.01
    log = next(tmp_path.glob("outputs/runs/*/*/vllm-server.log")).read_text()
    assert "'kv_cache_dtype': 'fp8'" in log and "'enforce_eager': True" in log
