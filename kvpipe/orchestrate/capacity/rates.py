"""The request-rate search as pure logic: given the rates measured so far (the highest that met the
targets, the lowest that missed), the next rate to measure, or None when the answer is within its
resolution. It starts at the ceiling (the cache's maximum throughput: above it the queue only grows),
halves down from a miss until a rate meets (at most MOST_HALVINGS times), then bisects between the
rate that met and the one that missed until they are within the resolution of the one that met."""

from __future__ import annotations

import math
from typing import Callable

MOST_HALVINGS = 4  # a cache that misses even at a sixteenth of its maximum throughput: said so, not searched further
SIGNIFICANT = 3  # rates are rounded to this many figures: a repeated search asks for the same rates (resume)


def rounded(rate: float) -> float:
    """The rate to 3 significant figures."""
    if rate <= 0:
        return rate
    return round(rate, SIGNIFICANT - 1 - math.floor(math.log10(rate)))


def next_rate(met: float | None, missed: float | None, ceiling: float, resolution: float) -> float | None:
    """The next rate to measure: `met` is the highest rate that met the targets, `missed` the lowest
    above it that missed (None: not yet); `resolution` is relative (0.1: within 10% of the answer)."""
    ceiling = rounded(ceiling)
    if missed is None:
        return ceiling if met is None else None  # met at the ceiling: nothing above it to search
    if met is None:  # halvings counted, not compared: a rounded rate may fall just below ceiling / 16
        if round(math.log2(ceiling / missed)) >= MOST_HALVINGS:
            return None
        lower = rounded(missed / 2)
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
