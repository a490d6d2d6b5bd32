"""How sure a figure is: the 95% confidence interval of a mean, of a ratio between two runs, and
when an interval is worth printing at all.

Every interval here is of a positive figure (a time, a rate, a count of bytes), and lies inside
(0, inf): a figure that cannot be negative never gets a bound at or below zero. A mean's interval
(mean_interval) below BOOTSTRAP_FROM values is Student's t on the log scale (the delta method:
mean × exp(±t · s / (mean · √n)), centred on the mean the table shows), where a percentile bootstrap
holds the mean far less often than it says (simulated on normal samples: 74% of the time at 3
values, 86% at 6, 91% at 12) and Student's t on the raw values crosses zero as soon as the spread is
wide (3 rounds 40% apart: -0.6 to 347 ms around 173). From BOOTSTRAP_FROM on, a percentile bootstrap
(criterion.rs reports its figures this way), which needs no assumption about the spread's shape (a
run's thousands of inter-token gaps, or a served load's requests): each resampled mean is a mean of
positive values, so positive. The bootstrap resamples from a seed, so a run's interval is the same
when computed again from the same values. A ratio's interval (ratio_interval) is on the logs too.
Shares (an accuracy) are not measured here: their workload's scoring gives Wilson's interval, or a t
interval held within 0..1 (kvpipe.workload.dataset.scoring); no figure that can be 0 or negative (KL,
a spread) records an interval.

An interval is printed only where it says something: from two rounds, with its ends apart and no
more than WORTH_PRINTING apart as a ratio (interval_note); in its place a table says why not, and
how many rounds would give ±TARGET."""

from __future__ import annotations

import math

LEVEL = 0.95  # the share of resampled means the interval holds
RESAMPLES = 2000
CELLS = 1_000_000  # indices drawn at once (8 MB): a run's thousands of inter-token gaps stay cheap
BOOTSTRAP_FROM = 30  # values; below, Student's t
# A difference is clear only where its whole interval lies beyond ±2%: smaller ones are within what
# no cache choice should turn on (criterion.rs's noise threshold, there 1%, plays the same part)
NEGLIGIBLE = 0.02
SLOWER, FASTER, SAME, UNDECIDED, NO_INTERVAL = "slower", "faster", "same", "undecided", "no interval"


def verdict(low: float, high: float) -> str:
    """A ratio's verdict from its interval: SLOWER or FASTER where the whole interval lies beyond
    ±NEGLIGIBLE of 1, SAME where it lies inside, UNDECIDED where it straddles an edge of that band;
    NO_INTERVAL without one. The one rule a sweep's stopping and compare's words both read."""
    if math.isnan(low) or math.isnan(high):
        return NO_INTERVAL
    if low > 1 + NEGLIGIBLE:
        return SLOWER
    if high < 1 - NEGLIGIBLE:
        return FASTER
    return SAME if low >= 1 - NEGLIGIBLE and high <= 1 + NEGLIGIBLE else UNDECIDED


def mean_interval(values: list[float], level: float = LEVEL) -> tuple[float, float]:
    """(low, high) of the mean of `values` (a positive figure's) at `level`: Student's t on the log
    scale for a few values (a job's rounds), a percentile bootstrap for many; NaNs where fewer than
    two values are finite or their mean is not positive."""
    finite = [v for v in values if v == v and not math.isinf(v)]
    if len(finite) >= BOOTSTRAP_FROM:
        return bootstrap_interval(finite, level)
    mean, spread = _relative_spread(finite)
    if spread != spread:
        return math.nan, math.nan
    half = _t(level, len(finite)) * spread / math.sqrt(len(finite))  # on log(mean)
    return mean * math.exp(-half), mean * math.exp(half)


def _relative_spread(finite: list[float]) -> tuple[float, float]:
    """(mean, standard deviation / mean) of the values; NaN where fewer than two or the mean is not positive."""
    mean = sum(finite) / len(finite) if finite else math.nan
    if len(finite) < 2 or not mean > 0:
        return mean, math.nan
    return mean, math.sqrt(sum((v - mean) ** 2 for v in finite) / (len(finite) - 1)) / mean


def _t(level: float, n: int) -> float:
    """Student's t quantile for a two-sided `level` interval of the mean of n values."""
    from scipy import stats

    return float(stats.t.ppf(1 - (1 - level) / 2, n - 1))


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
        half = _t(level, len(logs)) * logs.std(ddof=1) / math.sqrt(len(logs))  # Student's t on the log ratios
        return tuple(float(math.exp(logs.mean() + side * half)) for side in (0, -1, 1))
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


TARGET = 0.10  # the interval a "too noisy" note says how many rounds would give: ±10%
WORTH_PRINTING = 2.0  # an interval whose high end is over twice its low does not place its figure


def interval_note(low: float | None, high: float | None, rounds: list[float], share: bool = False) -> str | None:
    """None where the interval (low, high) is worth printing beside its figure; else the words to
    print in its place: '1 round, no interval', or '3 rounds: too noisy for an interval; ~74 would
    give ±10%', the rounds needed read from the spread of `rounds` (the figure's round means).
    `rounds` empty (a run recorded before round means were kept): judged on the interval alone.
    `share`: a proportion (accuracy over answers), whose interval (Wilson's) is printed however wide:
    0% (0%-49%) says how few answers there were, which is the point of printing it."""
    if share and _finite(low, high) and high >= low:
        return None
    if len(rounds) == 1:
        return "1 round, no interval"
    if not _finite(low, high):
        return f"{len(rounds)} rounds, no interval" if rounds else None
    if high > low > 0 and high <= WORTH_PRINTING * low:
        return None
    told = f"{len(rounds)} rounds: " if rounds else ""
    if not high > low:
        return f"{told}no spread measured, no interval"
    needed = rounds_needed(rounds)
    return f"{told}too noisy for an interval" + (f"; ~{needed} would give ±{TARGET:.0%}" if needed else "")


def rounds_needed(values: list[float], within: float = TARGET, level: float = LEVEL) -> int | None:
    """The fewest rounds whose 95% interval (mean_interval's, on the log scale) would be within
    ±`within` at the spread these values show: n with t(n) · s / (mean · √n) <= log(1 + within).
    None where the values show no spread, or fewer than two are finite."""
    _, spread = _relative_spread([v for v in values if v == v and not math.isinf(v)])
    if not spread > 0:  # NaN or none
        return None
    goal = math.log(1 + within)
    n = max(3, math.ceil((1.96 * spread / goal) ** 2))  # the normal quantile's answer, a lower bound
    while _t(level, n) * spread / math.sqrt(n) > goal:
        n += 1
    return n


def _finite(*values) -> bool:
    return all(v is not None and v == v and not math.isinf(v) for v in values)
