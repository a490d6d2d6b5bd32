"""hydra/sweeper=capacity (conf/hydra/sweeper/capacity.yaml): per cache of cache=, a walk of served
jobs (kvpipe.orchestrate.capacity.walks), every cache still walking measured in one batch through the
configured launcher (the interleaved one by default: they take turns in shared rounds), every job a
child of the sweep's one MLflow parent run, launched with resume=true so a repeated or killed search
reuses the points it measured. What it found is written to capacity.json in the sweep folder."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from kvpipe.orchestrate.batched_sweeper import BatchedSweeper, with_limits


@dataclass
class _Settings:
    walk: str = "rate"  # rate: `kvpipe capacity`'s search; concurrency: advise's walk
    trials: int = 60  # jobs launched at most
    max_ttft_ms: Optional[float] = None  # the rate search's targets, on percentile of the requests
    percentile: int = 90
    min_goodput: Optional[float] = None  # the share of requests within both targets a rate must keep
    max_accuracy_drop: Optional[float] = None  # rate: the accuracy a rate may lose against full precision
    resolution: float = 0.1  # the rate search stops within this share of the rate it carries
    requests: int = 16  # requests per rate point (load.requests)
    levels: list = field(default_factory=lambda: [1, 4, 16])  # the concurrency walk's levels
    objective: str = "throughput"  # the concurrency walk's: throughput or goodput


# the settings above and every limit of kvpipe.decide.limits (max_tpot_ms is the rate search's TPOT
# target as well; memory_budget bounds plan's memory-bound capacity beside it)
CapacitySettings = with_limits("CapacitySettings", _Settings, __name__)


class CapacitySweeper(BatchedSweeper):
    Settings = CapacitySettings

    def sweep(self, arguments: list[str]) -> Any:
        from kvpipe.orchestrate.capacity.walker import Walker
        from kvpipe.orchestrate.sweep import jobs_run_here

        sweep_dir = self.sweep_dir()
        walker = Walker.start(self.settings, arguments, self.cwd(), sweep_dir, jobs_run_here(self.config))
        return walker.run(self.launch)
