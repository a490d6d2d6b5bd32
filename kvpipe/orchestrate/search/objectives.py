"""What a search minimises and what it must respect, read from a job's record as compare reads it.

Three objectives, all minimised: memory, TPOT, and quality loss (KL against the full-precision
reference, or for a workload that judges its answers its own quality metric as a loss: passkey's
1 - retrieval accuracy). Memory is the measured peak, weights
included, except on CPU: there the process's peak is the interpreter, the libraries and the weights,
and the cache's share of it is within the noise, so the search minimises the KV cache's bytes
(`kv_cache_bytes`) and says so. The user's limits are constraints (Optuna's: <= 0 is feasible), each
the limit's relative overshoot, measured exactly as `recommend` measures it.
"""

from __future__ import annotations

import math

import pandas as pd

from kvpipe import catalogue
from kvpipe.decide.limits import Limits
from kvpipe.decide.runs import judge_of, with_derived
from kvpipe.record import table as run_table
from kvpipe.record import tags as mlflow_tags
from kvpipe.workload import Quality

INFEASIBLE = 1.0  # the constraint value of a figure that was not measured: as bad as twice the limit


def memory_axis(device: str) -> str:
    """The figure the search minimises as memory on this device (a column of `row`)."""
    return "memory_bytes" if device == "cuda" else catalogue.column("kv_cache_bytes")


def axis_names(device: str, quality: Quality | None) -> list[str]:
    """The objectives' names; `quality` is the workload's own quality metric, if it judges its answers."""
    memory = "peak memory (weights included)" if device == "cuda" else "KV cache bytes"
    return [memory, "TPOT ms", quality.objective() if quality else "KL nats"]


def row(metrics: dict, params: dict, tags: dict) -> pd.Series:
    """One run as compare and recommend see it (label, strategy, memory_bytes, quality_loss, ...)."""
    frame = pd.DataFrame(
        [
            {
                **{run_table.metric(k): (math.nan if v is None else v) for k, v in metrics.items()},
                **{run_table.param(k): v for k, v in params.items()},
                **{mlflow_tags.column(k): v for k, v in tags.items()},
                "run_id": tags.get(mlflow_tags.RUN_ID, ""),
            }
        ]
    )
    return with_derived(frame).iloc[0]


def values(run: pd.Series, device: str) -> list[float]:
    """[memory, TPOT, quality loss]; NaN where a figure was not measured."""
    judge = judge_of(run)
    quality = judge.loss(run[judge.metric.column]) if judge else run["quality_loss"]
    return [float(run.get(memory_axis(device), math.nan)), float(run[catalogue.column("tpot_ms")]), float(quality)]


def constraints(run: pd.Series, limits: Limits) -> list[float]:
    """One value per limit set, <= 0 where the run meets it: each limit's excess, as recommend
    measures it (kvpipe.decide.limits), a figure not measured counting as INFEASIBLE."""
    return [INFEASIBLE if math.isinf(excess) else excess for excess in limits.excesses(run).values()]
