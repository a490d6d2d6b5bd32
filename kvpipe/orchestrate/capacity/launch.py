"""The capacity sweeper as a Python call (`kvpipe capacity`, `kvpipe advise --objective throughput|goodput`)."""

from __future__ import annotations

import json
from pathlib import Path

from kvpipe.orchestrate.capacity.walker import RESULT_FILE


def launch_capacity(overrides: list[str], sweep_dir: Path, **settings) -> tuple[str, dict]:
    """Run hydra/sweeper=capacity (settings: hydra.sweeper.* of conf/hydra/sweeper/capacity.yaml; None
    is left at its default) with the user's overrides in sweep_dir. Returns the sweep's MLflow parent
    run id and what the walks found (capacity.json)."""
    from kvpipe.orchestrate.search.launch import launch_sweep
    from kvpipe.orchestrate.sweepers import register_capacity_sweeper

    register_capacity_sweeper()
    words = ["hydra/sweeper=capacity", *overrides]
    words += [f"hydra.sweeper.{name}={_hydra_value(value)}" for name, value in settings.items() if value is not None]
    parent = launch_sweep(words, sweep_dir)
    return parent, json.loads((sweep_dir / RESULT_FILE).read_text())


def _hydra_value(value) -> str:
    return "[" + ",".join(map(str, value)) + "]" if isinstance(value, list | tuple) else str(value)
