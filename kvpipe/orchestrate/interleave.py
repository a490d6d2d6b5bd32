"""kvpipe's default launcher (hydra/launcher=interleaved): a sweep's jobs, in this process, measured
in shared rounds instead of one after another.

Hydra's basic launcher runs each job to its end before the next starts, so a machine that slows
down halfway through a sweep makes the later jobs look slower. Here each job is first prepared in
its own Hydra job context (its folder, its log, its skips: kvpipe.orchestrate.sweep hands it back
loaded and warmed up), then the jobs take turns in rounds (kvpipe.schedule): call by call,
each call's order counterbalanced from the sweep's seed (hydra.launcher.turn=call, the default), or a
job's whole pass a turn (turn=pass), then each is summarised and recorded. Jobs on different models form
groups that run one after another, so only one model is resident at a time. What the rounds took
is written to the sweep folder (rounds.json) and to the parent run (round_s, round_drift).
"""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import Sequence

from hydra.core.utils import JobReturn, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from omegaconf import OmegaConf, open_dict

from kvpipe.orchestrate.sweep import Deferred, SweepState, outcome_counts
from kvpipe.record import store, tracking
from kvpipe.schedule import QUIET_WAIT_S, Rounds, check_quiet_wait, check_turn, run_rounds

log = logging.getLogger(__name__)

ROUNDS_FILE = "rounds.json"


class InterleavedLauncher(Launcher):
    def __init__(self, turn: str = "call", quiet_wait_s: float = QUIET_WAIT_S) -> None:
        self.turn = check_turn(
            turn
        )  # call: each measured call a turn; pass: a job's whole pass (the turns before calls)
        self.quiet_wait_s = check_quiet_wait(quiet_wait_s)  # after a contended call: the most it waits for quiet
        self.config = self.hydra_context = self.task_function = None

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        composed = []
        for offset, overrides in enumerate(job_overrides):
            index = initial_job_idx + offset
            log.info("\t#%d : %s", index, " ".join(filter_overrides(overrides)))
            sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(sweep_config):
                sweep_config.hydra.job.id = sweep_config.hydra.job.num = index
            composed.append(sweep_config)
        returns: dict[int, JobReturn] = {}
        for group in _by_model(composed):
            for sweep_config, ret in zip(group, self._run_group(group)):
                returns[sweep_config.hydra.job.num] = ret
        return [returns[initial_job_idx + offset] for offset in range(len(job_overrides))]  # the sweeper's order

    def _run_group(self, group: list) -> list[JobReturn]:
        """Prepare each job in its own Hydra context, measure the prepared ones in shared rounds,
        then record each."""
        returns = []
        try:
            for sweep_config in group:
                returns.append(
                    run_job(
                        hydra_context=self.hydra_context, task_function=self.task_function, config=sweep_config,
                        job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir",
                    )
                )  # fmt: skip
                configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        except KeyboardInterrupt:  # the job being prepared is KILLED already; so are those waiting for rounds
            for ret in returns:
                if isinstance(ret.return_value, Deferred):
                    ret.return_value.kill()
            raise
        waiting = [(ret, ret.return_value) for ret in returns if isinstance(ret.return_value, Deferred)]
        if not waiting:
            return returns
        jobs = [deferred.job for _, deferred in waiting]
        seed = int(group[0].workload.seed)
        try:
            rounds = run_rounds(jobs, seed, shuffle=len(jobs) > 1, turn=self.turn, quiet_wait_s=self.quiet_wait_s)
        except KeyboardInterrupt:  # every waiting job is KILLED, and the sweep's parent with them
            for _, deferred in waiting:
                deferred.kill()
            self._end_parent_killed()
            raise
        order_tags = self._order_tags(len(jobs))
        for ret, deferred in waiting:
            ret.return_value = deferred.finish(order_tags)
        self._record_rounds(rounds, jobs, order_tags)
        return returns

    def _order_tags(self, count: int) -> dict[str, str]:
        if count == 1:
            return {"measured_order": "sequential", "order_reason": "the only job of its model in this batch"}
        return {"measured_order": "interleaved", "round_group": uuid.uuid4().hex[:12]}

    def _record_rounds(self, rounds: Rounds, jobs: list, order_tags: dict) -> None:
        """rounds.json in the sweep folder (a list of groups), and the parent run's round metrics."""
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        path = sweep_dir / ROUNDS_FILE
        groups = json.loads(path.read_text()) if path.is_file() else []
        first_step = sum(len(g["seconds"]) for g in groups)
        groups.append({"round_group": order_tags.get("round_group"), **rounds.to_dict([j.label for j in jobs])})
        path.write_text(json.dumps(groups, indent=2) + "\n")
        state = SweepState.load(sweep_dir)
        if state and state.parent_run_id and rounds.seconds:
            tracking_cfg = OmegaConf.to_object(self.config.tracking)
            try:
                tracking.log_rounds(
                    tracking_cfg, Path(self.config.hydra.runtime.cwd), state.parent_run_id, rounds.seconds, first_step
                )
            except store.TrackingUnavailable as exc:
                log.warning("%s; the rounds are in %s", exc, path)

    def _end_parent_killed(self) -> None:
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        state = SweepState.load(sweep_dir)
        if state and state.parent_run_id:
            tracking_cfg = OmegaConf.to_object(self.config.tracking)
            launch_dir = Path(self.config.hydra.runtime.cwd)
            tracking.end_parent(tracking_cfg, launch_dir, state.parent_run_id, "KILLED", outcome_counts(sweep_dir))


def _by_model(composed: list) -> list[list]:
    """The jobs grouped by their model config, in the order each model first appears."""
    groups: dict[str, list] = {}
    for sweep_config in composed:
        key = json.dumps(OmegaConf.to_container(sweep_config.model, resolve=False), sort_keys=True, default=str)
        groups.setdefault(key, []).append(sweep_config)
    return list(groups.values())
