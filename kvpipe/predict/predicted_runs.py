"""`kvpipe compare --predicted`: beside each run, what a calibration on its group's runs predicts."""

from __future__ import annotations

import math
import shlex

from kvpipe.errors import KvpipeError
from kvpipe.predict.calibration import Sample, calibrate
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
    from kvpipe.record.runs import column

    runs = runs.copy()
    for name in PREDICTED:
        runs[name] = math.nan
    runs["measured_ttft_ms"] = column(runs, "metrics.ttft_ms")
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


_GROUP_COLUMNS = ("params.model.name", "params.model.dtype", mlflow_tags.column(mlflow_tags.HOST), mlflow_tags.column(mlflow_tags.DEVICE),
                  mlflow_tags.column(mlflow_tags.TORCH_THREADS), "metrics.batch_size")  # fmt: skip


def _sample_of(run) -> tuple[str, Sample] | None:
    """(the run's cache settings, its Sample), from its job composed again; None where it cannot be."""
    spec = _job_spec(str(run.get(mlflow_tags.column(mlflow_tags.OVERRIDES))))
    needed = ("metrics.prompt_tokens", "metrics.new_tokens", "metrics.batch_size", "metrics.tpot_ms", "metrics.ttft_ms")
    if spec is None or any(not isinstance(run.get(n), float) or math.isnan(run.get(n)) for n in needed):
        return None
    dtype, device, batch = (
        run.get("params.model.dtype"),
        run.get(mlflow_tags.column(mlflow_tags.DEVICE)),
        int(run["metrics.batch_size"]),
    )
    costs = _costs(spec, str(dtype), batch, str(device))
    if costs is None:
        return None
    prompt, new = round(run["metrics.prompt_tokens"]), max(1, round(run["metrics.new_tokens"]))
    cost = costs.at(spec.strategy, prompt, new)
    point = Sample.of(run["run_id"], cost, float(run["metrics.tpot_ms"]), float(run["metrics.ttft_ms"]))
    return spec.strategy.describe(), point


_SPECS: dict[str, object] = {}
_COSTS: dict[tuple, object] = {}


def _job_spec(overrides: str):
    if overrides not in _SPECS:
        from kvpipe.spec import spec_from

        words = [] if overrides in ("(defaults)", "None", "nan") else shlex.split(overrides)
        try:
            _SPECS[overrides] = spec_from(words)
        except Exception:  # noqa: BLE001 - a config that no longer composes (a renamed option, a moved file)
            _SPECS[overrides] = None
    return _SPECS[overrides]


def _costs(spec, dtype: str, batch: int, device: str):
    """The run's model's costs, made once per model, dtype, batch and device (runs share them)."""
    from kvpipe.model.loading import config_key
    from kvpipe.predict.costs import costs_for

    key = (config_key(spec.model), dtype, batch, device)
    if key not in _COSTS:
        try:
            _COSTS[key] = costs_for(spec, device, dtype, batch)
        except (KvpipeError, OSError, KeyError):  # a model folder gone, a hub id offline, an unknown dtype
            _COSTS[key] = None
    return _COSTS[key]
