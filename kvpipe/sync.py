"""`kvpipe sync PATH...`: upload results that were kept on disk while MLflow was unreachable.

Each result.json records its MLflow run id once uploaded, so syncing twice uploads nothing twice.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from omegaconf import OmegaConf

from kvpipe.config import KvpipeConfig
from kvpipe.errors import KvpipeError
from kvpipe.record import RESULT_FILE
from kvpipe.tracking import ARTIFACT_DIR

SYNCABLE = ("FINISHED", "FAILED", "KILLED")


def unsynced(paths: list[Path]) -> list[Path]:
    """result.json files under these paths that have no MLflow run yet."""
    found = []
    for path in paths:
        if not path.exists():
            raise KvpipeError(f"sync: {path} does not exist; expected a run or sweep directory under outputs/")
        candidates = [path] if path.name == RESULT_FILE else sorted(path.rglob(RESULT_FILE))
        for candidate in candidates:
            if {ARTIFACT_DIR, "mlruns"} & set(candidate.parts):
                continue  # MLflow's own artifact copies, not results
            document = json.loads(candidate.read_text())
            if document.get("status") in SYNCABLE and not document.get("mlflow_run_id"):
                found.append(candidate)
    return found


def sync_one(result_path: Path, tracking_uri: str | None) -> str:
    from kvpipe.pipeline import sync_document
    from kvpipe.plan import make_plan

    document = json.loads(result_path.read_text())
    plan = make_plan(OmegaConf.merge(OmegaConf.structured(KvpipeConfig), document["config"]))
    uri = tracking_uri or document.get("mlflow_uri") or plan.tracking.uri
    plan = replace(plan, tracking=replace(plan.tracking, enabled=True, uri=uri))
    sync_document(plan, document, result_path.parent, Path.cwd())
    return json.loads(result_path.read_text()).get("mlflow_run_id", "")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kvpipe sync", description=__doc__)
    parser.add_argument("paths", nargs="+", type=Path, help="run or sweep directories (or result.json files)")
    parser.add_argument("--tracking-uri", help="upload here instead of the store each result names")
    args = parser.parse_args(argv)
    pending = unsynced(args.paths)
    if not pending:
        print("nothing to sync: every result under these paths is in MLflow already")
        return 0
    failed = 0
    for path in pending:
        run_id = sync_one(path, args.tracking_uri)
        failed += not run_id
        print(f"{path}: " + (f"MLflow run {run_id}" if run_id else "still unreachable, kept on disk"))
    return 1 if failed else 0
