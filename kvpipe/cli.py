"""Command line: `kvpipe [overrides]` / `python -m kvpipe` run Hydra jobs.

User mistakes print one line and exit 2; our own bugs keep their full traceback.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from kvpipe.config import register_schemas
from kvpipe.errors import KvpipeError, from_hydra

log = logging.getLogger("kvpipe")

register_schemas()


@hydra.main(version_base="1.3", config_path="pkg://kvpipe.conf", config_name="config")
def _hydra_app(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    from hydra.types import RunMode

    from kvpipe.plan import make_plan

    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode == RunMode.MULTIRUN:
        from kvpipe.sweep import run_sweep_job

        return run_sweep_job(cfg, hydra_cfg, Path(hydra.utils.get_original_cwd()))
    try:
        plan = make_plan(cfg, hydra_cfg.overrides.task)  # validated before torch, transformers or mlflow are imported
        from kvpipe.pipeline import run_pipeline

        run_dir = Path(HydraConfig.get().runtime.output_dir)
        launch_dir = Path(hydra.utils.get_original_cwd())
        run_pipeline(plan, run_dir, launch_dir, print_table=cfg.print_table)
    except KvpipeError as exc:
        _fail(str(exc))  # here, not in main(): Hydra would first print its own "Error executing job" line


def _fail(message: str) -> None:
    print(f"kvpipe: error: {message}", file=sys.stderr)
    sys.exit(2)


# `kvpipe NAME ...`: decisions over recorded runs; everything else is a Hydra job or sweep.
SUBCOMMANDS = {
    "compare": "kvpipe.compare",
    "recommend": "kvpipe.recommend",
    "plan": "kvpipe.capacity",
    "sync": "kvpipe.sync",
}


def main() -> None:
    """Entry point for `kvpipe` and `python -m kvpipe`."""
    if len(sys.argv) > 1 and sys.argv[1] in SUBCOMMANDS:
        import importlib

        command = importlib.import_module(SUBCOMMANDS[sys.argv[1]])
        try:
            sys.exit(command.main(sys.argv[2:]))
        except KvpipeError as exc:
            _fail(str(exc))
    # Hydra's argparse cannot take overrides on both sides of -m; accept them anywhere.
    flags = [a for a in sys.argv[1:] if a in ("-m", "--multirun")]
    sys.argv[1:] = flags[:1] + [a for a in sys.argv[1:] if a not in ("-m", "--multirun")]
    # Let composition errors reach us instead of Hydra's multi-line report; we print one line.
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    try:
        _hydra_app()
    except KeyboardInterrupt:
        print("kvpipe: interrupted; the current run is recorded as KILLED", file=sys.stderr)
        sys.exit(130)
    except KvpipeError as exc:
        _fail(str(exc))
    except Exception as exc:  # noqa: BLE001 - sorted into user errors vs our bugs below
        message = _user_error(exc)
        if message is None:
            raise
        _fail(message)


def _user_error(exc: BaseException) -> str | None:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(exc, (HydraException, OmegaConfBaseException)):
        return from_hydra(exc)
    return None
