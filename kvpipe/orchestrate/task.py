"""What Hydra runs for each job: one job end to end, or a sweep's job with its parent run around it.
The command line (kvpipe.cli) and a search launched from Python (kvpipe.orchestrate.search.launch)
hand Hydra this same function."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from kvpipe.config import from_hydra
from kvpipe.errors import KvpipeError, fail
from kvpipe.jobspec import make_spec
from kvpipe.orchestrate.pipeline import run_pipeline
from kvpipe.orchestrate.sweep import run_sweep_job

# Hydra's own checks of its flags (hydra/_internal/utils.py), raised as plain ValueErrors
HYDRA_FLAG_ERRORS = ("Only one of --run, --multirun, --cfg", "The --resolve flag can only be used")


def run_task(cfg: DictConfig) -> None:
    """One Hydra job: a sweep's (its parent run, skips and resume: kvpipe.orchestrate.sweep) or one run."""
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get()
    launch_dir = Path(hydra.utils.get_original_cwd())
    if hydra_cfg.mode == RunMode.MULTIRUN:
        return run_sweep_job(cfg, hydra_cfg, launch_dir)
    try:
        spec = make_spec(cfg, hydra_cfg.overrides.task)  # validated before torch, transformers or mlflow load
        run_pipeline(spec, Path(hydra_cfg.runtime.output_dir), launch_dir, print_table=cfg.print_table)
    except KvpipeError as exc:
        fail(str(exc))  # here: Hydra would first print its own "Error executing job" line


def user_error(exc: BaseException) -> str | None:
    """A Hydra or OmegaConf error the user caused, as one line; None for anything else (our bug)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(exc, (HydraException, OmegaConfBaseException)):
        return from_hydra(exc)
    if isinstance(exc, ValueError) and str(exc).startswith(HYDRA_FLAG_ERRORS):
        return f"{exc}; to see a job's config, give --cfg job without -m, e.g. kvpipe cache=static --cfg job"
    return None
