"""`kvpipe compare --predicted`: beside each run, what a calibration on its group's runs predicts."""

from __future__ import annotations

import math

from kvpipe.predict.calibration import Sample, calibrate
from kvpipe.predict.run_costs import BATCH, NEW, PROMPT, TPOT, TTFT, job_costs, job_spec
from kvpipe.record import table as run_table
from kvpipe.record import tags as mlflow_tags

# compare --predicted's columns (compare shows TPOT, not TTFT, of its own: the measured TTFT comes too)
PREDICTED = {
    "predicted_tpot_ms": "TPOT predicted ms",
    "measured_ttft_ms": "TTFT ms",
    "predicted_ttft_ms": "TTFT predicted ms",
}


def with_predictions(runs):
    """compare --predicted: beside each run, the TPOT and TTFT that a calibration on its group's runs
    (same model, dtype, host, device, threads, batch and cache settings, at two or more prompt
    lengths) predicts for it. Each run's job is composed again from its logged overrides to count
    its costs; a run that no longer composes, or whose group has one prompt length, gets none."""
    from kvpipe.record.read_back import column

    runs = runs.copy()
    for name in PREDICTED:
        runs[name] = math.nan
    runs["measured_ttft_ms"] = column(runs, TTFT)
    groups: dict[tuple, list[tuple[int, Sample]]] = {}
    for index, run in runs.iterrows():
        found = _sample_of(run)
        if found is not None:
            describe, point = found
            key = tuple(str(column(runs, name, None)[index]) for name in _GROUP_COLUMNS) + (describe,)
            groups.setdefault(key, []).append((index, point))
    for members in groups.values():
        calibration = calibrate("", [point for _, point in members])
        if calibration is None:
            continue
        for index, point in members:
            if calibration.tpot is not None and point.decode_bytes is not None:
                runs.loc[index, "predicted_tpot_ms"] = calibration.tpot.at(point.decode_bytes)
            runs.loc[index, "predicted_ttft_ms"] = calibration.ttft.at(point.prefill_flops, point.attention_flops)
    return runs


_GROUP_COLUMNS = (run_table.param("model.name"), run_table.param("model.dtype"), mlflow_tags.column(mlflow_tags.HOST), mlflow_tags.column(mlflow_tags.DEVICE),
                  mlflow_tags.column(mlflow_tags.TORCH_THREADS), BATCH)  # fmt: skip


def _sample_of(run) -> tuple[str, Sample] | None:
    """(the run's cache settings, its Sample), from its job composed again; None where it cannot be."""
    spec = job_spec(str(run.get(mlflow_tags.column(mlflow_tags.OVERRIDES))))
    needed = (PROMPT, NEW, BATCH, TPOT, TTFT)
    if spec is None or any(not isinstance(run.get(n), float) or math.isnan(run.get(n)) for n in needed):
        return None
    dtype, device, batch = (
        run.get(run_table.param("model.dtype")),
        run.get(mlflow_tags.column(mlflow_tags.DEVICE)),
        int(run[BATCH]),
    )
    costs = job_costs(spec, str(dtype), batch, str(device))
    if costs is None:
        return None
    prompt, new = round(run[PROMPT]), max(1, round(run[NEW]))
    cost = costs.at(spec.strategy, prompt, new)
    point = Sample.of(run["run_id"], cost, float(run[TPOT]), float(run[TTFT]))
    return spec.strategy.describe(), point
