"""Results kept on disk, so that a later process (or a launcher's worker) reuses them: the quality
references (kvpipe.measure.quality) and the token ids of the workloads' long text
(kvpipe.workload._texts). Also where kvpipe's per-user cache is (`cache_dir`), which holds this
folder and the embedded model's conversion (kvpipe.model.embedded).

An entry is one torch file under `<kvpipe cache>/references/`, named by the digest of its key and
holding the key itself: an entry whose stored key differs, or that does not load (partial, corrupt,
from another format), is recomputed, never trusted. Entries are written to a temporary file and
renamed into place, so two processes writing the same entry leave one whole file. The folder is kept
under KVPIPE_REFERENCE_CACHE_MB (default 2048 MiB) by removing the least recently used entries.
$KVPIPE_REFERENCE_DIR moves the folder; `rm -rf ~/.cache/kvpipe/references` (or wherever it is)
clears it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)
CACHE_DIR_ENV = "KVPIPE_CACHE_DIR"
LIMIT_ENV = "KVPIPE_REFERENCE_CACHE_MB"
FOLDER_ENV = "KVPIPE_REFERENCE_DIR"
DEFAULT_LIMIT_MB = 2048
FORMAT = 1  # bump when what a reference holds, or how it is made, changes


def cache_dir() -> Path:
    """Per-user cache: $KVPIPE_CACHE_DIR, else $XDG_CACHE_HOME/kvpipe, else ~/.cache/kvpipe."""
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kvpipe"


def folder() -> Path:
    """$KVPIPE_REFERENCE_DIR, else the kvpipe cache's references/ folder."""
    return Path(os.environ[FOLDER_ENV]).expanduser() if os.environ.get(FOLDER_ENV) else cache_dir() / "references"


def path_for(key: str) -> Path:
    return folder() / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.pt"


def load(key: str, device: str = "cpu"):
    """The stored value for `key`, its tensors on `device`, or None (absent, unreadable, or stored
    under another key)."""
    import torch

    path = path_for(key)
    if not path.is_file():
        return None
    try:
        entry = torch.load(path, map_location=device, weights_only=True)
        if entry.get("format") != FORMAT or entry.get("key") != key:
            raise ValueError("stored under another key or format")
    except Exception as exc:  # noqa: BLE001 - any unreadable entry is recomputed, never trusted
        log.warning("stored reference %s is unusable (%s): recomputing it", path.name, exc)
        return None
    os.utime(path)  # recently used: pruned last
    return entry["value"]


def save(key: str, value) -> None:
    """Store `value` whole or not at all; then keep the folder under its size limit."""
    import torch

    target = path_for(key)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=".writing-", suffix=".pt")
    try:
        with os.fdopen(handle, "wb") as stream:
            torch.save({"format": FORMAT, "key": key, "value": value}, stream)
        os.replace(temporary, target)
    except OSError as exc:  # a full or read-only disk costs a recomputation later, nothing else
        log.warning("could not store the quality reference (%s); it is kept in this process only", exc)
        Path(temporary).unlink(missing_ok=True)
        return
    prune(limit_bytes())


def limit_bytes() -> int:
    try:
        return int(float(os.environ.get(LIMIT_ENV, DEFAULT_LIMIT_MB)) * 2**20)
    except ValueError:
        return DEFAULT_LIMIT_MB * 2**20


def prune(limit: int) -> None:
    """Remove the least recently used entries until the folder holds at most `limit` bytes."""
    entries = []
    for path in folder().glob("*.pt"):
        try:
            stat = path.stat()
        except FileNotFoundError:  # another process pruned it first
            continue
        entries.append((stat.st_mtime, stat.st_size, path))
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries):
        if total <= limit:
            break
        path.unlink(missing_ok=True)
        total -= size
