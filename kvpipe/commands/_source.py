"""Which recorded runs a subcommand reads: --experiment, --parent and tracking.uri=URI."""

from __future__ import annotations

import argparse

from kvpipe.record.store import add_store_argument


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    """--experiment, --parent, tracking.uri=URI (compare and recommend)."""
    parser.add_argument("--experiment", default="kvpipe", help="MLflow experiment (default: kvpipe)")
    parser.add_argument("--parent", metavar="RUN_ID", help="a sweep's parent run (default: the latest sweep)")
    add_store_argument(parser, "the MLflow store to read")
