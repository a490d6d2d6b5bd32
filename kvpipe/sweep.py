"""Multirun: one MLflow parent run per sweep, every job a child, and no job able to stop the rest.

A Hydra callback opens the sweep (parent run, job count, start time, written to kvpipe_sweep.json
in the sweep dir so that jobs in other processes find it too) and closes it (summary, compare,
exit status). Each job runs through `run_sweep_job`, which turns every outcome into a record:
FINISHED, SKIPPED (invalid combination, duplicate, or already done with resume=true) or FAILED.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from kvpipe.errors import ConfigError, KvpipeError
from kvpipe.pipeline import run_pipeline
from kvpipe.record import recorder, tracking
from kvpipe.record.result import Result, iter_results
from kvpipe.record.summary import print_sweep_summary
from kvpipe.spec import make_spec

log = logging.getLogger(__name__)

STATE_FILE = "kvpipe_sweep.json"


@dataclass
class SweepState:
    name: str
    total_jobs: int
    started_at: float
    parent_run_id: str | None

    @classmethod
    def load(cls, sweep_dir: Path) -> "SweepState | None":
        path = sweep_dir / STATE_FILE
        return cls(**json.loads(path.read_text())) if path.is_file() else None

    def save(self, sweep_dir: Path) -> None:
        sweep_dir.mkdir(parents=True, exist_ok=True)
        (sweep_dir / STATE_FILE).write_text(json.dumps(self.__dict__, indent=2))


def count_jobs(config: DictConfig) -> int:
    """How many jobs the sweep makes: command-line overrides plus a preset's hydra.sweeper.params,
    expanded as Hydra's basic sweeper does (the command line wins over the preset): the product of
    each key's sweep length, a later override of a key replacing an earlier one."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    task = parser.parse_overrides(list(config.hydra.overrides.task))
    params = config.hydra.sweeper.get("params") or {}
    preset = parser.parse_overrides([f"{k}={v}" for k, v in params.items()])
    lengths = {}
    for override in [*preset, *task]:
        swept = override.is_sweep_override() and override.is_discrete_sweep()
        lengths[override.get_key_element()] = len(list(override.sweep_string_iterator())) if swept else 1
    return math.prod(lengths.values())


def sweep_name(config: DictConfig) -> str:
    if config.get("sweep_name"):
        return str(config.sweep_name)
    # resume=true must not rename the sweep: the name is how a resumed sweep finds its killed parent
    overrides = [o for o in config.hydra.overrides.task if not o.startswith("resume=")]
    return " ".join(overrides) or "sweep"


class SweepCallback(Callback):
    """Registered in conf/config.yaml under hydra.callbacks."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        launch_dir = Path(config.hydra.runtime.cwd)
        total = count_jobs(config)
        name = sweep_name(config)
        tracking_cfg = OmegaConf.to_object(config.tracking)
        parent = None
        if tracking_cfg.enabled and config.get("resume"):
            closed = tracking.close_stale_parents(tracking_cfg, launch_dir, name)
            if closed:
                log.info("resume: marked %d interrupted parent run(s) of %r KILLED", closed, name)
        if tracking_cfg.enabled:
            parent = tracking.start_parent(
                tracking_cfg,
                launch_dir,
                name,
                {"kvpipe.sweep_dir": str(sweep_dir.resolve()), "kvpipe.total_jobs": str(total)},
            )
        SweepState(name=name, total_jobs=total, started_at=time.time(), parent_run_id=parent).save(sweep_dir)
        log.info("sweep %r: %d jobs%s", name, total, f", MLflow parent run {parent}" if parent else "")

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        state = SweepState.load(sweep_dir)
        counts = outcome_counts(sweep_dir)
        if state and state.parent_run_id:
            tracking_cfg = OmegaConf.to_object(config.tracking)
            try:
                tracking.end_parent(
                    tracking_cfg,
                    Path(config.hydra.runtime.cwd),
                    state.parent_run_id,
                    "FAILED" if counts["failed"] else "FINISHED",
                    counts,
                )
                from kvpipe.decide import compare  # pandas and matplotlib: only when a sweep ends

                compare.summarise_sweep(config, state.parent_run_id, sweep_dir)
            except tracking.TrackingUnavailable as exc:
                log.warning(
                    "%s; the sweep's results are safe in %s; upload them with: kvpipe sync %s",
                    exc,
                    sweep_dir,
                    sweep_dir,
                )
        print_sweep_summary(counts, sweep_dir, state.parent_run_id if state else None)
        if counts["failed"]:
            sys.exit(1)  # a sweep with failed jobs fails, after every job has had its turn


def outcome_counts(sweep_dir: Path) -> dict[str, int]:
    counts = {"finished": 0, "skipped": 0, "failed": 0}
    for _, result in iter_results(sweep_dir):
        status = result.status.lower()
        counts[status if status in counts else "failed"] += 1
    return counts


def run_sweep_job(cfg: DictConfig, hydra_cfg, launch_dir: Path) -> str:
    """One job of a multirun. Never raises for a job's own failure: the sweep goes on."""
    run_dir = Path(hydra_cfg.runtime.output_dir)
    sweep_dir = Path(hydra_cfg.sweep.dir)
    state = SweepState.load(sweep_dir)
    overrides = list(hydra_cfg.overrides.task)
    _announce(hydra_cfg.job.num, state, overrides)
    config = OmegaConf.to_container(cfg, resolve=True)
    try:
        spec = make_spec(cfg, overrides)
    except KvpipeError as exc:
        return _skip(run_dir, config, str(exc))
    key = spec.measurement_key()
    earlier = _earlier_job_with_key(sweep_dir, run_dir, key)
    if earlier:
        reason = f"measures the same as job {earlier} (settings this strategy ignores differ)"
        return _skip(run_dir, spec.as_dict(), reason, key)
    if cfg.get("resume") and spec.tracking.enabled:
        done = tracking.finished_run_with_key(spec.tracking, launch_dir, key)
        if done:
            return _skip(run_dir, spec.as_dict(), f"already FINISHED as MLflow run {done} (resume=true)", key)
    parent = state.parent_run_id if state else None
    try:
        run_pipeline(spec, run_dir, launch_dir, print_table=False, parent_run_id=parent)
        return "FINISHED"
    except ConfigError as exc:  # found once the model's shape is known: an invalid combination
        return _skip(run_dir, spec.as_dict(), str(exc), key)
    except KeyboardInterrupt:  # the job's run is already KILLED; the sweep's parent follows it
        if parent:
            tracking.end_parent(spec.tracking, launch_dir, parent, "KILLED", outcome_counts(sweep_dir))
        raise
    except Exception as exc:  # noqa: BLE001 - recorded as FAILED, and the sweep goes on
        log.error("job %s failed: %s", hydra_cfg.job.num, exc)
        failed = Result.unfinished(
            spec.as_dict(), "FAILED", f"{type(exc).__name__}: {exc}", traceback.format_exc(), measurement_key=key
        )
        recorder.record(spec, failed, run_dir, launch_dir, parent)
        return "FAILED"


def _skip(run_dir: Path, config: dict, reason: str, key: str | None = None) -> str:
    log.warning("skipped: %s", reason)
    Result.unfinished(config, "SKIPPED", reason, measurement_key=key).save(run_dir)
    return "SKIPPED"


def _earlier_job_with_key(sweep_dir: Path, run_dir: Path, key: str) -> str | None:
    for path, result in iter_results(sweep_dir):
        if path.parent != run_dir and result.measurement_key == key and result.status == "FINISHED":
            return path.parent.name
    return None


def _announce(index: int, state: SweepState | None, overrides: list[str]) -> None:
    total = state.total_jobs if state else "?"
    eta = ""
    if state and index:
        elapsed = time.time() - state.started_at
        eta = f" · ETA {_duration(elapsed / index * (state.total_jobs - index))}"
    message = f"job {index + 1}/{total}: {' '.join(overrides) or '(defaults)'}{eta}"
    if sys.stderr.isatty():
        from rich.console import Console

        Console(stderr=True).rule(message)
    else:
        log.info(message)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
