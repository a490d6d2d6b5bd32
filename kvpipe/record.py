"""Record stage: result.json first (always), then MLflow (when tracking is on)."""

from __future__ import annotations

import json
import math
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from kvpipe.plan import Plan
from kvpipe.runner import JobResult

RESULT_FILE = "result.json"


def result_document(plan: Plan, result: JobResult, status: str = "FINISHED") -> dict:
    return {
        "status": status,
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "measurement_key": plan.measurement_key(),
        "config": plan.as_dict(),
        "metrics": {k: _json_number(v) for k, v in result.metrics.items()},
        "tags": result.tags,
        "notes": result.notes,
        "texts": result.texts,
    }


def unfinished_document(plan_dict: dict, status: str, reason: str, traceback_text: str = "") -> dict:
    """result.json for a job that did not measure: SKIPPED (with why) or FAILED (with the error)."""
    document = {
        "status": status,
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": plan_dict,
        "reason": reason,
        "metrics": {},
        "tags": {},
    }
    if traceback_text:
        document["traceback"] = traceback_text
    return document


def write_result(run_dir: Path, document: dict) -> Path:
    """Write result.json atomically: a crash never leaves half a file."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / RESULT_FILE
    with tempfile.NamedTemporaryFile("w", dir=run_dir, suffix=".tmp", delete=False) as handle:
        json.dump(document, handle, indent=2)
        handle.write("\n")
    os.replace(handle.name, path)
    return path


def _json_number(value: float):
    # JSON has no NaN; null says "not measured" plainly.
    return None if isinstance(value, float) and not math.isfinite(value) else value
