"""Recorded runs read back from MLflow as one table (a pandas frame, a row per run, MLflow's
`metrics.*`, `params.*` and `tags.*` columns): one sweep's, or a whole experiment's. What the
columns mean for a decision (labels, memory, quality loss, the Pareto front) is kvpipe.decide.runs'."""

from __future__ import annotations

import os
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import pandas as pd

from kvpipe.errors import ConfigError, KvpipeError
from kvpipe.record import tags as mlflow_tags
from kvpipe.record.auth import check_uri, refusals, status_of
from kvpipe.record.result import RESULT_FILE, Result, iter_results
from kvpipe.record.store import point_mlflow_at, resolve_uri
from kvpipe.record.table import RunRecord
from kvpipe.workload import Answer, Step

FINISHED = f"attributes.status = 'FINISHED' and {mlflow_tags.equals(mlflow_tags.STATUS, 'FINISHED')}"
KEY = mlflow_tags.column(mlflow_tags.KEY)
PROGRESS_BAR_ENV = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"  # mlflow.environment_variables' name for it


def read_runs(
    experiment: str,
    parent: str | None,
    tracking_uri: str | None,
    whole_experiment: bool = False,
    spelled: str = "--tracking-uri",
    every_repeat: bool = False,
):
    """(FINISHED runs, parent Run or None): one sweep's, or the whole experiment's.
    A measurement run again counts once, its latest run, unless every_repeat (a calibration: each run
    of a length is a sample of it)."""
    uri, said = resolve_uri(tracking_uri, Path.cwd(), spelled)
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        # MLflow would create an empty database and then find nothing in it
        raise KvpipeError(
            f"{said}: no MLflow store there; run from the folder the runs were launched in (its "
            "outputs/mlflow.db), or name the store with tracking.uri=URI or MLFLOW_TRACKING_URI"
        )
    check_uri(uri, said)
    point_mlflow_at(uri)
    what = f"the experiment of run {parent}" if parent else f"experiment {experiment!r}"
    with refusals(said, what, "read"):  # a server's 401 or 403 as one line, before anything else is said
        return _read_runs(experiment, parent, uri, whole_experiment, every_repeat)


def _read_runs(experiment: str, parent: str | None, uri: str, whole_experiment: bool, every_repeat: bool = False):
    import mlflow
    from mlflow.exceptions import MlflowException

    if parent:
        try:
            parent_run = mlflow.get_run(parent)
        except MlflowException as exc:
            if status_of(exc):
                raise
            parent_run = _run_by_prefix(parent)
            if parent_run is None:
                raise ConfigError(
                    "--parent",
                    parent,
                    f"no such run in {uri}; expected a sweep's parent run id, or no --parent for the latest sweep",
                ) from None
        if parent_run.data.tags.get(mlflow_tags.SWEEP) != "true":
            raise ConfigError("--parent", parent, "that run is one job, not a sweep; expected a sweep's parent run")
        experiment_id = parent_run.info.experiment_id
    else:
        found = mlflow.get_experiment_by_name(experiment)
        if found is None:
            names = ", ".join(e.name for e in mlflow.search_experiments())
            raise ConfigError("--experiment", experiment, f"no such experiment in {uri}; expected one of: {names}")
        experiment_id, parent_run = found.experiment_id, None
        if not whole_experiment:
            sweeps = mlflow.search_runs(
                [experiment_id],
                mlflow_tags.equals(mlflow_tags.SWEEP, "true"),
                max_results=1,
                order_by=["attributes.start_time DESC"],
                output_format="list",
            )
            if not sweeps:
                raise ConfigError(
                    "--experiment",
                    experiment,
                    "it holds no sweep yet; run one with `python -m kvpipe -m cache=dynamic,static,quantized`",
                )
            parent_run = sweeps[0]
    runs = _search(experiment_id, FINISHED) if parent_run is None else _sweep_runs(experiment_id, parent_run)
    if runs.empty:
        if parent_run is None:
            raise KvpipeError(f"experiment {experiment!r} has no FINISHED runs; {UNMEASURED}")
        raise KvpipeError(f"sweep {parent_run.info.run_id} has no FINISHED runs; {_why_none(_sweep_dir(parent_run))}")
    return (runs.reset_index(drop=True) if every_repeat else _latest_per_key(runs)), RunRecord.of(parent_run)


SHORT_ID = 8  # the run id's characters a sweep's title prints
UNMEASURED = "its jobs failed or were skipped (see their result.json)"
REASONS_SHOWN = 3


def _sweep_dir(parent_run) -> Path:
    return Path(parent_run.data.tags.get(mlflow_tags.SWEEP_DIR, "/nonexistent"))


def _why_none(sweep_dir: Path) -> str:
    """Why a sweep measured nothing, from its jobs' result.json: 'the sweep in DIR measured nothing:
    every job was skipped (REASON; ...)', or how many were skipped and failed; UNMEASURED where its
    folder is not here."""
    results = [result for _, result in iter_results(sweep_dir) if result.status != "FINISHED"]
    if not results:
        return UNMEASURED
    statuses = sorted({result.status.lower() for result in results})
    if len(statuses) == 1:
        what = f"every job was {statuses[0]}" if len(results) > 1 else f"its one job was {statuses[0]}"
    else:
        what = ", ".join(f"{sum(r.status.lower() == s for r in results)} {s}" for s in statuses)
    reasons = list(dict.fromkeys(result.reason for result in results if result.reason))
    more = f"; {len(reasons) - REASONS_SHOWN} more in their result.json" if len(reasons) > REASONS_SHOWN else ""
    return f"the sweep in {sweep_dir} measured nothing: {what} ({'; '.join(reasons[:REASONS_SHOWN])}{more})"


def _run_by_prefix(prefix: str):
    """The one run whose id starts with `prefix` (SHORT_ID characters or more, as titles print
    them), in any experiment; None when none does; a one-line error naming them when several do."""
    import mlflow

    if len(prefix) < SHORT_ID:
        return None
    runs = [r for r in mlflow.search_runs(search_all_experiments=True, output_format="list")
            if r.info.run_id.startswith(prefix)]  # fmt: skip
    if len(runs) > 1:
        ids = ", ".join(r.info.run_id for r in runs)
        raise ConfigError("--parent", prefix, f"more than one run id starts with it ({ids}); give more characters")
    return runs[0] if runs else None


def _search(experiment_id: str, filter_string: str) -> pd.DataFrame:
    import mlflow

    return mlflow.search_runs([experiment_id], filter_string, output_format="pandas")


def _sweep_runs(experiment_id: str, parent_run) -> pd.DataFrame:
    """The sweep's children, plus the earlier runs its jobs were skipped for under resume=true."""
    runs = _search(experiment_id, f"{mlflow_tags.equals(mlflow_tags.PARENT, parent_run.info.run_id)} and {FINISHED}")
    skipped = {r.measurement_key for _, r in iter_results(_sweep_dir(parent_run)) if r.status == "SKIPPED"}
    skipped -= set(runs.get(KEY, ())) | {None}  # a duplicate within the sweep is a child already
    earlier = _search(experiment_id, FINISHED) if skipped else pd.DataFrame()
    if KEY in earlier:  # an experiment with no finished run has no columns at all
        runs = pd.concat([runs, earlier[earlier[KEY].isin(skipped)]])
    return runs


def _latest_per_key(runs: pd.DataFrame) -> pd.DataFrame:
    """One run per measurement, the latest: a re-run replaces its row rather than doubling it."""
    runs = runs.sort_values("start_time") if "start_time" in runs else runs
    if KEY in runs:
        runs = runs[~(runs.duplicated(KEY, keep="last") & runs[KEY].notna())]
    return runs.reset_index(drop=True)


def column(frame: pd.DataFrame, name: str, default=float("nan")) -> pd.Series:
    """frame[name], or `default` in every row where no run has it (numbers stay numbers, the rest objects)."""
    if name in frame:
        return frame[name]
    return pd.Series(default, index=frame.index, dtype=float if isinstance(default, float) else object)


def stepped_history(run_id: str, series: list[str]) -> list[Step]:
    """A run's stepped series from MLflow (a workload's figures by step, kvpipe.workload.Scored),
    every point of each series in turn."""
    return [Step(name, value, step) for name in series for step, value in _metric_history(run_id, name)]


@lru_cache(maxsize=1024)
def _metric_history(run_id: str, key: str) -> tuple[tuple[int, float], ...]:
    """(step, value) of a finished run's metric, fetched once: compare's markdown, terminal table and
    plots all read the same histories."""
    from mlflow.tracking import MlflowClient

    return tuple((point.step, point.value) for point in MlflowClient().get_metric_history(run_id, key))


@lru_cache(maxsize=1024)
def recorded_answers(run_id: str) -> tuple[Answer, ...]:
    """A finished run's answers, as its workload declares them, from the result.json it logged (none
    where it logged none); read once: compare's markdown and terminal table read the same."""
    import tempfile

    import mlflow
    from mlflow.exceptions import MlflowException

    with tempfile.TemporaryDirectory() as folder, _no_progress_bar():
        try:
            path = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=RESULT_FILE, dst_path=folder)
        except (MlflowException, OSError):
            return ()
        result = Result.load(Path(path))
    return tuple(result.scored().answers) if result.answers else ()


@contextmanager
def _no_progress_bar():
    """MLflow draws a progress bar on stderr for every download: for one small file, noise amid
    compare's tables. Its own switch, set for the download alone."""
    before = os.environ.get(PROGRESS_BAR_ENV)
    os.environ[PROGRESS_BAR_ENV] = "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(PROGRESS_BAR_ENV, None)
        else:
            os.environ[PROGRESS_BAR_ENV] = before
