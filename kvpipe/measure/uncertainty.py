"""How sure a timing is: a percentile-bootstrap confidence interval of a mean (criterion.rs reports
its figures this way), resampled from the seed so that a run's interval is the same when computed
again from the same calls."""

from __future__ import annotations

import math
import random
import statistics

LEVEL = 0.95  # the share of resampled means the interval holds
RESAMPLES = 2000


def bootstrap_interval(values: list[float], level: float = LEVEL, resamples: int = RESAMPLES, seed: int = 0):
    """(low, high) of the mean of `values` at `level`; NaNs where fewer than two values are finite."""
    finite = [v for v in values if v == v and not math.isinf(v)]
    if len(finite) < 2:
        return math.nan, math.nan
    draw = random.Random(seed)
    means = sorted(statistics.fmean(draw.choices(finite, k=len(finite))) for _ in range(resamples))
    tail = (1 - level) / 2
    return means[int(tail * (resamples - 1))], means[math.ceil((1 - tail) * (resamples - 1))]


def with_intervals(metrics: dict[str, float], samples: dict[str, list[float]]) -> dict[str, float]:
    """`NAME_ci_low` and `NAME_ci_high` for each sampled figure: the interval of its mean."""
    for name, values in samples.items():
        metrics[f"{name}_ci_low"], metrics[f"{name}_ci_high"] = bootstrap_interval(values)
    return metrics
