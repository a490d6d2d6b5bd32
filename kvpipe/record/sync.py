"""Uploading results that were kept on disk while MLflow was unreachable (`kvpipe sync PATH...`).

Each result.json records its MLflow run id once uploaded, so syncing twice uploads nothing twice; and
an upload looks for the record's own run first (kvpipe.record.exactly_once), so a result whose id a
kill kept from being written back is not uploaded again either. Reads and writes results and MLflow
only: the measuring engine is never imported.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from omegaconf import OmegaConf

from kvpipe.errors import KvpipeError
from kvpipe.jobspec import KvpipeConfig, make_spec
from kvpipe.record import auth
from kvpipe.record.recorder import upload
from kvpipe.record.result import RESULT_FILE, Result, iter_results
from kvpipe.record.store import ARTIFACT_DIR

SYNCABLE = ("FINISHED", "FAILED", "KILLED")


def unsynced(paths: list[Path]) -> list[tuple[Path, Result]]:
    """(path, Result) for result.json files under these paths that have no MLflow run yet."""
    found = []
    for path in paths:
        if not path.exists():
            raise KvpipeError(f"sync: {path} does not exist; expected a run or sweep directory under outputs/")
        candidates = [(path, Result.load(path))] if path.name == RESULT_FILE else iter_results(path, recursive=True)
        for candidate, result in candidates:
            if {ARTIFACT_DIR, "mlruns"} & set(candidate.parts):
                continue  # MLflow's own artifact copies, not results
            if result.status in SYNCABLE and not result.mlflow_run_id:
                found.append((candidate, result))
    return found


def target(result: Result, tracking_uri: str | None):
    """The result's spec, tracking pointed at where it goes: --tracking-uri, else the store it names."""
    spec = make_spec(OmegaConf.merge(OmegaConf.structured(KvpipeConfig), result.config))
    uri = tracking_uri or result.mlflow_uri or spec.tracking.uri
    return replace(spec, tracking=replace(spec.tracking, enabled=True, uri=uri))


def sync_one(result_path: Path, result: Result, tracking_uri: str | None):
    """The result's run (a tracking.Logged: uploaded now, or found there already), or None where the
    store is still unreachable."""
    return upload(target(result, tracking_uri), result, result_path.parent, Path.cwd())


def check_stores(pending: list[tuple[Path, Result]], tracking_uri: str | None) -> None:
    """Each store's credentials once, before any upload: a refusal is one line (exit 2); a store that
    does not answer is said per result below."""
    stores = {}
    for _, result in pending:
        store = target(result, tracking_uri).tracking
        stores.setdefault((store.uri, store.experiment), store)
    for store in stores.values():
        auth.check_credentials(store, Path.cwd())
