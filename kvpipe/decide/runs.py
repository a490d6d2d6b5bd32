"""Recorded runs as a decision reads them: each run's label, strategy, peak memory, quality loss and
workload, the Pareto front within each workload, and the params that vary (llama-bench's columns).
Reading them from MLflow is kvpipe.record.read_back'."""

from __future__ import annotations

import enum
from functools import partial

import numpy as np
import pandas as pd

from kvpipe import cache, catalogue, workload
from kvpipe.decide import paired
from kvpipe.decide.limits import ANSWER_QUALITY
from kvpipe.record import table as run_table
from kvpipe.record import tags as mlflow_tags
from kvpipe.record.read_back import column, read_runs, stepped_history

NOT_MEASURED = ("tracking.", "print_table", "resume", "sweep_name", "fallback")
CACHE_PARAMS = ("cache.", "backend.", "axis.", "press.", "engine.")  # the rest says what was measured: the workload
NO_PRESS = "none"  # press=none: what runs recorded before presses existed (no press.name) ran with


class Front(enum.StrEnum):
    """How a run makes its cache smaller, for the front compare draws: fewer bits, fewer tokens, or both."""

    FULL_PRECISION = "full precision"
    QUANTIZATION = "quantization"
    EVICTION = "eviction"
    QUANTIZATION_AND_EVICTION = "quantization + eviction"


def context_params() -> tuple[str, ...]:
    """Params that set the prompt length (each workload's `context_fields`): the x axis covers them."""
    return ("workload.kind", *(f"workload.{name}" for kind in workload.registered() for name in kind.context_fields))


def in_label() -> set[str]:
    """Params the cache label spells out (quantized:quanto:int4:kivi, static+compile, +snapkv0.5): not columns."""
    return {
        "cache.strategy",
        *(name for strategy in cache.registered() for name in strategy.in_label),
        *(name for press in cache.presses.registered() for name in press.in_label),
    }


def load_runs(
    experiment: str,
    parent: str | None,
    tracking_uri: str | None,
    whole_experiment: bool = False,
    spelled: str = "--tracking-uri",
):
    """(FINISHED runs with the columns a decision reads, parent Run or None): one sweep's, or the
    whole experiment's; a measurement run again counts once, its latest run (kvpipe.record.read_back)."""
    runs, parent_run = read_runs(experiment, parent, tracking_uri, whole_experiment, spelled)
    return with_derived(runs), parent_run


def with_derived(runs: pd.DataFrame) -> pd.DataFrame:
    """Add label, strategy, memory_bytes, quality_loss, context_tokens, workload and pareto columns."""
    runs = runs.copy()
    requested = column(runs, mlflow_tags.column(mlflow_tags.CACHE_REQUESTED), None).fillna(
        column(runs, run_table.param("cache.strategy"), "")
    )
    effective = column(runs, mlflow_tags.column(mlflow_tags.CACHE_EFFECTIVE), None).fillna(requested)
    runs["strategy"] = effective.str.split(r"[:+]", regex=True).str[0]  # a label starts with its strategy
    # Offloaded on a CPU runs as dynamic: say both, so the row is not mistaken for either.
    runs["label"] = [cache.table_label(r, e) for r, e in zip(requested, effective)]
    # peak_memory_bytes is absolute, weights included, on every device. Runs recorded before it was
    # (CPU sources named *_growth measured RSS growth only) get their weights added, once.
    growth = column(runs, mlflow_tags.column(mlflow_tags.PEAK_MEMORY_SOURCE), "").fillna("").str.endswith("_growth")
    weights = column(runs, catalogue.column("weights_bytes")).fillna(0)
    runs["memory_bytes"] = column(runs, catalogue.column("peak_memory_bytes")) + weights.where(growth, 0)
    # A figure that varied (between calls of one shape, or between a call's tokens) by more than the
    # run's workload.noise_threshold.
    runs["noisy"] = column(runs, mlflow_tags.column(mlflow_tags.NOISY), "").fillna("") == "true"
    # Other processes held cores the job counted on while it measured: every timing is slow alike.
    runs["contended"] = column(runs, mlflow_tags.column(mlflow_tags.CONTENDED), "").fillna("") == "true"
    runs["press"] = column(runs, run_table.param("press.name"), None).fillna(NO_PRESS)
    runs["evicted"] = runs["press"].map(evicts).astype(bool)
    runs["family"] = [front_family(s, e) for s, e in zip(runs["strategy"], runs["evicted"])]
    # A lossless strategy with nothing evicted: without a quality pass, the only runs whose loss is known (0).
    runs["lossless"] = runs["strategy"].map(is_lossless) & ~runs["evicted"]
    runs["quality_loss"] = column(runs, catalogue.column("kl_vs_reference")).fillna(
        pd.Series(0.0, index=runs.index).where(runs["lossless"])
    )
    runs[ANSWER_QUALITY.name] = answer_quality(runs)
    # The measured prompt length: workload.prompt_tokens means nothing to a chat workload.
    runs["context_tokens"] = column(runs, catalogue.column("prompt_tokens")).fillna(
        pd.to_numeric(column(runs, run_table.param("workload.prompt_tokens")), errors="coerce")
    )
    # A short prompt beats a long one on every axis: strategies compete within one workload only.
    runs["workload"] = settings_text(
        runs, [p for p in varying_params(runs) if not p.startswith(CACHE_PARAMS)], full=True
    )
    # Raw timings rank only against those taken on the same machine (host and device)
    runs["node"] = [paired.node(run) or "" for _, run in runs.iterrows()]
    runs["pareto"] = False
    for _, group in runs.groupby(["workload", "node"]):
        runs.loc[group.index, "pareto"] = pareto_front(group)
    return runs


def answer_quality(runs: pd.DataFrame) -> pd.Series:
    """Each run's workload's own quality metric (a run's workload has one at most); NaN where none."""
    found = pd.Series(np.nan, index=runs.index, dtype=float)
    for quality in workload.quality_metrics().values():
        found = found.fillna(column(runs, quality.metric.column))
    return found


def judged_by(runs: pd.DataFrame) -> workload.Quality | None:
    """The quality metric that judged these runs' answers (the first some run measured), or None."""
    qualities = workload.quality_metrics().values()
    return next((q for q in qualities if column(runs, q.metric.column).notna().any()), None)


def judge_of(run: pd.Series) -> workload.Quality | None:
    """The quality metric that judged this run's answers, or None."""
    return next((q for q in workload.quality_metrics().values() if pd.notna(run.get(q.metric.column))), None)


def model_names(runs: pd.DataFrame) -> str:
    """The models the runs measured, by the name their runs carry (model=hf: the folder or hub id)."""
    names = sorted(set(column(runs, run_table.param("model.name"), None).dropna()))
    return ", ".join(names) or "an unnamed model"


def environments(runs: pd.DataFrame) -> list[str]:
    """The distinct environments (host, CPU, GPU, versions, threads) the runs were measured in."""
    from kvpipe.measure.environment import ENVIRONMENT_TAGS

    tags = [mlflow_tags.column(mlflow_tags.of(name)) for name in ENVIRONMENT_TAGS]
    described = [
        " · ".join(f"{name}={value}" for name, value in zip(ENVIRONMENT_TAGS, row) if isinstance(value, str))
        for row in zip(*(column(runs, tag, None) for tag in tags))
    ]
    return sorted(set(described) - {""})


def pareto_front(runs: pd.DataFrame) -> pd.Series:
    """True where no other run is as good on memory, TPOT and quality, and better on one. Quality is
    the KL loss, or, where every run measured its workload's own quality metric (passkey's retrieval
    accuracy), that metric in its direction (and KL too when every run has it)."""
    axes = [runs["memory_bytes"], column(runs, catalogue.column("tpot_ms"))]
    quality = judged_by(runs)
    if quality is not None and column(runs, quality.metric.column).notna().all():  # KL too where every run has it
        judged = column(runs, quality.metric.column)
        axes.append(judged if quality.metric.lower_is_better else -judged)
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


def front_family(strategy: str, evicted: bool) -> Front:
    """Whether the run stored fewer bits (a quantized cache), fewer tokens (a press evicted), or both."""
    quantized = strategy in cache.REGISTRY and cache.REGISTRY[strategy].family == cache.Family.QUANTIZED
    if quantized:
        return Front.QUANTIZATION_AND_EVICTION if evicted else Front.QUANTIZATION
    return Front.EVICTION if evicted else Front.FULL_PRECISION


def evicts(press: str) -> bool:
    """Whether a run's press (its name) evicted tokens: as the press registry says; one no longer
    registered is assumed to have."""
    known = cache.presses.base.REGISTRY.get(press)
    return known.evicts if known is not None else press != NO_PRESS


def is_lossless(strategy: str) -> bool:
    """From the registry; a strategy no longer registered is not assumed lossless."""
    return strategy in cache.REGISTRY and cache.REGISTRY[strategy].lossless


def _reads(run, param: str) -> bool:
    """Whether this run's strategy (or workload) reads the param, as the measurement key decides."""
    if param.startswith("workload."):
        return workload.reads(run.get(run_table.param("workload.kind")), param)
    if not param.startswith(CACHE_PARAMS):
        return True
    if param.startswith("press."):
        name = run.get(run_table.param("press.name"))
        press = cache.presses.base.REGISTRY.get(name if isinstance(name, str) else NO_PRESS)  # unlogged: none
        return press is None or param in press.read_fields()
    strategy = cache.REGISTRY.get(run.get(run_table.param("cache.strategy")))
    if strategy is None:
        return True
    read = strategy.read_fields(run.get(run_table.param("backend.name")))
    return param in read or f"{param.split('.')[0]}.*" in read


_READ_BY = (
    run_table.param("workload.kind"),
    run_table.param("cache.strategy"),
    run_table.param("backend.name"),
    run_table.param("press.name"),
)  # what _reads looks at


def _read_by(runs: pd.DataFrame) -> list[dict]:
    # the three columns as plain dicts: iterrows would build a Series of every column for every run
    return runs[[c for c in _READ_BY if c in runs.columns]].to_dict("records")


def param_values(runs: pd.DataFrame, param: str, read_by: list[dict] | None = None) -> list[str]:
    """The param as shown: blank where the run's strategy ignores it, or did not log it (a sweep of
    load=offline and load=rate: an offline run has no load.rate)."""
    read_by = _read_by(runs) if read_by is None else read_by
    values = runs[run_table.param(param)].tolist()
    return [str(value) if pd.notna(value) and _reads(run, param) else "" for value, run in zip(values, read_by)]


def varying_params(runs: pd.DataFrame) -> list[str]:
    """Params with more than one value among the runs that read them: llama-bench's columns."""
    names = [run_table.name_of(c) for c in runs.columns if run_table.is_param(c)]
    names = [n for n in names if n not in in_label() and not n.startswith(NOT_MEASURED)]
    read_by = _read_by(runs)  # once, not once a param
    return sorted(n for n in names if len(set(param_values(runs, n, read_by)) - {""}) > 1)


def settings_text(runs: pd.DataFrame, params: list[str], full: bool = False) -> list[str]:
    """'name=value ...' per run for these params, skipping those its strategy ignores."""
    read_by = _read_by(runs)
    values = {p if full else p.split(".")[-1]: param_values(runs, p, read_by) for p in params}
    return [" ".join(f"{name}={shown[i]}" for name, shown in values.items() if shown[i]) for i in range(len(runs))]


def recorded(runs: pd.DataFrame) -> list[workload.RecordedRun]:
    """The runs as a workload's own part of compare reads them (kvpipe.workload.RecordedRun); `point`
    is compare's label with the cache settings that vary."""
    return [
        workload.RecordedRun(
            label=run["label"],
            point=run["point"],
            metrics=run_table.metrics_in(run),
            history=partial(stepped_history, run["run_id"]),
        )
        for _, run in runs.iterrows()
    ]  # fmt: skip
