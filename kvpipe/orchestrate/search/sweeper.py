"""hydra/sweeper=search: an Optuna study over the cache space, its trials run by Hydra's launcher.

Each round asks the study for trials, decodes each to a point of the space (kvpipe.orchestrate.search.space),
and launches the new points as one batch through whichever launcher is configured (basic, joblib,
submitit, Ray), as sweep jobs: one MLflow child each under the search's parent run, exactly as a
sweep records them. A point the study has already seen is told its earlier figures; one whose
measurement FINISHED in the experiment before is launched with resume=true, which skips it, and its
recorded figures are told; one that `kvpipe plan` predicts cannot fit the memory budget (weights plus
KV cache) is pruned, with its predicted bytes, and never launched.

Where the space is no larger than the trial budget every point is measured (an exhaustive pass).
Otherwise the sampler chooses: by default the frontier walk (kvpipe.orchestrate.search.frontier), which uses the
plan's exact bytes and the order of quality within a quantized family; or NSGA-II (sampler=nsga2,
multi-objective, the user's limits as constraints) from a first generation of the space's extremes.
The study lives in an SQLite file beside the tracking store (or hydra.sweeper.storage), so a killed
search resumes where it stopped.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Optional

from kvpipe.orchestrate.batched_sweeper import BatchedSweeper, with_limits
from kvpipe.orchestrate.search import space as spaces

log = logging.getLogger(__name__)


@dataclass
class _Settings:
    trials: int = 20  # jobs to measure at most (points already measured or pruned do not count)
    timeout_s: Optional[float] = None  # launch no new batch after this long
    group_sizes: list = field(default_factory=lambda: list(spaces.GROUP_SIZES))
    residual_lengths: list = field(default_factory=lambda: list(spaces.RESIDUAL_LENGTHS))
    storage: Optional[str] = None  # an Optuna storage URL; default sqlite beside the tracking store
    study_name: Optional[str] = None  # default: from the model, workload, space and limits
    sampler: str = "frontier"  # frontier (kvpipe.orchestrate.search.frontier) or nsga2 (Optuna's NSGAIISampler)
    seed: int = 0
    population_size: Optional[int] = None  # NSGA-II's generation; default from the trial budget
    max_batch_size: Optional[int] = None  # trials launched together; default the launcher's n_jobs, else 1


# hydra.sweeper.* (conf/hydra/sweeper/search.yaml): the settings above and every limit of
# kvpipe.decide.limits (memory_budget, max_tpot_ms, ...: constraints; the memory budget also bounds the plan's pruning)
SearchSettings = with_limits("SearchSettings", _Settings, __name__)


class SearchSweeper(BatchedSweeper):
    Settings = SearchSettings

    def sweep(self, arguments: list[str]) -> Any:
        from kvpipe.orchestrate.search.trials import Search

        sweep_dir = self.sweep_dir()
        search = Search.start(self.settings, arguments, self.cwd(), sweep_dir)
        return search.run(self.launch, self._batch_size())

    def _batch_size(self) -> int:
        if self.settings.max_batch_size:
            return max(1, int(self.settings.max_batch_size))
        jobs = self.config.hydra.launcher.get("n_jobs") if "launcher" in self.config.hydra else None
        return max(1, int(jobs)) if isinstance(jobs, int) and jobs > 0 else 1
