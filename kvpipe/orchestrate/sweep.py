"""Multirun: one MLflow parent run per sweep, every job a child, and no job able to stop the rest.

A Hydra callback opens the sweep (parent run, job count, start time, written to kvpipe_sweep.json
in the sweep dir so that jobs in other processes find it too) and closes it (summary, compare,
exit status). Each job runs through `run_sweep_job`, which turns every outcome into a record:
FINISHED, SKIPPED (invalid combination, or a rule of kvpipe.orchestrate.skips: a duplicate, or
already done with resume=true) or FAILED.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from kvpipe.errors import ConfigError, KvpipeError, fail
from kvpipe.job import runner
from kvpipe.jobspec import make_spec, reject_unknown_keys
from kvpipe.model import loading
from kvpipe.orchestrate import closing, eta, on_node, skips
from kvpipe.orchestrate.pipeline import record_killed, record_measured, run_pipeline
from kvpipe.record import auth, recorder, store, tracking, worker
from kvpipe.record import tags as mlflow_tags
from kvpipe.record.report import print_sweep_end
from kvpipe.record.result import Result, iter_results
from kvpipe.schedule import QUIET_WAIT_S, check_quiet_wait, check_turn

log = logging.getLogger(__name__)

STATE_FILE = "kvpipe_sweep.json"


@dataclass
class SweepState:
    name: str
    total_jobs: int
    started_at: float
    parent_run_id: str | None
    planned_jobs: list[list[str]] | None = None  # a grid's jobs' overrides, by job number; a search plans none

    @classmethod
    def load(cls, sweep_dir: Path) -> "SweepState | None":
        path = sweep_dir / STATE_FILE
        return cls(**json.loads(path.read_text())) if path.is_file() else None

    def save(self, sweep_dir: Path) -> None:
        sweep_dir.mkdir(parents=True, exist_ok=True)
        (sweep_dir / STATE_FILE).write_text(json.dumps(self.__dict__, indent=2))


def swept_values(config: DictConfig) -> dict[str, list[str]]:
    """Every key the sweep sets and its values: command-line overrides plus a preset's
    hydra.sweeper.params, read as Hydra's basic sweeper reads them (the command line wins over the
    preset, a later override of a key replaces an earlier one). resume= is not part of the sweep."""
    values = {}
    for override in _parsed_overrides(config, [o for o in config.hydra.overrides.task if not o.startswith("resume=")]):
        swept = override.is_sweep_override() and override.is_discrete_sweep()
        key = override.get_key_element().lstrip("+~")  # +experiment=... sets `experiment`
        values[key] = list(override.sweep_string_iterator()) if swept else [override.get_value_element_as_str()]
    return values


def planned_jobs(config: DictConfig) -> list[list[str]]:
    """Each job's overrides, by job number, as Hydra's basic sweeper (which kvpipe's grid wraps) makes them."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    batches = BasicSweeper.split_arguments(_parsed_overrides(config, list(config.hydra.overrides.task)), None)
    return [job for batch in batches for job in batch]


def _parsed_overrides(config: DictConfig, task: list[str]) -> list:
    """A preset's hydra.sweeper.params, then the command line's overrides, parsed as the basic sweeper does."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = config.hydra.sweeper.get("params") or {}
    return OverridesParser.create().parse_overrides([*(f"{k}={v}" for k, v in params.items()), *task])


def is_search(config: DictConfig) -> bool:
    """hydra/sweeper=search (kvpipe.orchestrate.search): trials chosen as it goes, not a grid."""
    return "trials" in (config.hydra.get("sweeper") or {})


def count_jobs(config: DictConfig) -> int:
    """How many jobs the sweep makes: the product of each key's number of values, or a search's
    trial budget."""
    if is_search(config):
        return int(config.hydra.sweeper.trials)
    return math.prod(len(values) for values in swept_values(config).values())


def sweep_name(config: DictConfig) -> str:
    """The MLflow parent run's name: sweep_name, else the preset's, else the keys it sweeps."""
    if config.get("sweep_name"):
        return str(config.sweep_name)
    if is_search(config):
        given = [o for o in config.hydra.overrides.task if not o.startswith("resume=")]
        return "search of the cache space" + (f" · {' '.join(given)}" if given else "")
    keys = [key for key, values in swept_values(config).items() if len(values) > 1]
    return "sweep over " + " × ".join(keys) if keys else "sweep"


class SweepCallback(Callback):
    """Registered in conf/config.yaml under hydra.callbacks."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        if not jobs_run_here(config):
            _sweep_dir_absolute(config)
        sweep_dir = Path(config.hydra.sweep.dir)
        launch_dir = Path(config.hydra.runtime.cwd)
        try:  # before any job loads a model; Hydra only warns of a callback's exceptions, an exit it lets through
            why_sequential = one_after_another(config, config.hydra)
            reject_unknown_keys(config)  # a misspelt key or +group is in every job: not an invalid combination
            check_turn(config.hydra.launcher.get("turn", "call"))  # before the launcher is built
            check_quiet_wait(config.hydra.launcher.get("quiet_wait_s", 0))
        except ConfigError as exc:
            fail(str(exc))
        planned = None if is_search(config) else planned_jobs(config)
        if pairs_on_node(config, config.hydra, why_sequential):
            log.warning(on_node.limits_line(launcher_name(config.hydra), on_node.baseline_strategy(planned)))
        elif why_sequential and why_sequential != "interleave=false":
            log.warning("measuring the jobs one after another, not in interleaved rounds: %s", why_sequential)
        total = count_jobs(config)
        name = sweep_name(config)
        swept = {key: ",".join(values) for key, values in swept_values(config).items()}
        tracking_cfg = OmegaConf.to_object(config.tracking)
        parent = None
        tags = {
            mlflow_tags.SWEEP_DIR: str(sweep_dir.resolve()),
            mlflow_tags.TOTAL_JOBS: str(total),
            mlflow_tags.MEASURED_ORDER: "sequential" if why_sequential else "interleaved",
        }
        try:
            if tracking_cfg.enabled:  # credentials checked before any job loads a model
                # a search asked again (or resumed after a kill) continues its study: its parent too
                reopen = bool(config.get("resume") or is_search(config))
                parent = _open_parent(config, tracking_cfg, launch_dir, name, swept, tags, reopen)
        except auth.TrackingRefused as exc:  # Hydra only warns of a callback's exceptions; an exit it lets through
            worker.stop()
            fail(str(exc))
        except store.TrackingUnavailable as exc:  # Hydra would only warn and lose the sweep's state
            worker.stop()
            log.warning("%s; the sweep runs without a parent run, its results safe on disk", exc)
        state = SweepState(name=name, total_jobs=total, started_at=time.time(), parent_run_id=parent,
                           planned_jobs=planned)  # fmt: skip
        state.save(sweep_dir)
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
                closing.summarise_sweep(config, state.parent_run_id, sweep_dir)
            except store.TrackingUnavailable as exc:
                log.warning(
                    "%s; the sweep's results are safe in %s; upload them with: kvpipe sync %s",
                    exc,
                    sweep_dir,
                    sweep_dir,
                )
        # refused or unreachable while the sweep ran: measured, on disk, not in MLflow
        kept = [result for _, result in iter_results(sweep_dir) if result.mlflow_error and not result.mlflow_run_id]
        print_sweep_end(counts, sweep_dir, state.parent_run_id if state else None, len(kept))
        if kept:
            log.error("%s; the results are safe on disk: kvpipe sync %s", kept[-1].mlflow_error, sweep_dir)
        worker.stop()
        if counts["failed"] or kept:
            sys.exit(1)  # a sweep with failed or unrecorded jobs fails, after every job has had its turn


def _sweep_dir_absolute(config: DictConfig) -> None:
    """The sweep folder as an absolute path, for this process and every job's composition: a process
    a launcher starts need not start where the sweep was launched (a Ray worker starts where its node
    did), and Hydra places a job's folder under the sweep folder as the job's process sees it."""
    from omegaconf import flag_override

    sweep_dir = Path(str(config.hydra.sweep.dir))
    if sweep_dir.is_absolute():
        return
    absolute = str(Path(config.hydra.runtime.cwd) / sweep_dir)
    quoted = "'" + absolute.replace("\\", "\\\\").replace("'", "\\'") + "'"
    with flag_override(config, ["struct", "readonly"], [False, False]):
        config.hydra.sweep.dir = absolute
        config.hydra.overrides.hydra.append(f"hydra.sweep.dir={quoted}")  # each job's config is composed anew


def _open_parent(config, tracking_cfg, launch_dir: Path, name: str, swept: dict, tags: dict, reopen: bool) -> str:
    """The sweep's parent run, once its credentials pass. Where the jobs run in this process and
    MLflow is not imported yet, a tracking worker (kvpipe.record.worker) imports it and opens the
    parent on the other core, while this process imports torch and transformers for the first job."""
    args = (tracking_cfg, launch_dir, name, swept, tags, reopen)
    if not _worker_helps(config):
        return tracking.open_parent(*args)
    try:
        worker.start()
    except OSError as exc:  # no second process to be had: the sweep's own does it all, as it used to
        log.debug("no tracking worker (%s)", exc)
        return tracking.open_parent(*args)
    client = store.client_modules(store.store_paths(tracking_cfg, launch_dir)[0])
    worker.submit("kvpipe.record.worker", "import_modules", client)
    worker.submit("kvpipe.record.tracking", "open_parent", *args)
    later = (  # what the jobs' logging and the sweep's end import, in the worker while this process imports torch
        "mlflow.data.pandas_dataset",  # MLflow's logging of a job: its datasets pull in pandas
        "git",  # MLflow tags each run with the source commit through GitPython
        "kvpipe.decide.compare",  # the compare at the sweep's end
        "matplotlib.figure",
        "matplotlib.backends.backend_agg",
    )
    worker.submit("kvpipe.record.worker", "import_modules", later)
    try:
        loading.import_libraries()
    except KeyboardInterrupt:  # the worker, deaf to Ctrl-C, goes on: close the parent it opens as KILLED
        with contextlib.suppress(Exception):
            worker.result()
            tracking.end_parent(tracking_cfg, launch_dir, worker.result(), "KILLED", {})
        raise
    worker.result()
    parent = worker.result()
    worker.result()  # the worker idle before the first job measures
    return parent


def _worker_helps(config: DictConfig) -> bool:
    """Where the jobs run in this process and MLflow is not imported yet: a process that has it
    already saves nothing."""
    return jobs_run_here(config) and "mlflow" not in sys.modules


def jobs_run_here(config: DictConfig) -> bool:
    """Whether the launcher runs the jobs in this process (Hydra's basic launcher, kvpipe's
    interleaved one); joblib, submitit and Ray start processes of their own."""
    return launcher_runs_jobs_here(config.hydra)


def launcher_runs_jobs_here(hydra_cfg) -> bool:
    """jobs_run_here, from the hydra node (a job's HydraConfig, or the sweep config's `hydra`)."""
    return str(hydra_cfg.launcher.get("_target_", "")).endswith((".BasicLauncher", TAKES_TURNS))


def outcome_counts(sweep_dir: Path) -> dict[str, int]:
    counts = {"finished": 0, "skipped": 0, "failed": 0}
    for _, result in iter_results(sweep_dir):
        status = result.status.lower()
        counts[status if status in counts else "failed"] += 1
    return counts


INTERLEAVE_CHOICES = ("auto", "true", "false")
TAKES_TURNS = "KvpipeInterleavedLauncher"  # the launcher that can (hydra/launcher=interleaved, the default)


def interleave_setting(config: DictConfig) -> str:
    """`interleave`: auto (where the launcher can), true (required) or false; raises ConfigError."""
    value = str(config.get("interleave", "auto")).lower()
    if value not in INTERLEAVE_CHOICES:
        raise ConfigError("interleave", config.get("interleave"), f"expected one of {', '.join(INTERLEAVE_CHOICES)}")
    return value


def one_after_another(config: DictConfig, hydra_cfg) -> str | None:
    """Why this sweep's jobs are measured one after another, or None where they take turns.
    Raises ConfigError where interleave=true meets a launcher that runs each job in its own process."""
    setting = interleave_setting(config)
    if setting == "false":
        return "interleave=false"
    if str(hydra_cfg.launcher.get("_target_", "")).endswith(TAKES_TURNS):
        return None
    reason = f"hydra/launcher={launcher_name(hydra_cfg)} runs each job to its end (or in a process of its own), so jobs cannot take turns"
    if setting == "true":
        raise ConfigError("interleave", "true", f"expected auto or false: {reason}; hydra/launcher=interleaved can")
    return reason


@dataclass
class Deferred:
    """A sweep job loaded and warmed up, waiting for the rounds it shares with the others
    (kvpipe.orchestrate.interleave); finish(order_tags) summarises and records it, and returns its
    status; kill() records it KILLED."""

    job: object  # kvpipe.job.phases.Job: a batch job or a served one
    finish: Callable[[dict], str]
    kill: Callable[[], None]


def run_sweep_job(cfg: DictConfig, hydra_cfg, launch_dir: Path) -> str | Deferred:
    """One job of a multirun: measured now, or (where the sweep's jobs take turns) prepared and
    handed back as Deferred. Never raises for a job's own failure: the sweep goes on."""
    run_dir = Path(hydra_cfg.runtime.output_dir)
    sweep_dir = Path(hydra_cfg.sweep.dir)
    state = SweepState.load(sweep_dir)
    overrides = list(hydra_cfg.overrides.task)
    why_sequential = one_after_another(cfg, hydra_cfg)  # checked at the sweep's start: it cannot raise here
    # where the jobs take turns, the rounds are what takes the time, and no ETA is known yet
    eta_shown = _eta(hydra_cfg.job.num, state, hydra_cfg) if why_sequential is not None else ""
    _announce(hydra_cfg.job.num, state, overrides, eta_shown)
    config = OmegaConf.to_container(cfg, resolve=True)
    parent = state.parent_run_id if state else None
    skip = skips.Skipper(run_dir, launch_dir, parent, overrides, cfg)
    try:
        spec = make_spec(cfg, overrides)
    except KvpipeError as exc:
        return skip(config, str(exc))
    key = spec.measurement_key()
    skipped = skips.reason_to_skip(spec, key, bool(cfg.get("resume")), sweep_dir, run_dir, launch_dir, parent)
    if skipped:
        reason, shown = skipped
        return skip(spec.as_dict(), reason, key, spec, log_to_mlflow=shown)

    def guarded(work: Callable[[], object]):
        """work()'s value; a job's own failure recorded as SKIPPED (an invalid combination) or FAILED."""
        try:
            return work()
        except ConfigError as exc:  # found once the model's shape is known: an invalid combination
            return skip(spec.as_dict(), str(exc), key, spec)
        except KeyboardInterrupt:  # the job's run is already KILLED; the sweep's parent follows it
            if parent:
                tracking.end_parent(spec.tracking, launch_dir, parent, "KILLED", outcome_counts(sweep_dir))
            raise
        except Exception as exc:  # noqa: BLE001 - recorded as FAILED, and the sweep goes on
            log.error("job %s failed: %s", hydra_cfg.job.num, exc)
            failed = Result.unfinished(
                spec.as_dict(), "FAILED", f"{type(exc).__name__}: {exc}", traceback.format_exc(),
                measurement_key=key, spec=spec,
            )  # fmt: skip
            recorder.record(spec, failed, run_dir, launch_dir, parent)
            return "FAILED"

    def measure_now(order_tags: dict) -> str:
        run_pipeline(spec, run_dir, launch_dir, False, parent, check_store=False, order_tags=order_tags)
        return "FINISHED"

    partner = pair_partner(cfg, hydra_cfg, state, overrides, why_sequential)
    if partner is not None:
        return guarded(lambda: measure_beside_baseline(spec, partner, hydra_cfg, run_dir, launch_dir, parent, key))
    if why_sequential is not None:
        return guarded(lambda: measure_now({"measured_order": "sequential", "order_reason": why_sequential}))

    def kill(job=None) -> None:
        if job is not None:
            job.close()
        skips.unmark_pending(run_dir)
        record_killed(spec, run_dir, launch_dir, parent)

    def finish(job, order_tags: dict) -> str:
        skips.unmark_pending(run_dir)

        def measured():
            try:
                return job.result(order_tags)
            finally:
                job.close()  # its engine's server, once its figures are read

        return guarded(lambda: record_measured(spec, measured, run_dir, launch_dir, False, parent) and "FINISHED")

    def prepare() -> Deferred:
        for warning in spec.warnings:
            log.warning(warning)
        job = runner.job_for(spec)
        job.label = f"#{hydra_cfg.job.num}"
        skips.mark_pending(run_dir, key)  # a later job with the same key is its duplicate, as with a finished one
        try:
            job.prepare()
        except KeyboardInterrupt:
            kill(job)
            raise
        except BaseException:
            job.close()
            skips.unmark_pending(run_dir)
            raise
        return Deferred(job, lambda order_tags: finish(job, order_tags), lambda: kill(job))

    return guarded(prepare)


def pair_partner(
    cfg: DictConfig, hydra_cfg, state: SweepState | None, overrides: list[str], why_sequential
) -> list[str] | None:
    """The baseline copy's overrides where this job takes turns with one in its own process
    (pairs_on_node, and a cache other than the baseline's); else None."""
    if not pairs_on_node(cfg, hydra_cfg, why_sequential):
        return None
    return on_node.partner_overrides(overrides, state.planned_jobs if state else None)


def pairs_on_node(cfg: DictConfig, hydra_cfg, why_sequential: str | None) -> bool:
    """Whether each job takes turns with a copy of the baseline in its own process
    (kvpipe.orchestrate.on_node): a launcher that runs jobs in processes of their own (not Hydra's
    basic one, which measures one after another, as asked), pair_on_node on, interleave not off."""
    if why_sequential is None or why_sequential == "interleave=false" or not cfg.get("pair_on_node", True):
        return False
    return not launcher_runs_jobs_here(hydra_cfg)


def measure_beside_baseline(spec, partner: list[str], hydra_cfg, run_dir: Path, launch_dir: Path, parent, key) -> str:
    """The job and a copy of the sweep's baseline, prepared in this process (one model load) and
    measured in turns by call; the job recorded with the copy's calls beside its own."""
    import uuid

    from kvpipe.schedule import run_rounds

    base_spec = make_spec(on_node.compose_partner(hydra_cfg, partner), partner)
    job, base = runner.job_for(spec), runner.job_for(base_spec)
    job.label, base.label = f"#{hydra_cfg.job.num}", "baseline copy"
    log.info("measured in turns by call beside a copy of the baseline (%s), in this process", " ".join(partner))
    skips.mark_pending(run_dir, key)
    try:
        try:
            base.prepare()
            job.prepare()
            run_rounds([base, job], int(spec.workload.seed), shuffle=True, turn="call",
                       quiet_wait_s=float(hydra_cfg.launcher.get("quiet_wait_s", QUIET_WAIT_S)))  # fmt: skip
        except KeyboardInterrupt:  # record_measured records a Ctrl-C in the summary itself
            record_killed(spec, run_dir, launch_dir, parent)
            raise
        order_tags = {
            "measured_order": on_node.MEASURED_ORDER,
            "order_reason": f"hydra/launcher={launcher_name(hydra_cfg)} runs each job in a process of its own",
            "round_group": uuid.uuid4().hex[:12],
            **on_node.pair_tags(base, base.cache_label, partner),
        }
        record_measured(spec, lambda: job.result(order_tags), run_dir, launch_dir, False, parent)
    finally:
        base.close()
        job.close()
        skips.unmark_pending(run_dir)
    return "FINISHED"


def launcher_name(hydra_cfg) -> str:
    """The launcher as the user chose it (hydra/launcher=ray_cluster), else its class."""
    return hydra_cfg.runtime.choices.get("hydra/launcher") or str(hydra_cfg.launcher.get("_target_", ""))


def _eta(index: int, state: SweepState | None, hydra_cfg) -> str:
    """' · ETA 42s' as job `index` begins, from what the sweep's jobs measured so far (kvpipe.orchestrate.eta);
    '' before any has."""
    if state is None:
        return ""
    results = [result for _, result in iter_results(Path(hydra_cfg.sweep.dir))]
    workers = side_by_side(hydra_cfg)
    estimate = eta.sweep_estimate(results, state.planned_jobs, index, state.total_jobs, state.started_at, workers)
    return f" · {estimate.text()}" if estimate else ""


def side_by_side(hydra_cfg) -> int:
    """How many jobs the launcher runs at once: joblib's n_jobs (-1: one per core, as joblib reads it), else 1."""
    n_jobs = int(hydra_cfg.launcher.get("n_jobs") or 1)
    return n_jobs if n_jobs > 0 else max(1, (os.cpu_count() or 1) + 1 + n_jobs)


def _announce(index: int, state: SweepState | None, overrides: list[str], eta_shown: str = "") -> None:
    total = state.total_jobs if state else "?"
    message = f"job {index + 1}/{total}: {' '.join(overrides) or '(defaults)'}{eta_shown}"
    if sys.stderr.isatty():
        from rich.console import Console

        Console(stderr=True).rule(message)
    else:
        log.info(message)
