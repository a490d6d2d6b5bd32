"""How sure a timing is: a percentile-bootstrap confidence interval of a mean (criterion.rs reports
its figures this way), resampled from the seed so that a run's interval is the same when computed
again from the same calls."""

from __future__ import annotations

import math

LEVEL = 0.95  # the share of resampled means the interval holds
RESAMPLES = 2000
CELLS = 1_000_000  # indices drawn at once (8 MB): a run's thousands of inter-token gaps stay cheap


def bootstrap_interval(values: list[float], level: float = LEVEL, resamples: int = RESAMPLES, seed: int = 0):
    """(low, high) of the mean of `values` at `level`; NaNs where fewer than two values are finite."""
    import numpy as np

    finite = np.asarray([v for v in values if v == v and not math.isinf(v)], dtype=float)
    if len(finite) < 2:
        return math.nan, math.nan
    draw, n = np.random.default_rng(seed), len(finite)
    rows = max(1, CELLS // n)  # resamples drawn together: vectorised, yet at most CELLS indices in memory
    means = np.concatenate([
        finite[draw.integers(0, n, size=(min(rows, resamples - start), n))].mean(axis=1)
        for start in range(0, resamples, rows)
    ])  # fmt: skip
    tail = (1 - level) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(low), float(high)


def with_intervals(metrics: dict[str, float], samples: dict[str, list[float]]) -> dict[str, float]:
    """`NAME_ci_low` and `NAME_ci_high` for each sampled figure: the interval of its mean."""
    for name, values in samples.items():
        metrics[f"{name}_ci_low"], metrics[f"{name}_ci_high"] = bootstrap_interval(values)
    return metrics


def ratio_interval(
    values: list[float],
    baseline: list[float],
    paired: bool,
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(ratio, low, high): mean(values) / mean(baseline) and its interval at `level`. paired: the
    two were measured in the same rounds, so round i of each is resampled together (what drifted
    in round i cancels in the ratio); otherwise each is resampled on its own. NaNs where either has
    fewer than two values."""
    import numpy as np

    x, b = np.asarray(values, dtype=float), np.asarray(baseline, dtype=float)
    if paired:
        n = min(len(x), len(b))
        keep = np.isfinite(x[:n]) & np.isfinite(b[:n])
        x, b = x[:n][keep], b[:n][keep]
    else:
        x, b = x[np.isfinite(x)], b[np.isfinite(b)]
    if len(x) < 2 or len(b) < 2 or not b.mean():
        return math.nan, math.nan, math.nan
    draw = np.random.default_rng(seed)
    picked_x = draw.integers(0, len(x), size=(resamples, len(x)))
    picked_b = picked_x if paired else draw.integers(0, len(b), size=(resamples, len(b)))
    ratios = x[picked_x].mean(axis=1) / b[picked_b].mean(axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(ratios, [tail, 1 - tail])
    return float(x.mean() / b.mean()), float(low), float(high)
