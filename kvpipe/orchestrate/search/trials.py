"""A search's rounds: ask the study for trials, launch the new points as one batch of sweep jobs, tell
the study each job's outcome. A point seen before is told its earlier outcome, one the plan predicts
cannot fit the memory budget is pruned, and one inferred to miss the quality limit is told so; none of
them costs a job. The study itself is study.py's; the lines it prints, trial_log.py's."""

from __future__ import annotations

import hashlib
import logging
import math
import random
import time
from typing import Callable

from kvpipe.orchestrate.launched import read_back
from kvpipe.orchestrate.search import objectives, trial_log
from kvpipe.orchestrate.search.space import Point
from kvpipe.orchestrate.search.study import (
    CONSTRAINTS,
    DETAIL,
    FAILED,
    INFERRED,
    MEASURED,
    OUTCOME,
    POINT,
    PRUNED,
    REUSED,
    SearchStudy,
    Seen,
)
from kvpipe.record.result import Result
from kvpipe.units import human_bytes

log = logging.getLogger(__name__)


class Search(SearchStudy):
    """One search (see sweeper.py): `Search.start(...)` sets up its study, `run` its rounds."""

    def run(self, launch: Callable, batch_size: int):
        """Rounds until the budget of measured jobs, the timeout or the points worth a job run out;
        `launch(jobs, first_index)` runs a batch of jobs (their overrides) and returns their results."""
        from optuna.distributions import CategoricalDistribution

        distributions = {name: CategoricalDistribution(values) for name, values in self.space.choices().items()}
        self._enqueue_first_generation()
        returns, job_index = [], self._next_job_index()
        while self.measured() < self.settings.trials and self._left():
            if self.settings.timeout_s and time.monotonic() - self.started > self.settings.timeout_s:
                log.warning("search: timeout of %gs reached; no new trials", self.settings.timeout_s)
                break
            batch = self._ask(distributions, min(batch_size, self.settings.trials - self.measured()))
            if not batch:
                break
            jobs = [[*self.fixed, *point.overrides(), "resume=true"] for _, point in batch]
            results = launch(jobs, job_index)
            job_index += len(jobs)
            returns.append(results)
            for (trial, point), job in zip(batch, results, strict=True):
                self._tell(trial, point, self._outcome(point, job))
        trial_log.print_closing_line(self, {} if self.exhaustive else self._inferred())
        return returns

    def _left(self) -> list[Point]:
        """Points still worth a job: not seen, and (unless every point is measured) not inferred to miss."""
        inferred = {} if self.exhaustive else self._inferred()
        return [p for p in self.space.points if p not in self.seen and p not in inferred]

    def _inferred(self) -> dict:
        from kvpipe.orchestrate.search.frontier import inferred_misses

        measured = {p: s.values for p, s in self.seen.items() if s.values}
        return inferred_misses(self.space, measured, self.quality_limit)

    def _enqueue_first_generation(self) -> None:
        """Every unseen point when the budget covers the space; else, for NSGA-II, the space's extremes
        first (the frontier walk chooses its own)."""
        if not self.exhaustive and self.settings.sampler != "nsga2":
            return
        unseen = [p for p in self.space.points if p not in self.seen]
        first = unseen if self.exhaustive else _extremes(unseen)
        for point in first:
            self.study.enqueue_trial(self.space.encode(point), skip_if_exists=True)

    def _ask(self, distributions, size: int) -> list:
        """Up to `size` trials at points not yet measured; the rest of what the study asks is told
        at once (a point seen before, or one the plan prunes)."""
        batch, tries = [], 0
        while len(batch) < size and tries < 50 * size:
            tries += 1
            trial = self.study.ask(distributions)
            point = self.space.decode(trial.params)
            trial.set_user_attr(POINT, point.label())
            if point in self.seen:
                self._tell(trial, point, self.seen[point], again=True)
            elif any(point == p for _, p in batch):
                self.study.tell(trial, state=_state("FAIL"))  # asked twice in one batch: the first one measures it
            elif (pruned := self._pruned(point)) is not None:
                self._tell(trial, point, pruned)
            elif not self.exhaustive and (missed := self._inferred().get(point)) is not None:
                self._tell(trial, point, _inferred_miss(missed, self.quality_limit, self.quality))
            else:
                batch.append((trial, point))
            if tries == 25 * size and not batch:  # the sampler keeps to seen points: take an unseen one
                left = self._left()
                if left:
                    self.study.enqueue_trial(self.space.encode(random.Random(tries).choice(left)))
                else:
                    break
        return batch

    def _tell(self, trial, point: Point, seen: Seen, again: bool = False) -> None:
        trial.set_user_attr(OUTCOME, seen.outcome)
        trial.set_user_attr(DETAIL, seen.detail)
        if seen.constraints is not None:
            trial.set_user_attr(CONSTRAINTS, seen.constraints)
        if seen.values is not None and not any(math.isnan(v) for v in seen.values):
            self.study.tell(trial, seen.values)
        else:
            self.study.tell(trial, state=_state("PRUNED" if seen.outcome in (PRUNED, INFERRED) else "FAIL"))
        if not again:
            self.seen[point] = seen
            trial_log.print_trial(self, point, seen)

    # ---- outcomes --------------------------------------------------------------------------------

    def _outcome(self, point: Point, job) -> Seen:
        """What the launched job measured, or the record it was skipped for."""
        measured, _, why_not = read_back(job, self.spec, self.launch_dir)
        if measured is None:
            return Seen(FAILED, detail=why_not)
        outcome = REUSED if measured.reused else MEASURED
        return self._seen_from(outcome, measured.metrics, measured.params, measured.tags, measured.where)

    def _seen_from(self, outcome: str, metrics, params, tags, where: str) -> Seen:
        run = objectives.row(metrics, params, tags)
        values = objectives.values(run, self.device)
        if any(math.isnan(v) for v in values):
            missing = [n for n, v in zip(objectives.axis_names(self.device, self.quality), values) if math.isnan(v)]
            return Seen(FAILED, detail=f"{where} has no {', '.join(missing)} (run it with quality=on)")
        return Seen(outcome, values, objectives.constraints(run, self.limits), where, run["label"])

    def _pruned(self, point: Point) -> Seen | None:
        """Pruned where the plan's exact prediction of weights plus KV cache exceeds the budget."""
        if self.limits.memory_bytes is None:
            return None
        predicted = self.predicted_bytes(point)
        if predicted <= self.limits.memory_bytes:
            return None
        detail = f"predicted {human_bytes(predicted)} (weights + KV cache) > {human_bytes(self.limits.memory_bytes)}"
        self._record_pruned(point, detail)
        return Seen(PRUNED, detail=detail)

    def _record_pruned(self, point: Point, detail: str) -> None:
        overrides = [*self.fixed, *point.overrides()]
        folder = self.sweep_dir / "pruned" / hashlib.sha256(point.label().encode()).hexdigest()[:12]
        Result.unfinished({"overrides": overrides}, "SKIPPED", f"pruned: {detail}", overrides=overrides).save(folder)

    def _next_job_index(self) -> int:
        numbers = [int(p.name) for p in self.sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()]
        return max(numbers, default=-1) + 1


def _inferred_miss(missed: tuple[Point, float], limit: float, quality) -> Seen:
    point, loss = missed
    what = quality.objective() if quality else "KL"
    detail = f"inferred: no better than {point.label()} ({what} {loss:.3g} > {limit:g}), which keeps more exact"
    return Seen(INFERRED, detail=detail)


def _state(name: str):
    from optuna.trial import TrialState

    return getattr(TrialState, name)


def _extremes(points: list[Point]) -> list[Point]:
    """A first generation that spans the space: every dense point, and each backend's fewest and most
    bits at its first layout, group size and residual length."""
    dense = [p for p in points if p.get("backend") is None and p.get("press") is None]
    quantized: dict[str, list[Point]] = {}
    evicting: dict[str, list[Point]] = {}
    for point in points:
        if point.get("backend") is not None:
            quantized.setdefault(point.get("backend"), []).append(point)
        elif point.get("press") is not None:
            evicting.setdefault(point.get("press"), []).append(point)
    ends = []
    for group in quantized.values():
        bits = sorted({int(p.get("backend.nbits")) for p in group})
        for nbits in dict.fromkeys((bits[0], bits[-1])):
            ends.append(next(p for p in group if int(p.get("backend.nbits")) == nbits))
    for group in evicting.values():  # each press's least and most evicted
        ratios = sorted(group, key=lambda p: float(p.get("press.ratio")))
        ends += list(dict.fromkeys((ratios[0], ratios[-1])))
    return dense + ends
