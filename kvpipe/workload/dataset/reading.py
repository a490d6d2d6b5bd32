"""A user's prompt file, read through Hugging Face `datasets`, offline: JSONL or JSON, CSV, Parquet, or a
`save_to_disk` folder. Every way it can be wrong is one line naming `workload.path`, or
`workload.field` and the columns that exist."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from functools import lru_cache
from pathlib import Path

from kvpipe.errors import ConfigError

BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
EXPECTED = "expected a .jsonl, .json, .csv or .parquet file, or a folder written by datasets' save_to_disk"
DEFAULT_FIELDS = ("messages", "text", "prompt")  # the column used when workload.field is unset, first present


def check_path(path: str | None) -> Path:
    """The path as a Path, or one line saying what is wrong with it."""
    if not path:
        raise ConfigError("workload.path", path, f"{EXPECTED}, e.g. workload.path=examples/prompts.jsonl")
    found = Path(path).expanduser()
    if not found.exists():
        raise ConfigError("workload.path", path, f"no such file or folder; {EXPECTED}")
    if found.is_dir():
        if not any((found / name).is_file() for name in ("dataset_dict.json", "state.json")):
            raise ConfigError("workload.path", path, f"the folder was not written by save_to_disk; {EXPECTED}")
    elif found.suffix.lower() not in BUILDERS:
        raise ConfigError("workload.path", path, f"unknown file type {found.suffix or '(none)'!r}; {EXPECTED}")
    elif found.stat().st_size == 0:
        raise ConfigError("workload.path", path, "the file is empty; expected at least one row")
    return found


def digest(path: Path) -> str:
    """A content digest of the file (or every file of the folder): a changed file is a new measurement."""
    # resolved: a file's name within its folder, not the way the cwd reached it (a symlinked folder)
    path = path.resolve()
    return _digest(str(path), _stamp(path))


def _stamp(path: Path) -> tuple:
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files)


@lru_cache(maxsize=32)
def _digest(path: str, stamp: tuple) -> str:
    sha = hashlib.sha256()
    for name, _, _ in stamp:
        sha.update(os.path.relpath(name, path).encode() + b"\0")
        with open(name, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                sha.update(block)
    return sha.hexdigest()[:16]


def load(path: Path, split: str | None, spelled: str):
    """The file as a datasets.Dataset (memory-mapped Arrow: it need not fit in memory); errors name
    the path as the user `spelled` it."""
    return _load(str(path.resolve()), split, _stamp(path), spelled)


def quiet() -> None:
    """datasets without its progress bars and log lines: a file's problem is said in one line."""
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(logging.CRITICAL)  # its own "Failed to load JSON" lines: we say it in one


@lru_cache(maxsize=8)
def _load(path: str, split: str | None, stamp: tuple, spelled: str):
    import datasets

    quiet()
    folder = Path(path)
    if folder.is_dir():
        loaded = datasets.load_from_disk(path)
    else:
        if split is not None:
            raise ConfigError("workload.split", split, "only for a save_to_disk folder of splits; expected null")
        try:
            loaded = datasets.load_dataset(BUILDERS[folder.suffix.lower()], data_files=path, split="train")
        except Exception as exc:  # noqa: BLE001 - a malformed file fails in the builder's own ways
            raise ConfigError("workload.path", spelled, _why_unreadable(folder, exc)) from None
    if isinstance(loaded, datasets.DatasetDict):
        loaded = _one_split(loaded, split)
    elif split is not None:
        raise ConfigError("workload.split", split, "the folder holds one dataset, not splits; expected null")
    if len(loaded) == 0:
        raise ConfigError("workload.path", spelled, "it holds no rows; expected at least one")
    return loaded


def _one_split(splits, split: str | None):
    names = list(splits)
    if split is None and len(names) == 1:
        return splits[names[0]]
    if split not in names:
        raise ConfigError("workload.split", split, "expected one of the folder's splits: " + ", ".join(names))
    return splits[split]


def row_number(index: int) -> int:
    """A row's number as the user's editor counts the file's rows (and a JSON Lines file's lines):
    the first is 1. Every message about a row of a user's file names it so."""
    return index + 1


def _why_unreadable(path: Path, exc: BaseException) -> str:
    """A JSON Lines file's first broken line by number; otherwise the reader's own reason."""
    if path.suffix.lower() == ".jsonl":
        with open(path, encoding="utf-8", errors="replace") as handle:
            for number, line in enumerate(handle, 1):
                if line.strip():
                    try:
                        json.loads(line.strip())
                    except json.JSONDecodeError as error:
                        return f"line {number} is not valid JSON ({error.msg} at column {error.colno})"
    cause = exc.__cause__ or exc.__context__ or exc
    reason = next((line.strip() for line in str(cause).splitlines() if line.strip()), type(cause).__name__)
    if isinstance(exc, StopIteration) or not reason:
        return "it holds no rows; expected at least one"
    return f"could not be read ({reason})"


def column(dataset, field: str | None) -> str:
    """The prompt column: workload.field, or the first of messages, text, prompt that exists."""
    columns = list(dataset.column_names)
    if field is not None:
        if field not in columns:
            raise ConfigError("workload.field", field, "no such column; expected one of: " + ", ".join(columns))
        return field
    for name in DEFAULT_FIELDS:
        if name in columns:
            return name
    raise ConfigError(
        "workload.field",
        None,
        f"the file has none of the default columns ({', '.join(DEFAULT_FIELDS)}); name one of: " + ", ".join(columns),
    )
