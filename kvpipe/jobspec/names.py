"""What names a model=hf run: its local folder, or its hub id."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

# Folder names that say where weights sit, not which model they are (`…/gemma/model`, a hub
# cache's `snapshots/<hash>`): a table titled "· model ·" tells the reader nothing.
GENERIC_FOLDER_NAMES = frozenset(
    {"model", "models", "checkpoint", "checkpoints", "ckpt", "weights", "hf", "snapshot", "snapshots",
     "main", "final", "latest", "output", "outputs", "hub"}
)  # fmt: skip
_HEX_HASH = re.compile(r"[0-9a-f]{7,64}")


def hf_model_name(name_or_path: str) -> str:
    """What names a model=hf run: a local folder's name, or the hub id as written. A folder whose
    name says nothing is named by its config.json's `_name_or_path`, else its parent folder, else
    its architecture."""
    if not looks_local(name_or_path):
        return name_or_path
    folder = Path(name_or_path.rstrip("/\\")).expanduser()
    if folder.name and not says_nothing(folder.name):
        return folder.name
    config = _read_config(folder)
    return (
        _named_by(config.get("_name_or_path"))
        or _meaningful(folder.parent.name)
        or _architecture(config)
        or folder.name
        or name_or_path
    )


def says_nothing(folder_name: str) -> bool:
    """A generic folder name (model, weights, main…) or a snapshot's hex hash."""
    return folder_name.lower() in GENERIC_FOLDER_NAMES or bool(_HEX_HASH.fullmatch(folder_name.lower()))


def _meaningful(folder_name: str) -> str | None:
    return folder_name if folder_name and not says_nothing(folder_name) else None


def _named_by(name_or_path) -> str | None:
    """config.json's `_name_or_path`, where it names something: a hub id as written, or a path's
    meaningful folder name (save_pretrained often writes the generic folder it was loaded from)."""
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        return None
    if looks_local(name_or_path):
        return _meaningful(Path(name_or_path.rstrip("/\\")).name)
    return _meaningful(name_or_path.rsplit("/", 1)[-1]) and name_or_path


def _architecture(config: dict) -> str | None:
    architectures = config.get("architectures")
    if isinstance(architectures, list) and architectures and isinstance(architectures[0], str):
        return architectures[0]
    model_type = config.get("model_type")
    return model_type if isinstance(model_type, str) and model_type else None


def _read_config(folder: Path) -> dict:
    """The folder's config.json, read as plain JSON (the model has not loaded yet); {} if unreadable."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def looks_local(name_or_path: str) -> bool:
    """A hub id is exactly 'org/name' or 'name'; anything path-like is a local folder."""
    return (
        name_or_path.startswith(("/", ".", "~"))
        or name_or_path.count("/") > 1
        or os.sep != "/"
        and os.sep in name_or_path
        or Path(name_or_path).exists()
    )
