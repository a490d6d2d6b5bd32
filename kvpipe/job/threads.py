"""The torch threads a job measures with."""

from __future__ import annotations

import os

from kvpipe.measure.environment import physical_cores


def use_threads(model_cfg, device: str) -> int:
    """Set torch's threads for measuring, and return them: model.threads, else $OMP_NUM_THREADS where
    set, else the physical cores (a hyperthread sibling slows decode more than it helps). On CUDA the
    host runs one launching thread, whatever torch's pool."""
    import torch

    if device != "cpu":
        return 1
    wanted = threads_for(model_cfg)
    if torch.get_num_threads() != wanted:
        torch.set_num_threads(wanted)
    return wanted


def threads_for(model_cfg) -> int:
    """The CPU threads a job computes with: model.threads, else $OMP_NUM_THREADS, else the physical
    cores (an engine's server is given the same number)."""
    return model_cfg.threads or _omp_threads() or physical_cores()


def _omp_threads() -> int | None:
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else None
