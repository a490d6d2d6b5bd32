"""The runs as the floors above record/ read them: MLflow's runs table (mlflow.search_runs), whose
column names are made here and nowhere above (a param's `params.cache.strategy`, a metric's
`metrics.tpot_ms`, a tag's through kvpipe.record.tags.column), and one run as plain data
(`RunRecord`) in place of MLflow's Run objects."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvpipe.catalogue import METRICS_COLUMN as METRICS

PARAMS = "params."


def param(name: str) -> str:
    """A param's column: `params.cache.strategy`."""
    return PARAMS + name


def metric(name: str) -> str:
    """A metric's column: `metrics.tpot_ms`."""
    return METRICS + name


def is_param(column: str) -> bool:
    return column.startswith(PARAMS)


def is_metric(column: str) -> bool:
    return column.startswith(METRICS)


def name_of(column: str) -> str:
    """A param's or metric's name from its column: `cache.strategy`, `tpot_ms`."""
    return column.removeprefix(PARAMS).removeprefix(METRICS)


def params_in(row) -> dict[str, str]:
    """A row's params that are set, by name."""
    return {name_of(k): v for k, v in row.items() if is_param(k) and isinstance(v, str)}


def metrics_in(row) -> dict[str, float]:
    """A row's metrics that are measured (not NaN), by name."""
    return {name_of(k): v for k, v in row.items() if is_metric(k) and v is not None and not _nan(v)}


@dataclass(frozen=True)
class RunRecord:
    """One MLflow run as plain data: its id, params, metrics and tags."""

    run_id: str
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, run) -> RunRecord | None:
        """From an MLflow Run (None stays None)."""
        if run is None:
            return None
        return cls(run.info.run_id, dict(run.data.params), dict(run.data.metrics), dict(run.data.tags))


def _nan(value) -> bool:
    return isinstance(value, float) and math.isnan(value)
