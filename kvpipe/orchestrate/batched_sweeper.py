"""What kvpipe's own sweepers share (hydra/sweeper=search and capacity): their settings typed by a
dataclass with every limit of kvpipe.decide.limits added, the configured launcher (the interleaved one
by default), and the sweep folder made before the first of their batches is launched."""

from __future__ import annotations

from dataclasses import make_dataclass
from pathlib import Path
from typing import Any, ClassVar, Optional

from hydra.plugins.sweeper import Sweeper
from omegaconf import DictConfig, OmegaConf

from kvpipe.decide import limits


def with_limits(name: str, base: type, module: str) -> type:
    """`base`'s settings and every limit (memory_budget, max_tpot_ms, ...), each null unless given; the
    table read when called, so a limit added to it is a setting too."""
    settings = make_dataclass(
        name, [(limit.setting, Optional[limit.given_as], None) for limit in limits.LIMITS], bases=(base,)
    )
    settings.__module__ = module
    return settings


class BatchedSweeper(Sweeper):
    """A sweeper that launches batches of jobs chosen from the figures of the batches before."""

    Settings: ClassVar[type]

    def __init__(self, **settings: Any) -> None:
        settings = {k: (OmegaConf.to_object(v) if isinstance(v, DictConfig) or OmegaConf.is_list(v) else v)
                    for k, v in settings.items()}  # fmt: skip
        self.settings = self.Settings(**settings)
        self.config: DictConfig | None = None
        self.launcher = None

    def setup(self, *, hydra_context, task_function, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        self.hydra_context, self.config = hydra_context, config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep_dir(self) -> Path:
        """The sweep folder, made, with the composed config in it as Hydra's own sweepers leave it."""
        assert self.config is not None and self.launcher is not None
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        return sweep_dir

    def cwd(self) -> Path:
        return Path(self.config.hydra.runtime.cwd)

    def launch(self, batch: list[list[str]], first_index: int):
        return self.launcher.launch(batch, initial_job_idx=first_index)
