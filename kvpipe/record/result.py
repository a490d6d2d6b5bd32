"""result.json, the product's memory: one dataclass, written atomically, read back by every stage.

The runner's measurements, a sweep's skipped and failed jobs, resume, `kvpipe sync`, compare and
MLflow all go through `Result`; no other module spells its keys.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shlex
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator, Optional

RESULT_FILE = "result.json"
STATUSES = ("FINISHED", "SKIPPED", "FAILED", "KILLED")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _iso(epoch_s: float | None) -> str | None:
    """A wall-clock instant as result.json writes it, to the millisecond (MLflow's resolution)."""
    if epoch_s is None:
        return None
    return datetime.fromtimestamp(epoch_s, timezone.utc).isoformat(timespec="milliseconds")


def _epoch_ms(iso: str | None) -> int | None:
    return None if iso is None else int(datetime.fromisoformat(iso).timestamp() * 1000)


@dataclass
class Result:
    """One job's record. `reason` says why a job did not measure (SKIPPED, FAILED, KILLED); the
    mlflow_* fields are the MLflow reference, or why it is missing (kept for `kvpipe sync`)."""

    status: str
    config: dict
    params: dict[str, str] = field(default_factory=dict)  # the settings the job read, as logged to MLflow
    metrics: dict[str, Optional[float]] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    texts: list[dict[str, str]] = field(default_factory=list)
    answers: Optional[list[dict]] = None  # the workload's own scoring, a row per answer (passkey: per key asked)
    requests: Optional[list[dict]] = None  # a served job's requests, each as it was served (kvpipe.record.requests)
    measurement_key: Optional[str] = None
    # this record's own id, its MLflow run's tag: an upload looks for it first, so no record is in MLflow twice
    job_id: Optional[str] = None
    command: Optional[str] = None  # the command line that produced it, as typed
    overrides: list[str] = field(default_factory=list)  # this job's Hydra overrides (a sweep's: one job's)
    reason: Optional[str] = None
    traceback: Optional[str] = None
    started_at: Optional[str] = None  # when the job began (measured jobs only; older results lack it)
    finished_at: str = field(default_factory=_now)  # when the job ended, or (unmeasured) was recorded
    # what this job's process did once: imports and loading the model; a later job in the same process skips it
    process_setup_s: Optional[float] = None
    mlflow_run_id: Optional[str] = None
    mlflow_parent_run_id: Optional[str] = None
    mlflow_uri: Optional[str] = None
    mlflow_error: Optional[str] = None

    @classmethod
    def finished(cls, spec, job) -> "Result":
        """A measured job: the spec's config and key, and the runner's JobResult."""
        return cls(
            status="FINISHED",
            config=spec.as_dict(),
            params={**spec.params(), **job.params},
            overrides=list(spec.overrides),
            command=command_line(),
            measurement_key=spec.measurement_key(),
            job_id=new_job_id(),
            metrics={name: _json_number(value) for name, value in job.metrics.items()},
            tags=job.tags,
            notes=job.notes,
            texts=job.texts,
            answers=job.scored.rows or None,
            requests=job.requests or None,
            started_at=_iso(job.started_epoch_s),
            finished_at=_iso(job.ended_epoch_s) or _now(),
            process_setup_s=None if job.process_setup_s is None else round(job.process_setup_s, 3),
        )

    @classmethod
    def unfinished(
        cls,
        config: dict,
        status: str,
        reason: str,
        traceback: str | None = None,
        measurement_key: str | None = None,
        spec=None,
        overrides: list[str] | None = None,
    ) -> "Result":
        """A job that did not measure: SKIPPED (with why), FAILED (with the error) or KILLED; with
        its spec's params when it got as far as having one."""
        return cls(
            status=status,
            config=config,
            params=spec.params() if spec else {},
            overrides=list(spec.overrides if spec else overrides or []),
            command=command_line(),
            reason=reason,
            traceback=traceback or None,
            measurement_key=measurement_key,
            job_id=new_job_id(),
        )

    def workload(self):
        """The workload that produced it (a kvpipe.workload.Workload), from its config."""
        from kvpipe import workload

        settings = self.config["workload"]
        return workload.get(settings["kind"])(settings)

    def scored(self):
        """Its workload's own scoring (a kvpipe.workload.Scored), again from the rows it keeps."""
        return self.workload().scored(self.answers or [])

    def span_ms(self) -> tuple[int, int] | None:
        """(start, end) in epoch milliseconds where the job's own start is known: its MLflow run's
        times, so that the run's Duration is the job's, not the few ms its logging took."""
        if self.started_at is None:
            return None
        return _epoch_ms(self.started_at), _epoch_ms(self.finished_at)

    def to_dict(self) -> dict:
        """The JSON document; fields with no value are left out."""
        return {name: value for name, value in dataclasses.asdict(self).items() if value is not None}

    @classmethod
    def from_dict(cls, document: dict) -> "Result":
        known = {f.name for f in dataclasses.fields(cls)}
        if "retrieval" in document and "answers" not in document:  # passkey results written before 0.2
            document = {**document, "answers": document["retrieval"]}
        return cls(**{name: value for name, value in document.items() if name in known})

    @classmethod
    def load(cls, path: Path) -> "Result":
        return cls.from_dict(json.loads(Path(path).read_text()))

    def save(self, run_dir: Path) -> Path:
        """Write run_dir/result.json atomically: a crash never leaves half a file."""
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / RESULT_FILE
        with tempfile.NamedTemporaryFile("w", dir=run_dir, suffix=".tmp", delete=False) as handle:
            json.dump(self.to_dict(), handle, indent=2)
            handle.write("\n")
        os.replace(handle.name, path)
        return path


def new_job_id() -> str:
    """A record's id: random, not derived from its folder or key, so that measuring the same again
    (a rerun into the same folder, a second sweep) is a new record, never mistaken for this one."""
    return uuid.uuid4().hex


COMMAND_ENV = "KVPIPE_COMMAND"  # set by the CLI; inherited by launcher processes, whose own argv differs


def command_line() -> str:
    """The command that started this kvpipe process, as typed."""
    return os.environ.get(COMMAND_ENV) or shlex.join(["python", *sys.argv])


def iter_results(directory: Path, recursive: bool = False) -> Iterator[tuple[Path, Result]]:
    """(path, Result) for each job of a sweep directory (its */result.json), or every result.json
    below it with recursive=True, in path order."""
    paths = directory.rglob(RESULT_FILE) if recursive else directory.glob(f"*/{RESULT_FILE}")
    for path in sorted(paths):
        yield path, Result.load(path)


def _json_number(value: float):
    # JSON has no NaN; null says "not measured" plainly.
    return None if isinstance(value, float) and not math.isfinite(value) else value
