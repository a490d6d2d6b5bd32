"""The frontier walk: a sampler that spends the trial budget where the Pareto front can still grow,
using what is known about a configuration before it is measured.

Two things are known before a job runs:
- its memory objective, exactly: `kvpipe plan`'s prediction of the KV cache's bytes (on CUDA, weights
  plus KV cache, the peak's floor);
- an order of quality: within one backend, more bits, a longer full-precision residual, smaller
  groups and the kivi layout (keys per channel, values per token) each keep more of the cache exact
  (SAFER; LAYOUTS_SAFER_THAN in kvpipe.cache.backends.base), so a configuration's quality loss is no
  smaller than that of any configuration below it in that order. It is a prior, from quantization
  research (KIVI, KVQuant), that kvpipe's own grids bear out (the grid of benchmarks/search_vs_grid.py:
  all 38 of its ordered pairs); nothing it implies is reported as measured. Within one press, a
  smaller ratio evicts fewer tokens (the press's scores rank the same tokens, and a smaller ratio keeps a
  superset of them), likewise a prior (benchmarks/eviction.py measures it).

The walk measures the lossless reference (dynamic) first, then each backend and each press once, at its
safest point (so a budget as small as the number of kinds still tries every one), then the other dense
variants (exact, few, and the fast end of the front), then walks each quantized or evicting family
from its safest point toward more compression: a configuration becomes eligible once
every one step safer neighbour has been measured within the quality limit. Among eligible ones it
measures the one whose optimistic figures (its exact bytes, the best TPOT its backend has shown, the
quality loss its safer neighbours prove it cannot beat) would add the most hypervolume to the front
measured so far. A configuration below one that missed the quality limit is never eligible: the
search infers that it misses too (`inferred_misses`) and says so rather than measuring it.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
from optuna.distributions import CategoricalDistribution
from optuna.samplers import BaseSampler, RandomSampler
from optuna.trial import TrialState

from kvpipe.cache.backends.base import LAYOUTS_SAFER_THAN
from kvpipe.orchestrate.search.space import Point, Space

# The ordered numeric dimensions of a quantized configuration, and which way is safer (keeps more exact)
SAFER = {"backend.nbits": 1, "backend.residual_length": 1, "backend.q_group_size": -1, "press.ratio": -1}
ORDERED = (*SAFER, "axis")


def compresses(point: Point) -> bool:
    """Whether the point stores fewer bits or fewer tokens: the points a quality order covers."""
    return point.get("backend") is not None or point.get("press") is not None


def kind(point: Point) -> tuple:
    """How a point shrinks the cache: its backend, or its press (a family's ordered settings aside)."""
    return (point.get("backend"), point.get("press"))


def family(point: Point) -> tuple:
    """What a quality order holds within: every setting but the ordered ones (the backend, mostly)."""
    return tuple((k, v) for k, v in point.settings if k not in ORDERED)


def _safer_value(name: str, safer: str, value: str) -> bool:
    """Whether `safer` keeps at least as much exact as `value` in dimension `name`."""
    if name == "axis":
        return safer == value or value in LAYOUTS_SAFER_THAN.get(safer, ())
    return (float(safer) - float(value)) * SAFER[name] >= 0


def at_least_as_safe(safer: Point, point: Point) -> bool:
    """Whether `safer` keeps at least as much exact as `point` in every ordered dimension (same family)."""
    if not compresses(point) or family(safer) != family(point):
        return False
    return all(_safer_value(name, safer.get(name), point.get(name)) for name in ORDERED if point.get(name) is not None)


def safer_neighbours(space: Space, point: Point) -> list[Point]:
    """The configurations one step safer than `point` in one ordered dimension (same family)."""
    if not compresses(point):
        return []
    same = [p for p in space.points if family(p) == family(point)]
    found = []
    for name in ORDERED:
        here = point.get(name)
        if here is None:
            continue
        others = [p for p in same if all(p.get(o) == point.get(o) for o in ORDERED if o != name)]
        up = {p.get(name) for p in others if p.get(name) != here and _safer_value(name, p.get(name), here)}
        # the nearest: a safer value no other safer value lies between
        nearest = {v for v in up if not any(w != v and _safer_value(name, v, w) for w in up)}
        found += [p for p in others if p.get(name) in nearest]
    return found


def inferred_misses(space: Space, measured: dict[Point, list[float]], quality_limit: float | None) -> dict:
    """Unmeasured configurations whose quality loss is proved no better than a measured one that missed
    `quality_limit`: {point: (that measured point, its quality loss)}."""
    if quality_limit is None:
        return {}
    misses = [(p, v[2]) for p, v in measured.items() if v[2] > quality_limit]
    found = {}
    for point in space.points:
        if point in measured:
            continue
        for missed, loss in misses:
            if at_least_as_safe(missed, point):
                found[point] = (missed, loss)
                break
    return found


class FrontierSampler(BaseSampler):
    """An Optuna sampler: each trial it is asked for is the walk's next configuration (see above);
    `predicted_memory(point)` gives a configuration's memory objective before it runs."""

    def __init__(self, space: Space, predicted_memory: Callable[[Point], float], quality_limit: float | None,
                 seed: int = 0) -> None:  # fmt: skip
        self.space, self.quality_limit = space, quality_limit
        self._predicted_memory = predicted_memory
        self._memory: dict[Point, float] = {}
        self._random = RandomSampler(seed=seed)

    # ---- Optuna's interface ----------------------------------------------------------------------

    def infer_relative_search_space(self, study, trial) -> dict:
        return {name: CategoricalDistribution(values) for name, values in self.space.choices().items()}

    def sample_relative(self, study, trial, search_space) -> dict:
        if not search_space:
            return {}
        point = self.next_point(study.get_trials(deepcopy=False))
        return self.space.encode(point) if point is not None else {}

    def sample_independent(self, study, trial, param_name, param_distribution):
        return self._random.sample_independent(study, trial, param_name, param_distribution)

    # ---- the walk --------------------------------------------------------------------------------

    def next_point(self, trials) -> Point | None:
        """The configuration to measure next, or None where the walk has none left."""
        measured, feasible, asked = {}, {}, set()
        for trial in trials:
            # a trial failed without an outcome was killed, or asked twice in one batch: ask it again
            if not trial.params or (trial.state == TrialState.FAIL and "outcome" not in trial.user_attrs):
                continue
            point = self.space.decode(trial.params)
            asked.add(point)
            if trial.state == TrialState.COMPLETE and trial.values:
                measured[point] = list(trial.values)
                if all(c <= 0 for c in trial.user_attrs.get("constraints", [])):
                    feasible[point] = list(trial.values)
        misses = inferred_misses(self.space, measured, self.quality_limit)
        left = [p for p in self.space.points if p not in asked and p not in misses]
        dense = [p for p in left if not compresses(p)]
        tried = {kind(p) for p in asked}
        if dense and (None, None) not in tried:
            return dense[0]  # the lossless reference (dynamic) before anything is compared with it
        untried = [p for p in left if kind(p) not in tried]
        if dense and not untried:
            return dense[0]  # the other dense variants once every kind has had its first trial
        if not left:
            return None
        # the walk goes on below a point that met the quality limit (its order is quality's), or one
        # that was pruned or failed; a TPOT or memory limit it missed says nothing of what lies below
        limit = math.inf if self.quality_limit is None else self.quality_limit
        ok = {p for p, v in measured.items() if v[2] <= limit} | {p for p in asked if p not in measured}
        eligible = [p for p in left if all(n in ok for n in safer_neighbours(self.space, p))] or left
        # every kind is measured once before any is walked further: a small budget still answers
        # whether a quantized cache, or a press, is worth it (the front's optimism would skip a kind
        # whose exact bytes another already beats, before any of it was measured)
        eligible = [p for p in eligible if compresses(p) and kind(p) not in tried] or eligible
        # (none is known to miss the quality limit: its floor would make it an inferred miss, not left)
        guesses = {p: self._optimistic(p, measured) for p in eligible}
        # the quality axis runs to the limit: what the front may still gain lies below it
        ceiling = [math.nan, math.nan, math.nan if self.quality_limit is None else self.quality_limit]
        front = np.array(list(feasible.values())).reshape(-1, 3)
        gains = hypervolume_gains(front, np.array(list(guesses.values())), np.array(ceiling))
        # the largest gain; between equal gains, the fewest bytes
        return max(zip(guesses, gains), key=lambda item: (item[1], -guesses[item[0]][0]))[0]

    def _optimistic(self, point: Point, measured: dict) -> list[float]:
        """Its exact memory, the best TPOT its kind has shown, and the quality loss it cannot beat."""
        if point not in self._memory:  # a composition each (~0.1-0.3 s): once per point, not per ask
            self._memory[point] = float(self._predicted_memory(point))
        return [self._memory[point], self._optimistic_tpot(point, measured), self._quality_floor(point, measured)]

    @staticmethod
    def _optimistic_tpot(point: Point, measured: dict) -> float:
        """The fastest TPOT measured in its family, else its backend, else any quantized point, else any."""
        for same in (
            lambda p: family(p) == family(point),
            lambda p: (p.get("backend"), p.get("press")) == (point.get("backend"), point.get("press")),
            lambda p: compresses(p),
            lambda p: True,
        ):
            tpots = [v[1] for p, v in measured.items() if same(p)]
            if tpots:
                return min(tpots)
        return 0.0

    @staticmethod
    def _quality_floor(point: Point, measured: dict) -> float:
        """The quality loss it cannot beat: the worst of the measured points at least as safe."""
        return max([v[2] for p, v in measured.items() if at_least_as_safe(p, point)], default=0.0)


def hypervolume(points, low: np.ndarray, high: np.ndarray) -> float:
    """The hypervolume `points` dominate (all objectives minimised), each axis scaled from `low` to
    `high`, with the reference point 1.1 beyond it: Optuna's WFG implementation."""
    from optuna._hypervolume import compute_hypervolume

    if not len(points):  # no feasible trial yet: nothing dominated (and (0, -1) is no shape to reshape to)
        return 0.0
    points = np.asarray(points, dtype=float).reshape(len(points), -1)
    scaled = (points - low) / np.where(high > low, high - low, 1.0)
    return float(compute_hypervolume(scaled, np.full(points.shape[1], 1.1)))


def hypervolume_gains(front: np.ndarray, candidates: np.ndarray, ceiling: np.ndarray | None = None) -> list[float]:
    """What each candidate alone adds to the hypervolume of `front`, on axes scaled to the range of
    front and candidates together (each raised to `ceiling` where that is a number)."""
    every = np.vstack([front, candidates])
    low, high = every.min(axis=0), every.max(axis=0)
    if ceiling is not None:
        high = np.where(np.isnan(ceiling), high, np.maximum(high, ceiling))
    before = hypervolume(front, low, high)
    return [hypervolume(np.vstack([front, c[None, :]]), low, high) - before for c in candidates]
