"""How sure a timing is: the 95% confidence interval of a mean, and of a ratio between two runs.

A mean's interval (mean_interval) is Student's t below BOOTSTRAP_FROM values, where a percentile
bootstrap holds the mean far less often than it says (simulated on normal samples: 74% of the time
at 3 values, 86% at 6, 91% at 12), and a percentile bootstrap from there on (criterion.rs reports
its figures this way), which needs no assumption about the spread's shape: a run's thousands of
inter-token gaps, or a served load's requests. The bootstrap resamples from a seed, so a run's
interval is the same when computed again from the same values."""

from __future__ import annotations

import math

LEVEL = 0.95  # the share of resampled means the interval holds
RESAMPLES = 2000
CELLS = 1_000_000  # indices drawn at once (8 MB): a run's thousands of inter-token gaps stay cheap
BOOTSTRAP_FROM = 30  # values; below, Student's t


def mean_interval(values: list[float], level: float = LEVEL) -> tuple[float, float]:
    """(low, high) of the mean of `values` at `level`: Student's t for a few values (a job's rounds),
    a percentile bootstrap for many; NaNs where fewer than two values are finite."""
    finite = [v for v in values if v == v and not math.isinf(v)]
    if len(finite) >= BOOTSTRAP_FROM:
        return bootstrap_interval(finite, level)
    if len(finite) < 2:
        return math.nan, math.nan
    from scipy import stats

    mean = sum(finite) / len(finite)
    sd = math.sqrt(sum((v - mean) ** 2 for v in finite) / (len(finite) - 1))
    half = stats.t.ppf(1 - (1 - level) / 2, len(finite) - 1) * sd / math.sqrt(len(finite))
    return mean - half, mean + half


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
        metrics[f"{name}_ci_low"], metrics[f"{name}_ci_high"] = mean_interval(values)
    return metrics


SIGNED_RANK_FROM = 6  # the fewest rounds for which a 95% signed-rank interval exists (2 / 2**6 < 0.05)


def ratio_interval(values: list[float], baseline: list[float], paired: bool, level: float = LEVEL):
    """(ratio, low, high) of values against baseline, at `level`. Where either has fewer than two
    values the ratio is still measured (one round against one round) and its interval is NaN; all
    three are NaN where either has none.

    paired: the two were measured in the same rounds, so round i of one is set against round i of
    the other and what drifted in that round cancels. From SIGNED_RANK_FROM rounds the ratio is the
    rounds' typical ratio (the Hodges-Lehmann estimate on their logs) and its interval Wilcoxon's
    signed-rank interval: a round that a slow spell split between the two, whose ratio is far out,
    does not carry it. Below that, Student's t on the rounds' log ratios.
    Unpaired: mean over mean, its interval Welch's t on the log of that ratio (the delta method).
    Not a percentile bootstrap: with the handful of rounds a sweep runs its interval is too narrow
    and would call differences that are not there."""
    import numpy as np
    from scipy import stats

    x, b = np.asarray(values, dtype=float), np.asarray(baseline, dtype=float)
    tail = (1 - level) / 2
    if paired:
        n = min(len(x), len(b))
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.log(x[:n] / b[:n])
        logs = logs[np.isfinite(logs)]
        if len(logs) < 2:
            return (float(math.exp(logs.mean())) if len(logs) else math.nan), math.nan, math.nan
        if len(logs) >= SIGNED_RANK_FROM:
            return tuple(float(math.exp(v)) for v in _signed_rank_interval(logs, tail))
        low, high = mean_interval(list(logs), level)  # Student's t: SIGNED_RANK_FROM is below BOOTSTRAP_FROM
        return float(math.exp(logs.mean())), float(math.exp(low)), float(math.exp(high))
    else:
        x, b = x[np.isfinite(x) & (x > 0)], b[np.isfinite(b) & (b > 0)]
        if len(x) < 2 or len(b) < 2:
            return (float(x.mean() / b.mean()) if len(x) and len(b) else math.nan), math.nan, math.nan
        parts = [v.var(ddof=1) / (len(v) * v.mean() ** 2) for v in (x, b)]  # each log-mean's variance
        se = math.sqrt(sum(parts))
        freedom = sum(parts) ** 2 / sum(part**2 / (len(v) - 1) for part, v in zip(parts, (x, b))) if se else 1
        centre, spread = math.log(x.mean() / b.mean()), stats.t.ppf(1 - tail, freedom) * se
    return float(math.exp(centre)), float(math.exp(centre - spread)), float(math.exp(centre + spread))


def _signed_rank_interval(d, tail: float) -> tuple[float, float, float]:
    """(Hodges-Lehmann estimate, low, high) of the centre of d: the median of its Walsh averages
    (d_i + d_j) / 2, i <= j, and the interval from the c-th smallest of them to the c-th largest,
    where c - 1 is the largest count with P(T <= c - 1) <= tail under the exact signed-rank
    distribution (its coverage is 1 - 2 P(T <= c - 1))."""
    import numpy as np

    n = len(d)
    walsh = np.sort((d[:, None] + d[None, :])[np.triu_indices(n)] / 2)
    ways = np.zeros(n * (n + 1) // 2 + 1)  # ways[t]: subsets of the ranks 1..n that sum to t
    ways[0] = 1
    for rank in range(1, n + 1):
        ways[rank:] = ways[rank:] + ways[:-rank].copy()
    below = np.cumsum(ways) / 2**n  # P(T <= t)
    c = int(np.searchsorted(below, tail, side="right"))  # the counts t < c have P(T <= t) <= tail
    return float(np.median(walsh)), float(walsh[c - 1]), float(walsh[len(walsh) - c])
