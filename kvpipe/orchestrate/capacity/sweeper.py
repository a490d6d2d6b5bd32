"""hydra/sweeper=capacity (conf/hydra/sweeper/capacity.yaml): per cache of cache=, a walk of served
jobs (kvpipe.orchestrate.capacity.walks), every cache still walking measured in one batch through the
configured launcher (the interleaved one by default: they take turns in shared rounds), every job a
child of the sweep's one MLflow parent run, launched with resume=true so a repeated or killed search
reuses the points it measured. What it found is written to capacity.json in the sweep folder."""

from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import Any, Optional

from hydra.plugins.sweeper import Sweeper
from omegaconf import DictConfig, OmegaConf

from kvpipe.decide.limits import LIMITS


@dataclass
class _Settings:
    walk: str = "rate"  # rate: `kvpipe capacity`'s search; concurrency: advise's walk
    trials: int = 60  # jobs launched at most
    max_ttft_ms: Optional[float] = None  # the rate search's targets, on percentile of the requests
    percentile: int = 90
    min_goodput: Optional[float] = None  # the share of requests within both targets a rate must keep
    resolution: float = 0.1  # the rate search stops within this share of the rate it carries
    requests: int = 16  # requests per rate point (load.requests)
    levels: list = field(default_factory=lambda: [1, 4, 16])  # the concurrency walk's levels
    objective: str = "throughput"  # the concurrency walk's: throughput or goodput


# the settings above and every limit of kvpipe.decide.limits (max_tpot_ms is the rate search's TPOT
# target as well; memory_budget bounds plan's memory-bound capacity beside it)
CapacitySettings = make_dataclass(
    "CapacitySettings", [(limit.setting, Optional[limit.given_as], None) for limit in LIMITS], bases=(_Settings,)
)
CapacitySettings.__module__ = __name__


class CapacitySweeper(Sweeper):
    def __init__(self, **settings: Any) -> None:
        settings = {k: (OmegaConf.to_object(v) if isinstance(v, DictConfig) or OmegaConf.is_list(v) else v)
                    for k, v in settings.items()}  # fmt: skip
        self.settings = CapacitySettings(**settings)
        self.config: DictConfig | None = None
        self.launcher = None

    def setup(self, *, hydra_context, task_function, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> Any:
        from kvpipe.orchestrate.capacity.walker import Walker

        assert self.config is not None and self.launcher is not None
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        walker = Walker.start(self.settings, arguments, Path(self.config.hydra.runtime.cwd), sweep_dir)
        return walker.run(lambda batch, first: self.launcher.launch(batch, initial_job_idx=first))
