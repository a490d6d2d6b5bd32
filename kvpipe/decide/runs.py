"""Reading recorded runs back from MLflow, for compare and recommend: one sweep's or a whole experiment's."""

from __future__ import annotations

import argparse
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from kvpipe import cache, workload
from kvpipe.errors import ConfigError, KvpipeError
from kvpipe.record.auth import check_uri, refusals, status_of
from kvpipe.record.result import iter_results
from kvpipe.record.store import add_store_argument, point_mlflow_at, resolve_uri

FINISHED = "attributes.status = 'FINISHED' and tags.`kvpipe.status` = 'FINISHED'"
KEY = "tags.kvpipe.measurement_key"
NOT_MEASURED = ("tracking.", "print_table", "resume", "sweep_name", "fallback")
CACHE_PARAMS = ("cache.", "backend.", "axis.")  # the rest says what was measured: the workload


def context_params() -> tuple[str, ...]:
    """Params that set the prompt length (each workload's `context_fields`): the x axis covers them."""
    return ("workload.kind", *(f"workload.{name}" for kind in workload.registered() for name in kind.context_fields))


def in_label() -> set[str]:
    """Params the cache label spells out (quantized:quanto:int4:kivi, static+compile): not columns."""
    return {"cache.strategy", *(name for strategy in cache.registered() for name in strategy.in_label)}


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    """--experiment, --parent, tracking.uri=URI: which runs to read (shared with recommend)."""
    parser.add_argument("--experiment", default="kvpipe", help="MLflow experiment (default: kvpipe)")
    parser.add_argument("--parent", metavar="RUN_ID", help="a sweep's parent run (default: the latest sweep)")
    add_store_argument(parser, "the MLflow store to read")


def load_runs(
    experiment: str,
    parent: str | None,
    tracking_uri: str | None,
    whole_experiment: bool = False,
    spelled: str = "--tracking-uri",
    every_repeat: bool = False,
):
    """(FINISHED runs with derived columns, parent Run or None): one sweep's, or the whole experiment's.
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
        return _load_runs(experiment, parent, uri, whole_experiment, every_repeat)


def _load_runs(experiment: str, parent: str | None, uri: str, whole_experiment: bool, every_repeat: bool = False):
    import mlflow
    from mlflow.exceptions import MlflowException

    if parent:
        try:
            parent_run = mlflow.get_run(parent)
        except MlflowException as exc:
            if status_of(exc):
                raise
            raise ConfigError(
                "--parent",
                parent,
                f"no such run in {uri}; expected a sweep's parent run id, or no --parent for the latest sweep",
            ) from None
        if parent_run.data.tags.get("kvpipe.sweep") != "true":
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
                "tags.`kvpipe.sweep` = 'true'",
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
        where = f"sweep {parent_run.info.run_id}" if parent_run else f"experiment {experiment!r}"
        raise KvpipeError(f"{where} has no FINISHED runs; its jobs failed or were skipped (see their result.json)")
    return with_derived(runs.reset_index(drop=True) if every_repeat else _latest_per_key(runs)), parent_run


def _search(experiment_id: str, filter_string: str) -> pd.DataFrame:
    import mlflow

    return mlflow.search_runs([experiment_id], filter_string, output_format="pandas")


def _sweep_runs(experiment_id: str, parent_run) -> pd.DataFrame:
    """The sweep's children, plus the earlier runs its jobs were skipped for under resume=true."""
    runs = _search(experiment_id, f"tags.`mlflow.parentRunId` = '{parent_run.info.run_id}' and {FINISHED}")
    sweep_dir = Path(parent_run.data.tags.get("kvpipe.sweep_dir", "/nonexistent"))
    skipped = {result.measurement_key for _, result in iter_results(sweep_dir) if result.status == "SKIPPED"}
    skipped -= set(runs.get(KEY, ())) | {None}  # a duplicate within the sweep is a child already
    if skipped:
        earlier = _search(experiment_id, FINISHED)
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


def with_derived(runs: pd.DataFrame) -> pd.DataFrame:
    """Add label, strategy, memory_bytes, quality_loss, context_tokens, workload and pareto columns."""
    runs = runs.copy()
    requested = column(runs, "tags.kvpipe.cache.requested", None).fillna(column(runs, "params.cache.strategy", ""))
    effective = column(runs, "tags.kvpipe.cache.effective", None).fillna(requested)
    runs["strategy"] = effective.str.split(r"[:+]", regex=True).str[0]  # a label starts with its strategy
    # Offloaded on a CPU runs as dynamic: say both, so the row is not mistaken for either.
    runs["label"] = [e if e.startswith(r) else f"{r} (as {e})" for r, e in zip(requested, effective)]
    # peak_memory_bytes is absolute, weights included, on every device. Runs recorded before it was
    # (CPU sources named *_growth measured RSS growth only) get their weights added, once.
    growth = column(runs, "tags.kvpipe.peak_memory_source", "").fillna("").str.endswith("_growth")
    weights = column(runs, "metrics.weights_bytes").fillna(0)
    runs["memory_bytes"] = column(runs, "metrics.peak_memory_bytes") + weights.where(growth, 0)
    # A figure that varied (between calls of one shape, or between a call's tokens) by more than the
    # run's workload.noise_threshold.
    runs["noisy"] = column(runs, "tags.kvpipe.noisy", "").fillna("") == "true"
    # Other processes held cores the job counted on while it measured: every timing is slow alike.
    runs["contended"] = column(runs, "tags.kvpipe.contended", "").fillna("") == "true"
    # Without a quality pass only a lossless strategy has a known loss.
    lossless = pd.Series(0.0, index=runs.index).where(runs["strategy"].map(is_lossless))
    runs["quality_loss"] = column(runs, "metrics.kl_vs_reference").fillna(lossless)
    # The measured prompt length: workload.prompt_tokens means nothing to a chat workload.
    runs["context_tokens"] = column(runs, "metrics.prompt_tokens").fillna(
        pd.to_numeric(column(runs, "params.workload.prompt_tokens"), errors="coerce")
    )
    # A short prompt beats a long one on every axis: strategies compete within one workload only.
    runs["workload"] = describe(runs, [p for p in varying_params(runs) if not p.startswith(CACHE_PARAMS)], full=True)
    runs["pareto"] = False
    for _, group in runs.groupby("workload"):
        runs.loc[group.index, "pareto"] = pareto_front(group)
    return runs


def model_names(runs: pd.DataFrame) -> str:
    """The models the runs measured, by the name their runs carry (model=hf: the folder or hub id)."""
    names = sorted(set(column(runs, "params.model.name", None).dropna()))
    return ", ".join(names) or "an unnamed model"


def environments(runs: pd.DataFrame) -> list[str]:
    """The distinct environments (host, CPU, GPU, versions, threads) the runs were measured in."""
    from kvpipe.measure.environment import ENVIRONMENT_TAGS

    tags = [f"tags.kvpipe.{name}" for name in ENVIRONMENT_TAGS]
    described = [
        " · ".join(f"{name}={value}" for name, value in zip(ENVIRONMENT_TAGS, row) if isinstance(value, str))
        for row in zip(*(column(runs, tag, None) for tag in tags))
    ]
    return sorted(set(described) - {""})


def pareto_front(runs: pd.DataFrame) -> pd.Series:
    """True where no other run is as good on memory, TPOT and quality, and better on one. Quality is
    the KL loss, or, where every run measured passkey retrieval, its accuracy (and KL too when every
    run has it)."""
    axes = [runs["memory_bytes"], column(runs, "metrics.tpot_ms")]
    accuracy = column(runs, "metrics.retrieval_accuracy")
    if accuracy.notna().all():  # passkey runs: retrieval is their quality, KL too where every run has it
        axes.append(-accuracy)  # higher is better
        if runs["quality_loss"].notna().all():
            axes.append(runs["quality_loss"])
    else:
        axes.append(runs["quality_loss"])
    return pd.Series(non_dominated(np.column_stack(axes)), index=runs.index, dtype=bool)


def non_dominated(points) -> list[bool]:
    """For each row of `points` (lower is better on every column): True where it has no NaN and no
    other row is as good on every column and better on one. A row with a NaN makes no claim either way."""
    if len(points) == 0:
        return []
    points = np.asarray(points, dtype=float).reshape(len(points), -1)
    known = points[~np.isnan(points).any(axis=1)]
    return [not np.isnan(p).any() and not ((known <= p).all(axis=1) & (known < p).any(axis=1)).any() for p in points]


def is_lossless(strategy: str) -> bool:
    """From the registry; a strategy no longer registered is not assumed lossless."""
    return strategy in cache.REGISTRY and cache.REGISTRY[strategy].lossless


def _reads(run, param: str) -> bool:
    """Whether this run's strategy (or workload) reads the param, as the measurement key decides."""
    if param.startswith("workload."):
        return workload.reads(run.get("params.workload.kind"), param)
    if not param.startswith(CACHE_PARAMS):
        return True
    strategy = cache.REGISTRY.get(run.get("params.cache.strategy"))
    if strategy is None:
        return True
    read = strategy.read_fields(run.get("params.backend.name"))
    return param in read or f"{param.split('.')[0]}.*" in read


_READ_BY = ("params.workload.kind", "params.cache.strategy", "params.backend.name")  # what _reads looks at


def _read_by(runs: pd.DataFrame) -> list[dict]:
    # the three columns as plain dicts: iterrows would build a Series of every column for every run
    return runs[[c for c in _READ_BY if c in runs.columns]].to_dict("records")


def param_values(runs: pd.DataFrame, param: str, read_by: list[dict] | None = None) -> list[str]:
    """The param as shown: blank where the run's strategy ignores it."""
    read_by = _read_by(runs) if read_by is None else read_by
    values = runs[f"params.{param}"].astype(str).tolist()
    return [value if _reads(run, param) else "" for value, run in zip(values, read_by)]


def varying_params(runs: pd.DataFrame) -> list[str]:
    """Params with more than one value among the runs that read them: llama-bench's columns."""
    names = [c.removeprefix("params.") for c in runs.columns if c.startswith("params.")]
    names = [n for n in names if n not in in_label() and not n.startswith(NOT_MEASURED)]
    read_by = _read_by(runs)  # once, not once a param
    return sorted(n for n in names if len(set(param_values(runs, n, read_by)) - {""}) > 1)


def describe(runs: pd.DataFrame, params: list[str], full: bool = False) -> list[str]:
    """'name=value ...' per run for these params, skipping those its strategy ignores."""
    read_by = _read_by(runs)
    values = {p if full else p.split(".")[-1]: param_values(runs, p, read_by) for p in params}
    return [" ".join(f"{name}={shown[i]}" for name, shown in values.items() if shown[i]) for i in range(len(runs))]


def retrieval_history(run_id: str, keys: list[str]) -> list[dict]:
    """A passkey run's figures per context length, from MLflow's stepped metrics: one dict per
    (key, length) with the value. The step is the context length (kvpipe.workload.passkey.retrieval)."""
    return [
        {"metric": key, "context_tokens": step, "value": value}
        for key in keys
        for step, value in _metric_history(run_id, key)
    ]


@lru_cache(maxsize=1024)
def _metric_history(run_id: str, key: str) -> tuple[tuple[int, float], ...]:
    """(step, value) of a finished run's metric, fetched once: compare's markdown, terminal table and
    plots all read the same histories."""
    from mlflow.tracking import MlflowClient

    return tuple((point.step, point.value) for point in MlflowClient().get_metric_history(run_id, key))


def retrieval_cells(run: pd.Series) -> list[dict]:
    """The run's heatmap cells (context_tokens, depth, retrieval_accuracy), from its stepped metrics."""
    from kvpipe.workload.passkey.retrieval import DEPTH_PREFIX

    keys = [name.removeprefix("metrics.") for name in run.index if name.startswith(f"metrics.{DEPTH_PREFIX}")]
    keys = [key for key in keys if pd.notna(run[f"metrics.{key}"])]
    return [
        {"context_tokens": point["context_tokens"], "depth": float(point["metric"].removeprefix(DEPTH_PREFIX)),
         "retrieval_accuracy": point["value"]}
        for point in retrieval_history(run["run_id"], keys)
    ]  # fmt: skip


BY_LENGTH = {  # stepped metric -> column of retrieval_by_length
    "retrieval_accuracy/all_depths": "accuracy",
    "kv_cache_bytes/by_length": "kv_cache_bytes",
    "ttft_ms/by_length": "ttft_ms",
    "tpot_ms/by_length": "tpot_ms",
}


def retrieval_by_length(run: pd.Series) -> pd.DataFrame:
    """Per context length: accuracy over every depth, and the KV bytes, TTFT and TPOT at that length."""
    history = pd.DataFrame(retrieval_history(run["run_id"], list(BY_LENGTH)))
    if history.empty:
        return pd.DataFrame(columns=["context_tokens", *BY_LENGTH.values()])
    table = history.pivot_table(index="context_tokens", columns="metric", values="value", aggfunc="last")
    return table.rename(columns=BY_LENGTH).reset_index()
