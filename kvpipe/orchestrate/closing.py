"""The table a sweep closes with. At a sweep's end its runs are read from MLflow, compared, plotted
and logged by kvpipe.decide.compare, in the sweep's tracking worker where it has one
(kvpipe.record.worker); this process prints the rows it gets back (kvpipe.decide.shown)."""

from __future__ import annotations

import logging
from pathlib import Path

from kvpipe.decide.shown import print_shown
from kvpipe.errors import KvpipeError
from kvpipe.record import worker
from kvpipe.record.store import store_paths

log = logging.getLogger(__name__)


def summarise_sweep(config, parent_run_id: str, sweep_dir: Path) -> None:
    """End of a multirun: table, files in sweep_dir, artifacts on the parent. Never fails the sweep."""
    from omegaconf import OmegaConf

    try:
        uri = store_paths(OmegaConf.to_object(config.tracking), Path(config.hydra.runtime.cwd))[0]
        experiment = config.tracking.experiment
        print_shown(worker.run("kvpipe.decide.compare", "publish_sweep", experiment, parent_run_id, uri, sweep_dir))
    except KvpipeError as exc:  # an empty or all-failed sweep has nothing to compare
        log.info("compare: %s", exc)
    except Exception:  # noqa: BLE001 - our bug, but every job is recorded already: keep the sweep's own status
        log.exception(
            "compare failed; the sweep's runs are recorded, `kvpipe compare --parent %s` retries", parent_run_id
        )
