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


def ratio_interval(values: list[float], baseline: list[float], paired: bool, level: float = LEVEL):
    """(ratio, low, high) of values against baseline, at `level`. paired: the two were measured in
    the same rounds, so round i of each is compared with round i of the other (what drifted in that
    round cancels): the ratio is the geometric mean of the rounds' ratios, its interval Student's t
    on their logs. Otherwise mean over mean, its interval Welch's t on the log of that ratio (the
    delta method). Student's t rather than a percentile bootstrap: with the handful of rounds a sweep
    runs, a bootstrap's interval is too narrow and would call differences that are not there. NaNs
    where either has fewer than two values."""
    import numpy as np
    from scipy import stats

    x, b = np.asarray(values, dtype=float), np.asarray(baseline, dtype=float)
    tail = (1 - level) / 2
    if paired:
        n = min(len(x), len(b))
        logs = np.log(x[:n] / b[:n])
        logs = logs[np.isfinite(logs)]
        if len(logs) < 2:
            return math.nan, math.nan, math.nan
        centre, spread = logs.mean(), stats.t.ppf(1 - tail, len(logs) - 1) * logs.std(ddof=1) / math.sqrt(len(logs))
    else:
        x, b = x[np.isfinite(x) & (x > 0)], b[np.isfinite(b) & (b > 0)]
        if len(x) < 2 or len(b) < 2:
            return math.nan, math.nan, math.nan
        parts = [v.var(ddof=1) / (len(v) * v.mean() ** 2) for v in (x, b)]  # each log-mean's variance
        se = math.sqrt(sum(parts))
        freedom = sum(parts) ** 2 / sum(part**2 / (len(v) - 1) for part, v in zip(parts, (x, b))) if se else 1
        centre, spread = math.log(x.mean() / b.mean()), stats.t.ppf(1 - tail, freedom) * se
    return float(math.exp(centre)), float(math.exp(centre - spread)), float(math.exp(centre + spread))
