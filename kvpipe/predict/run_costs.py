"""A recorded run's job composed again from its logged overrides, and its model's costs: what
compare --predicted and the memory trade-off line count a run's bytes and FLOPs from."""

from __future__ import annotations

import shlex

from kvpipe import catalogue
from kvpipe.errors import KvpipeError

# A recorded run's columns (kvpipe.record.read_back) that predictions read: its job's shape and its timings
BATCH, PROMPT, NEW, TPOT, TTFT = (
    catalogue.column(name) for name in ("batch_size", "prompt_tokens", "new_tokens", "tpot_ms", "ttft_ms")
)

_SPECS: dict[str, object] = {}
_COSTS: dict[tuple, object] = {}


def job_spec(overrides: str):
    """The Spec of a run's logged overrides (None: it no longer composes), made once per overrides."""
    if overrides not in _SPECS:
        from kvpipe.jobspec import spec_from

        words = [] if overrides in ("(defaults)", "None", "nan") else shlex.split(overrides)
        try:
            _SPECS[overrides] = spec_from(words)
        except Exception:  # noqa: BLE001 - a config that no longer composes (a renamed option, a moved file)
            _SPECS[overrides] = None
    return _SPECS[overrides]


def job_costs(spec, dtype: str, batch: int, device: str):
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
