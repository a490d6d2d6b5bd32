"""A run's figure prints one way everywhere (the run's table, benchmarks' tables): its interval where
its rounds support one, else the words that say why not, never a range of zero width."""

from __future__ import annotations

import json
import re
from pathlib import Path

from kvpipe import catalogue
from kvpipe.record.report import figure_text

TPOT = catalogue.get("tpot_ms")
BENCHMARKS = Path(__file__).parent.parent / "benchmarks"


def test_one_round_prints_its_figure_and_says_why_there_is_no_interval():
    metrics = {"tpot_ms": 67.9, "tpot_ms_ci_low": float("nan"), "tpot_ms_ci_high": float("nan")}
    tags = {"round_tpot_ms": json.dumps([67.9])}
    assert figure_text(TPOT, metrics, tags) == "67.9 ms (1 round, no interval)"
    assert figure_text(TPOT, metrics, tags, unit=False) == "67.9 (1 round, no interval)"


def test_rounds_without_spread_print_no_zero_width_interval():
    metrics = {"tpot_ms": 67.9, "tpot_ms_ci_low": 67.9, "tpot_ms_ci_high": 67.9}
    shown = figure_text(TPOT, metrics, {"round_tpot_ms": json.dumps([67.9, 67.9])}, unit=False)
    assert shown == "67.9 (2 rounds: no spread measured, no interval)"


def test_rounds_that_support_an_interval_print_it():
    metrics = {"tpot_ms": 50.0, "tpot_ms_ci_low": 48.0, "tpot_ms_ci_high": 52.5}
    assert (
        figure_text(TPOT, metrics, {"round_tpot_ms": json.dumps([49.0, 50.0, 51.0])}, unit=False) == "50.0 (48.0–52.5)"
    )


def test_the_benchmarks_that_print_timings_print_them_as_kvpipe_does():
    for name in ("eviction.py", "sliding_window.py"):
        source = (BENCHMARKS / name).read_text()
        assert "figure_text(" in source
        assert not re.search(r"_ci_(low|high)'\]:\.\d", source)  # no interval formatted on its own


def test_the_run_table_says_once_what_several_figures_share_in_place_of_an_interval():
    from kvpipe.record.report import said_once

    rows = [("TTFT", "9.8 ms (1 round, no interval)"), ("TPOT", "5.9 ms (1 round, no interval)"),
            ("timing noise", "4%"), ("end-to-end", "51.2 ± 4.3 ms")]  # fmt: skip
    shown, once = said_once(rows)
    assert shown == [("TTFT", "9.8 ms"), ("TPOT", "5.9 ms"), ("timing noise", "4%"), ("end-to-end", "51.2 ± 4.3 ms")]
    assert once == "TTFT, TPOT: 1 round, no interval"


def test_words_only_one_figure_has_or_that_differ_stay_beside_their_figures():
    from kvpipe.record.report import said_once

    alone = [("TTFT", "9.8 ms (1 round, no interval)"), ("TPOT", "5.9 (5.1–6.8) ms")]
    assert said_once(alone) == (alone, None)
    differing = [("TTFT", "9.8 ms (1 round, no interval)"), ("TPOT", "5.9 ms (3 rounds: too noisy for an interval)")]
    assert said_once(differing) == (differing, None)
