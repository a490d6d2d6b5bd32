"""`kvpipe sync PATH...`: upload results that were kept on disk while MLflow was unreachable."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvpipe.record import sync
from kvpipe.record.store import add_store_argument

HELP = "upload results kept on disk while MLflow was unreachable"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", type=Path, help="run or sweep directories (or result.json files)")
    add_store_argument(parser, "upload here instead of the store each result names")


def run(args: argparse.Namespace) -> int:
    """Upload every unsynced result under the paths; 1 if any is still unreachable."""
    pending = sync.unsynced(args.paths)
    if not pending:
        print("nothing to sync: every result under these paths is in MLflow already")
        return 0
    sync.check_stores(pending, args.tracking_uri)
    failed = 0
    for path, result in pending:
        logged = sync.sync_one(path, result, args.tracking_uri)
        failed += logged is None
        print(f"{path}: {said(logged)}")
    return 1 if failed else 0


def said(logged) -> str:
    """What became of one result: uploaded, found in MLflow already, or kept on disk."""
    if logged is None:
        return "still unreachable, kept on disk"
    if logged.new:
        return f"MLflow run {logged.run_id}"
    return f"in MLflow already as run {logged.run_id}: not uploaded again"
