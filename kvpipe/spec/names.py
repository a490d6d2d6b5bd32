"""What names a model=hf run: its local folder, or its hub id."""

from __future__ import annotations

import os
from pathlib import Path


def hf_model_name(name_or_path: str) -> str:
    """What names a model=hf run: a local folder's name, or the hub id as written."""
    if looks_local(name_or_path):
        return Path(name_or_path.rstrip("/\\")).expanduser().name or name_or_path
    return name_or_path


def looks_local(name_or_path: str) -> bool:
    """A hub id is exactly 'org/name' or 'name'; anything path-like is a local folder."""
    return (
        name_or_path.startswith(("/", ".", "~"))
        or name_or_path.count("/") > 1
        or os.sep != "/"
        and os.sep in name_or_path
        or Path(name_or_path).exists()
    )
