"""What identifies a model's weights, cheaply enough to ask on every job: the key under which the
quality references (kvpipe.disk_cache) are kept on disk.

A local folder (the embedded model included): each weight file's name, size and modification time,
and a digest of its first and last MiB (a safetensors header names every tensor and its offsets; the
tail holds the last tensor's values). A hub model: its id and the commit transformers loaded. A
random model: its config and seed, with the torch version that drew the weights. None where none of
these holds (a hub model loaded without a commit): its references stay in the process.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from kvpipe.config import ModelConfig
from kvpipe.model.shape import local_folder

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
EDGE_BYTES = 2**20


def fingerprint(model_cfg: ModelConfig, loaded_config=None) -> str | None:
    """A digest that changes whenever the weights could have: see the module docstring."""
    if model_cfg.source == "random":
        import torch

        from kvpipe.model.loading import config_key

        return _digest(["random", config_key(model_cfg), torch.__version__])
    folder = local_folder(model_cfg)
    if folder is not None:
        files = sorted(p for p in folder.iterdir() if p.suffix in WEIGHT_SUFFIXES and p.is_file())
        return _digest(["folder", *(_file_print(path) for path in files)]) if files else None
    commit = getattr(loaded_config, "_commit_hash", None)
    return _digest(["hub", model_cfg.name_or_path, commit]) if commit else None


def _file_print(path: Path) -> str:
    stat = path.stat()
    with path.open("rb") as handle:
        head = handle.read(EDGE_BYTES)
        handle.seek(max(stat.st_size - EDGE_BYTES, 0))
        tail = handle.read(EDGE_BYTES)
    return f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}:{hashlib.sha256(head + tail).hexdigest()}"


def _digest(parts: list) -> str:
    return hashlib.sha256("\n".join(map(str, parts)).encode()).hexdigest()
