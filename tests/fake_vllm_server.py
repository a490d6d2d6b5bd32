#!/usr/bin/env python3
"""A stand-in for vLLM's OpenAI-compatible server, for the tests of engine=vllm on machines where
vLLM's environment is not built: given as engine.python, it takes the command line kvpipe gives
vLLM's Python (`-m vllm.entrypoints.openai.api_server --model ... --kv-cache-dtype ...`), answers
/health, reports its KV cache on /metrics as vLLM's `vllm:cache_config_info` does (the memory that
VLLM_CPU_KVCACHE_SPACE gives it, over SmolLM2-135M's bytes per token), and streams /v1/completions
with token ids (100, 101, ... one per event, FAKE_TOKEN_S apart) and a last usage event (cached
tokens: half the prompt where prefix caching is on), then [DONE]. It writes its command line and
environment's VLLM_ and OMP_ settings to its log. Like vLLM, it starts a process of its own (its
"engine core", which only sleeps), whose pid it logs: a killed kvpipe must leave neither behind."""

import argparse
import json
import os
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from fake_stream import event

BYTES = {"auto": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}  # bfloat16 weights
PER_TOKEN = 30 * 3 * 64 * 2  # SmolLM2-135M: 30 layers of 3 KV heads of 64, keys and values


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-m")
    parser.add_argument("--port", type=int)
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--enable-prefix-caching", action="store_true")
    args, _ = parser.parse_known_args()
    print({k: v for k, v in os.environ.items() if k.startswith(("VLLM_", "OMP_"))}, flush=True)
    core = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(f"engine core pid {core.pid}", flush=True)
    memory = int(os.environ.get("VLLM_CPU_KVCACHE_SPACE", "4")) * 2**30
    blocks = memory // (args.block_size * PER_TOKEN * BYTES[args.kv_cache_dtype])
    labels = {
        "block_size": args.block_size, "cache_dtype": args.kv_cache_dtype, "num_gpu_blocks": blocks,
        "enable_prefix_caching": args.enable_prefix_caching, "kv_cache_memory_bytes": memory,
        "kv_cache_size_tokens": blocks * args.block_size,
    }  # fmt: skip
    metrics = "vllm:cache_config_info{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "} 1.0\n"
    token_s = float(os.environ.get("FAKE_TOKEN_S", "0.005"))

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            text = {"/health": "", "/metrics": "# HELP vllm:cache_config_info\n" + metrics}.get(self.path)
            data = (text or "").encode()
            self.send_response(200 if text is not None else 404)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for index in range(body["max_tokens"]):
                time.sleep(token_s)
                event(self.wfile, {"choices": [{"index": 0, "text": "x", "token_ids": [100 + index]}]})
            cached = len(body["prompt"]) // 2 if args.enable_prefix_caching else 0
            usage = {"prompt_tokens": len(body["prompt"]), "prompt_tokens_details": {"cached_tokens": cached}}
            event(self.wfile, {"choices": [], "usage": usage})
            event(self.wfile, "[DONE]")
            self.wfile.write(b"0\r\n\r\n")

    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
