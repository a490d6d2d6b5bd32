#!/usr/bin/env python3
"""A stand-in for llama.cpp's llama-server, for the tests of how kvpipe runs an engine's server (its
start, its log, its stop, the streamed answers and their timing) on machines where the real one is not
built: it takes llama-server's command line, prints its KV cache line as llama.cpp does, answers
/health, and streams /completion's tokens as llama-server's native endpoint does (100, 101, ... one per
event, FAKE_TOKEN_S apart; cache_n: half the prompt where cache_prompt is set). FAKE_START_S delays
its readiness; FAKE_EXIT makes it exit while starting, with that status."""

import argparse
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from fake_stream import event

BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int)
    parser.add_argument("-c", type=int, default=512)
    parser.add_argument("-np", type=int, default=1)
    parser.add_argument("-ctk", default="f16")
    parser.add_argument("-ctv", default="f16")
    args, _ = parser.parse_known_args()
    if os.environ.get("FAKE_EXIT"):
        print("error: the model could not be loaded", flush=True)
        sys.exit(int(os.environ["FAKE_EXIT"]))
    layers, width = 30, 192  # SmolLM2-135M: 30 layers, 3 KV heads of 64
    k_mib = args.c * layers * width * BYTES[args.ctk] / 2**20
    v_mib = args.c * layers * width * BYTES[args.ctv] / 2**20
    print(
        f"llama_kv_cache: size = {k_mib + v_mib:7.2f} MiB ({args.c:6d} cells, {layers:3d} layers, "
        f"{args.np:2d}/{args.np} seqs), K ({args.ctk}): {k_mib:7.2f} MiB, V ({args.ctv}): {v_mib:7.2f} MiB",
        flush=True,
    )
    ready_at = time.monotonic() + float(os.environ.get("FAKE_START_S", "0"))
    token_s = float(os.environ.get("FAKE_TOKEN_S", "0.005"))

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            status = 200 if self.path == "/health" and time.monotonic() >= ready_at else 503
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            cached = len(body["prompt"]) // 2 if body.get("cache_prompt") else 0
            for index in range(body["n_predict"]):
                time.sleep(token_s)
                event(self.wfile, {"content": "x", "tokens": [100 + index], "stop": False})
            event(self.wfile, {"content": "", "tokens": [], "stop": True, "timings": {"cache_n": cached}})
            self.wfile.write(b"0\r\n\r\n")

    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
