"""engine=openai: a server the user runs, reached at its base URL. What kvpipe refuses of it in one
line before anything is sent, how it waits for it (and names what it answered where it never did),
how a stream of text becomes tokens, and, where llama.cpp's server is built (`make engines`), the
labelled questions through that server as an OpenAI endpoint: the same answers and token counts as
engine=llama_cpp gives from the same server program, what is not measured left out and said, and
the server left running, as it is the user's."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from kvpipe.engine.base import ServerPlan
from kvpipe.engine.lifecycle.remote import RemoteServer
from kvpipe.errors import ConfigError, KvpipeError
from kvpipe.jobspec import spec_from

from conftest import REPO

ENGINE = ("engine=openai", "model=smollm2_135m", "engine.model=kvpipe", "engine.base_url=http://127.0.0.1:8000/v1")


@pytest.mark.parametrize(
    "overrides, field, says",
    [
        (["engine.base_url=localhost:8000"], "engine.base_url", "http://127.0.0.1:8000/v1"),
        (["engine.model=null"], "engine.model", "GET /models"),
        (["engine.api_key_env=KVPIPE_TEST_NO_SUCH_KEY"], "engine.api_key_env", "is not set"),
        (["engine.start_timeout_s=0"], "engine.start_timeout_s", "above 0"),
        (["cache=quantized"], "cache", "engine.kv_cache records them"),
        (["press=snapkv"], "press", "press=none"),
        (
            ["workload=conversation", "workload.keep_session_cache=true", "load=concurrency"],
            "workload.keep_session_cache",
            "prefix caching",
        ),  # fmt: skip
    ],
)
def test_what_an_openai_endpoint_cannot_do_is_refused_in_one_line_before_anything_is_sent(overrides, field, says):
    with pytest.raises(ConfigError) as refused:
        spec_from([*ENGINE, *overrides])
    message = str(refused.value)
    assert message.startswith(f"{field}=") and says in message and "\n" not in message


def test_the_declared_kv_settings_key_and_label_the_run_and_the_api_key_is_never_recorded(monkeypatch):
    monkeypatch.setenv("KVPIPE_TEST_KEY", "secret")
    spec = spec_from([*ENGINE, "engine.kv_cache='--kv-cache-dtype fp8'", "engine.lossless=false", "engine.api_key_env=KVPIPE_TEST_KEY"])  # fmt: skip
    engine = spec.bound_engine
    assert engine.label() == "openai --kv-cache-dtype fp8" and not engine.lossless()
    fields = engine.read_fields()
    assert "engine.kv_cache" in fields and "engine.base_url" in fields and "engine.api_key_env" not in fields
    other = spec_from([*ENGINE, "engine.kv_cache='--kv-cache-dtype auto'"])
    assert other.measurement_key() != spec.measurement_key()
    params = spec.params()
    assert params["engine.kv_cache"] == "--kv-cache-dtype fp8" and "engine.api_key_env" not in params
    assert "secret" not in json.dumps(params)


def test_a_stream_of_text_is_counted_with_the_models_tokenizer_and_its_untold_end_as_end_of_sequence():
    from kvpipe import model

    spec = spec_from(list(ENGINE))
    engine, tokenizer = spec.bound_engine, model.load_tokenizer(spec.model)
    engine.started(tokenizer)
    tokens, done, cached = engine.streamed({"choices": [{"text": " Tokyo", "finish_reason": None}]})
    assert tokens == tokenizer.encode(" Tokyo", add_special_tokens=False) and not done and cached is None
    ids, done, cached = engine.streamed({"choices": [{"token_ids": [7, 8]}]})
    assert ids == [7, 8]  # a server that sends its token ids (vLLM's return_token_ids): taken as sent
    last = {"choices": [], "usage": {"completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 29}}}
    assert engine.streamed(last) == ([], True, 29)
    assert engine.untold(last, 3) == [tokenizer.eos_token_id] and engine.untold(last, 4) == []


class _Endpoint(BaseHTTPRequestHandler):
    """GET /v1/models with the key `secret`; 401 without it."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        allowed = self.headers.get("Authorization") == "Bearer secret"
        data = json.dumps({"data": [{"id": "kvpipe"}]} if allowed else {"error": "no key"}).encode()
        self.send_response(200 if allowed and self.path == "/v1/models" else 401)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def endpoint():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Endpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_the_endpoint_is_waited_for_with_its_key_and_a_refusal_or_silence_is_one_line(endpoint):
    import time

    with RemoteServer("openai", endpoint, "/models", 5, api_key="secret") as server:
        assert server.get("/models")[0] == 200 and server.server_pids() == []
    started = time.perf_counter()
    with pytest.raises(KvpipeError, match="401") as refused:
        RemoteServer("openai", endpoint, "/models", 5).start()
    assert time.perf_counter() - started < 2, "a refused key is not waited on"
    assert "engine.base_url=" in str(refused.value) and "\n" not in str(refused.value)
    silent = endpoint.rsplit(":", 1)[0] + ":9/v1"  # the discard port: nothing answers there
    with pytest.raises(KvpipeError, match=r"within engine.start_timeout_s=0.5 \(last: \w+"):
        RemoteServer("openai", silent, "/models", 0.5).start()


# ---- llama.cpp's server as the user's OpenAI endpoint, where `make engines` built it ------------


def _llama_server():
    from kvpipe.engine.llama_cpp import LlamaCpp

    settings = {f: getattr(LlamaCpp.Settings(), f) for f in LlamaCpp.Settings.__dataclass_fields__}
    return LlamaCpp(SimpleNamespace(**{**settings, "cache_prompt": True}))


LLAMA = _llama_server()
needs_llama_server = pytest.mark.skipif(bool(LLAMA.missing()), reason=f"llama-server is not built here ({LLAMA.missing()})")  # fmt: skip
QUICK = ("workload=dataset", "workload.path=examples/questions.jsonl", "workload.limit=6", "workload.repeats=1",
         "workload.warmup=0", "workload.max_new_tokens=16", "model.threads=1")  # fmt: skip


@pytest.mark.slow
@needs_llama_server
def test_the_labelled_questions_through_an_openai_endpoint_answer_as_through_the_engine_kvpipe_starts(
    tmp_path, existing_store
):
    from kvpipe.model.embedded import embedded_gguf

    from conftest import kvpipe_here

    existing_store(tmp_path)
    (tmp_path / "examples").symlink_to(REPO / "examples")
    plan = ServerPlan(embedded_gguf(), slots=1, context_tokens=512, threads=1)
    with LLAMA.server_for(plan, tmp_path / "users-server.log") as users:
        url = f"http://127.0.0.1:{users.port}/v1"
        asked = kvpipe_here(["engine=openai", f"engine.base_url={url}", f"engine.model={embedded_gguf()}",
                             "engine.kv_cache='-ctk f16 -ctv f16'", *QUICK, "hydra.run.dir=outputs/through"], tmp_path)  # fmt: skip
        assert asked.returncode == 0, asked.stderr[-2000:]
        assert users.process.poll() is None, "the user's server is left running"
        wrong = kvpipe_here(["engine=openai", f"engine.base_url={url}", "engine.model=gpt-4", *QUICK], tmp_path)
        assert wrong.returncode == 2 and "engine.model=gpt-4 is not served at" in wrong.stderr
    # each in a folder of its own: two runs that start within one second share Hydra's default one
    started = kvpipe_here(["engine=llama_cpp", *QUICK, "hydra.run.dir=outputs/own"], tmp_path)
    assert started.returncode == 0, started.stderr[-2000:]
    through, own = (json.loads((tmp_path / "outputs" / run / "result.json").read_text()) for run in ("through", "own"))
    assert [a["answer"] for a in through["answers"]] == [a["answer"] for a in own["answers"]]
    assert [r["output_tokens"] for r in through["requests"]] == [r["output_tokens"] for r in own["requests"]]
    assert through["metrics"]["task_accuracy"] == own["metrics"]["task_accuracy"]
    # its own prompt cache served the shared system prompt; nothing kvpipe could not read is reported
    assert through["metrics"]["prefix_hit_rate"] > 0
    assert sum(r["prefix_hit_tokens"] for r in through["requests"]) == through["metrics"]["prefix_hit_tokens"]
    for unmeasured in ("peak_memory_bytes", "kv_cache_bytes", "weights_bytes", "kv_bytes_per_token", "server_start_ms"):
        assert unmeasured not in through["metrics"] and unmeasured in own["metrics"]
    assert any("not measured" in note and "-ctk f16 -ctv f16" in note for note in through["notes"])
    assert not any(note.startswith("contended") for note in through["notes"]), "its server's work is the job's"
