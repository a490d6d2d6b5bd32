"""The request-rate search as pure logic: given the rates measured so far (the highest that met the
targets, the lowest that missed), the next rate to measure, or None when the answer is within its
resolution. It starts at the ceiling (the cache's maximum throughput: above it the queue only grows),
steps down from a miss until a rate meets (by half, or by a quarter where the miss was near: less
than NEAR past its target; down to about a sixteenth of the ceiling, MOST_HALVINGS halvings' worth),
then bisects between the rate that met and the one that missed until they are within the resolution
of the one that met. A point costs its requests over its rate in arrivals alone (16 at 0.2/s: 80 s),
so a rate far below the answer is the dearest to measure: a near miss does not halve past it."""

from __future__ import annotations

import math
from typing import Callable

MOST_HALVINGS = 4  # a cache that misses even at a sixteenth of its maximum throughput: said so, not searched further
SIGNIFICANT = 3  # rates are rounded to this many figures: a repeated search asks for the same rates (resume)
NEAR = 0.25  # a miss by less than this (relative to its target) steps down by NEAR_STEP, not by half
NEAR_STEP = 0.75


def rounded(rate: float) -> float:
    """The rate to 3 significant figures."""
    if rate <= 0:
        return rate
    return round(rate, SIGNIFICANT - 1 - math.floor(math.log10(rate)))


def next_rate(met: float | None, missed: float | None, ceiling: float, resolution: float,
              near: bool = False) -> float | None:  # fmt: skip
    """The next rate to measure: `met` is the highest rate that met the targets, `missed` the lowest
    above it that missed (None: not yet); `resolution` is relative (0.1: within 10% of the answer);
    `near`: `missed` missed its targets by less than NEAR (a search asked again reads the same
    figures back, so it asks for the same rates)."""
    ceiling = rounded(ceiling)
    if missed is None:
        return ceiling if met is None else None  # met at the ceiling: nothing above it to search
    if met is None:  # halvings counted, not compared: a rounded rate may fall just below ceiling / 16
        if round(math.log2(ceiling / missed)) >= MOST_HALVINGS:
            return None
        lower = rounded(missed * (NEAR_STEP if near else 0.5))
        return lower if lower > 0 else None
    if missed - met <= resolution * met:
        return None
    middle = rounded((met + missed) / 2)
    return middle if met < middle < missed else None


def highest_meeting(meets: Callable[[float], bool], ceiling: float, resolution: float):
    """(highest rate met or None, lowest rate missed above it or None, rates measured in order),
    asking `meets(rate)` of each rate the search visits."""
    met = missed = None
    visited = []
    while (rate := next_rate(met, missed, ceiling, resolution)) is not None:
        visited.append(rate)
        if meets(rate):
            met = rate
        else:
            missed = rate
    return met, missed, visited
