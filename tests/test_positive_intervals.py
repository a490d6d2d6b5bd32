"""Every interval kvpipe records or prints for a time or a rate lies inside (0, inf), and a table
says in words where a handful of rounds cannot support an interval worth printing."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from kvpipe.measure import uncertainty
from kvpipe.measure.request_figures import Served, serving_metrics
from kvpipe.measure.round_figures import over_rounds, relative_half_width, round_tags
from kvpipe.measure.uncertainty import interval_note, mean_interval, ratio_interval, rounds_needed, with_intervals
from kvpipe.record.report import run_rows

SPREAD_40 = [
    100.0,
    141.0,
    59.0,
]  # ms: 3 rounds, a standard deviation of 41% of their mean, as a contended `make run` measured them


def job_figures(per_round: dict[str, list[float]]) -> tuple[dict, dict]:
    """(metrics, tags) as a job records its round figures: each figure's mean, its interval over
    the rounds, and the round means as tags."""
    metrics = {name: float(np.mean(values)) for name, values in per_round.items()}
    metrics.update(over_rounds(per_round))
    return metrics, round_tags(per_round)


def bounds(metrics: dict) -> list[float]:
    return [value for name, value in metrics.items() if name.endswith(("_ci_low", "_ci_high"))]


def test_three_rounds_forty_percent_apart_record_bounds_above_zero():
    per_round = {"ttft_ms": SPREAD_40, "tpot_ms": SPREAD_40, "decode_tokens_per_s": [1e3 / v for v in SPREAD_40]}
    metrics, _ = job_figures(per_round)
    assert len(bounds(metrics)) == 6 and all(0 < bound < math.inf for bound in bounds(metrics))
    assert metrics["tpot_ms_ci_low"] < 100 < metrics["tpot_ms_ci_high"]
    mean, sd = np.mean(SPREAD_40), np.std(SPREAD_40, ddof=1)
    assert mean - 4.303 * sd / math.sqrt(3) < 0  # Student's t on the raw values: the negative time it printed


def test_three_rounds_forty_percent_apart_print_words_and_the_rounds_that_would_do():
    per_round = {"ttft_ms": SPREAD_40, "tpot_ms": SPREAD_40, "decode_tokens_per_s": [1e3 / v for v in SPREAD_40]}
    rows = dict(run_rows(*job_figures(per_round)))
    needed = rounds_needed(SPREAD_40)
    assert rows["TPOT"] == f"100.0 ms (3 rounds: too noisy for an interval; ~{needed} would give ±10%)"
    assert not any(re.search(r"-\d", text) for text in rows.values())
    assert all("too noisy" in rows[label] for label in ("TTFT", "decode"))


def test_the_rounds_a_note_asks_for_give_an_interval_within_ten_percent():
    """n from the measured spread: at n rounds of that spread the interval is within ±10%, at n - 1 not."""
    needed = rounds_needed(SPREAD_40)
    spread = np.std(SPREAD_40, ddof=1) / np.mean(SPREAD_40)
    half = [uncertainty._t(0.95, n) * spread / math.sqrt(n) for n in (needed - 1, needed)]
    assert half[0] > math.log(1.1) >= half[1]
    assert 60 < needed < 90  # (1.96 · 0.4 / 0.095)² ≈ 68, a little more for t
    assert rounds_needed([50.0, 50.0, 50.0]) is None  # no spread: no number to give


def test_a_served_pass_of_requests_forty_percent_apart_records_bounds_above_zero():
    served = [Served(0.0, 0.0, [0.01 + step * tpot / 1e3 for step in range(5)], 0.5, 10, [1] * 5) for tpot in SPREAD_40]
    metrics = serving_metrics([served], max_in_flight=3, max_ttft_ms=None, max_tpot_ms=None)
    assert metrics["tpot_ms_ci_low"] > 0 and 0 < metrics["ttft_ms_ci_low"] <= metrics["ttft_ms_ci_high"]


def test_one_round_shows_its_figure_and_says_it_has_no_interval():
    """A single static batch: every request shared its steps, an interval over them has zero width."""
    metrics = {"tpot_ms": 67.9, "tpot_ms_ci_low": 67.9, "tpot_ms_ci_high": 67.9, "rounds": 1.0}
    rows = dict(run_rows(metrics, round_tags({"tpot_ms": [67.9]})))
    assert rows["TPOT"] == "67.9 ms (1 round, no interval)"
    assert interval_note(67.9, 67.9, [67.9, 67.9]) == "2 rounds: no spread measured, no interval"


def test_a_steady_run_prints_its_interval():
    rows = dict(run_rows(*job_figures({"tpot_ms": [50.0, 51.0, 49.5]})))
    assert re.fullmatch(r"50\.2 \(4\d\.\d–5\d\.\d\) ms", rows["TPOT"])


@pytest.mark.parametrize("sigma", [0.05, 0.5, 1.5, 3.0])
def test_no_mean_interval_of_positive_values_reaches_zero_or_infinity(sigma):
    draw = np.random.default_rng(11)
    for n in list(range(2, 13)) + [29, 30, 45]:
        for _ in range(40):
            values = list(draw.uniform(1e-3, 1) * np.exp(draw.normal(0, sigma, n)))
            low, high = mean_interval(values)
            assert 0 < low <= high < math.inf
            if n < uncertainty.BOOTSTRAP_FROM:
                assert low <= np.mean(values) <= high  # centred on the mean the table shows
            recorded = with_intervals({}, {"tpot_ms": values})
            assert (recorded["tpot_ms_ci_low"], recorded["tpot_ms_ci_high"]) == (low, high)


def test_no_ratio_interval_of_positive_rounds_reaches_zero_or_infinity():
    draw = np.random.default_rng(12)
    for n in range(2, 13):
        for paired in (True, False):
            for _ in range(20):
                mine, theirs = (list(np.exp(draw.normal(0, 1.0, n))) for _ in range(2))
                ratio, low, high = ratio_interval(mine, theirs, paired)
                assert 0 < low <= ratio <= high < math.inf


def test_the_log_interval_holds_the_mean_as_often_as_it_says():
    """Rounds whose spread is log-normal (a slow spell slows by a factor): the 95% interval holds
    their true mean 92-98% of the time at 3 and at 6 rounds."""
    draw = np.random.default_rng(13)
    for n in (3, 6):
        intervals = [mean_interval(list(10 * np.exp(draw.normal(0, 0.3, n)))) for _ in range(400)]
        held = sum(low <= 10 * math.exp(0.3**2 / 2) <= high for low, high in intervals)
        assert 0.92 <= held / 400 <= 0.98


def test_repeats_auto_reads_the_same_half_width_as_before_for_a_few_rounds():
    """log(high / low) / 2 is t · s / (mean · √n), the relative half-width Student's t gave."""
    values = [10.0, 10.4, 9.7, 10.1]
    expected = uncertainty._t(0.95, 4) * np.std(values, ddof=1) / np.mean(values) / 2
    assert relative_half_width(values) == pytest.approx(expected)


def test_an_accuracy_prints_its_interval_however_wide_it_is():
    """A share over few answers: Wilson's 0%-49% is what says there were few, not noise to hide."""
    from kvpipe import workload

    accuracy = workload.metrics()["task_accuracy"]
    metrics = {"task_accuracy": 0.0, "task_accuracy_ci_low": 0.0, "task_accuracy_ci_high": 0.49}
    assert dict(run_rows(metrics, {}))["task accuracy"] == "0% (0%–49%)"
    assert accuracy.is_share and interval_note(0.0, 0.49, [], share=True) is None
    assert interval_note(0.0, 0.49, []) == "too noisy for an interval"  # a latency's would be
