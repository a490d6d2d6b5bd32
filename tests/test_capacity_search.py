"""kvpipe capacity's logic without a model: the rate search against a meet/miss oracle, and the verdict
(what binds) from recorded figures."""

from __future__ import annotations

import dataclasses
import math

import pytest

from kvpipe.decide.capacity import Point, Targets, judged, most_carried, verdict
from kvpipe.errors import ConfigError
from kvpipe.orchestrate.capacity.rates import MOST_HALVINGS, highest_meeting, next_rate, rounded
from kvpipe.orchestrate.capacity.walks import Figures, RateWalk

TARGETS = Targets(max_ttft_ms=2000, max_tpot_ms=150)


@pytest.mark.parametrize("true_capacity", [0.8, 1.0, 2.5, 7.9, 11.9])
@pytest.mark.parametrize("resolution", [0.1, 0.05])
def test_the_search_finds_the_highest_meeting_rate_to_its_resolution(true_capacity, resolution):
    met, missed, visited = highest_meeting(lambda rate: rate <= true_capacity, 12.0, resolution)
    assert met <= true_capacity < missed
    assert missed - met <= resolution * met
    assert len(visited) == len(set(visited))  # no rate measured twice


def test_a_cache_that_meets_at_its_ceiling_is_measured_once():
    met, missed, visited = highest_meeting(lambda rate: True, 12.0, 0.1)
    assert (met, missed, visited) == (12.0, None, [12.0])


def test_a_cache_that_misses_everywhere_stops_after_halving_down_to_a_sixteenth():
    met, missed, visited = highest_meeting(lambda rate: False, 16.0, 0.1)
    assert met is None and missed == 16.0 / 2**MOST_HALVINGS
    assert visited == [16.0, 8.0, 4.0, 2.0, 1.0]


@pytest.mark.parametrize("ceiling", [3.25, 2.24, 2.59, 16.0, 0.7])
def test_a_cache_that_misses_everywhere_is_measured_at_its_ceiling_and_four_halvings_whatever_the_rounding(ceiling):
    _, _, visited = highest_meeting(lambda rate: False, ceiling=ceiling, resolution=0.1)
    assert len(visited) == 1 + MOST_HALVINGS  # 3.25 / 16 = 0.203 while the rounded halvings reach 0.202


def test_rates_are_rounded_to_three_figures_so_a_repeated_search_asks_the_same_ones():
    assert rounded(1.23456) == 1.23 and rounded(123.456) == 123.0 and rounded(0.012345) == 0.0123
    assert next_rate(None, None, 3.14159, 0.1) == 3.14


def test_the_search_takes_fewer_points_than_a_grid_of_the_same_resolution():
    _, _, visited = highest_meeting(lambda rate: rate <= 5.3, 12.0, 0.1)
    assert len(visited) <= 7  # a grid 10% apart from 12/16 to 12 would hold 29 rates


def figures(ttft_p90=500.0, tpot_p90=50.0, within=1.0, in_flight=4.0, **more) -> dict:
    return {"ttft_p90_ms": ttft_p90, "tpot_p90_ms": tpot_p90, "within_targets": within,
            "max_in_flight": in_flight, "goodput_requests_per_s": 1.5, **more}  # fmt: skip


def test_the_targets_hold_at_the_chosen_percentile():
    p99 = Targets(max_ttft_ms=2000, percentile=99)
    assert not p99.misses(figures(ttft_p99_ms=1900))
    (miss,) = p99.misses(figures(ttft_p99_ms=2400))
    assert miss.what == "TTFT p99" and miss.text() == "TTFT p99 2400 ms > 2000 ms (+20%)"


def test_a_minimum_goodput_share_is_a_target_of_its_own():
    (miss,) = Targets(max_tpot_ms=150, min_goodput=0.95).misses(figures(within=0.8))
    assert miss.what == "goodput" and miss.text() == "goodput 80% < 95% of requests"


def test_the_verdict_names_the_target_the_first_failing_rate_missed_by_most():
    points = [judged(1.0, figures(), "", TARGETS), judged(2.0, figures(ttft_p90=2600, tpot_p90=160), "", TARGETS),
              judged(1.5, figures(tpot_p90=180), "", TARGETS)]  # fmt: skip
    found = verdict("dynamic", points, 2.0, 1000)
    assert (found.rate, found.failing.rate, found.binds) == (1.0, 1.5, "TPOT")
    assert "TPOT p90 180 ms > 150 ms (+20%) at 1.5/s" in found.why


def test_memory_binds_where_the_failing_rate_ran_out():
    points = [
        judged(1.0, figures(), "", TARGETS),
        judged(2.0, None, "FAILED: OutOfMemoryError: CUDA out of memory", TARGETS),
    ]
    found = verdict("static", points, 2.0, None)
    assert found.binds == "memory" and found.failing.rate == 2.0


def test_memory_binds_where_more_requests_were_in_flight_than_plans_bound():
    points = [judged(1.0, figures(in_flight=6), "", TARGETS, 8), judged(2.0, figures(in_flight=12), "", TARGETS, 8)]
    found = verdict("dynamic", points, 2.0, memory_requests=8)
    assert (found.rate, found.binds) == (1.0, "memory")  # 2/s met both latency targets, yet needs more memory
    assert "12 requests in flight; plan's memory bound is 8 at 2/s" in found.why


def test_meeting_at_the_ceiling_says_throughput_binds():
    found = verdict("paged", [judged(3.0, figures(), "", TARGETS)], 3.0, None)
    assert found.binds == "throughput" and found.failing is None


def test_nothing_meeting_says_which_target_misses_at_the_lowest_rate_and_by_how_much():
    points = [judged(rate, figures(ttft_p90=3000), "", TARGETS) for rate in (4.0, 2.0, 1.0)]
    found = verdict("quantized", points, 4.0, None)
    assert found.carried is None and found.rate == 0.0
    assert found.why.startswith("misses even at 1/s, the lowest rate tried: TTFT p90 3000 ms > 2000 ms (+50%)")
    assert most_carried([found]) is None


def test_a_rate_walk_starts_with_every_request_at_once_then_searches_below_its_throughput():
    walk = RateWalk("dynamic", TARGETS, 0.1, 16, None)
    assert walk.next_load() == ("every request at once", ["load=offline", "load.requests=16"])
    walk.tell(Figures({"requests_per_s": 4.0}))
    assert walk.next_load() == ("4/s", ["load=rate", "load.rate=4", "load.requests=16"])
    walk.tell(Figures(figures(ttft_p90=2500)))
    assert walk.next_load()[0] == "2/s"


def test_a_ceiling_that_failed_ends_the_walk_with_why():
    walk = RateWalk("paged", TARGETS, 0.1, 16, None)
    walk.tell(Figures(None, "FAILED: RuntimeError: CPU out of memory"))
    assert walk.next_load() is None
    assert walk.verdict().binds == "memory" and walk.verdict().why.startswith("with every request at once:")


@pytest.mark.parametrize(
    "targets, says",
    [
        (Targets(max_ttft_ms=0), "--max-ttft-ms=0 is not valid: expected a positive number"),
        (Targets(max_tpot_ms=-5), "--max-tpot-ms=-5 is not valid: expected a positive number"),
        (Targets(max_tpot_ms=math.nan), "--max-tpot-ms=nan is not valid"),
        (Targets(), "--max-ttft-ms=None is not valid: expected a target: --max-ttft-ms and/or --max-tpot-ms"),
        (Targets(max_tpot_ms=80, percentile=95), "--percentile=95 is not valid: expected one of 50, 90, 99"),
        (Targets(max_tpot_ms=80, min_goodput=1.5), "--min-goodput=1.5 is not valid"),
    ],
)
def test_bad_targets_are_one_line_naming_the_flag(targets, says):
    with pytest.raises(ConfigError) as raised:
        targets.check()
    assert says in str(raised.value) and "\n" not in str(raised.value)


def test_a_point_without_figures_never_meets():
    assert not Point(1.0, None, "FAILED").meets


def test_compare_shows_a_param_that_a_ceiling_point_did_not_log_as_blank():
    import pandas as pd

    from kvpipe.decide.runs import param_values

    runs = pd.DataFrame({"params.cache.strategy": ["dynamic", "dynamic"], "params.load.kind": ["offline", "rate"],
                         "params.load.rate": [float("nan"), "0.5"]}).astype({"params.load.rate": object})  # fmt: skip
    assert param_values(runs, "load.rate") == ["", "0.5"]  # load=offline logs no load.rate: blank, never "nan"


def test_an_accuracy_drop_floors_each_rate_at_full_precisions_accuracy_less_the_drop():
    from kvpipe.decide.capacity import Targets

    targets = Targets(max_ttft_ms=2000, max_accuracy_drop=0.1).check()
    point = {"ttft_p90_ms": 100.0, "task_accuracy": 0.7, "task_accuracy_ci_low": 0.5, "task_accuracy_ci_high": 0.85}
    unmeasured = targets.misses(point)  # no ceiling has measured full precision's accuracy yet: no rate carries
    assert [m.what for m in unmeasured] == ["accuracy"] and "full precision's, not measured" in unmeasured[0].text()
    known = dataclasses.replace(targets, reference_accuracy=0.9)
    (missed,) = known.misses(point)
    assert missed.text() == "accuracy 70% (50%–85%) < 80% (full precision's 90% less 10%)"
    assert not known.misses({**point, "task_accuracy": 0.8})
    # with --min-accuracy too, the higher floor holds
    both = dataclasses.replace(known, min_accuracy=0.85)
    assert both.accuracy_floor() == 0.85 and both.misses({**point, "task_accuracy": 0.82})
    assert "accuracy ≥ full precision's less 10%" in targets.describe()


def test_a_near_miss_steps_down_by_a_quarter_and_a_far_one_by_half():
    """A point costs its requests over its rate: a rate far below the answer is the dearest to measure."""
    assert next_rate(None, 4.0, 8.0, 0.1) == 2.0 and next_rate(None, 4.0, 8.0, 0.1, near=True) == 3.0
    walk = RateWalk("dynamic", TARGETS, 0.1, 16, None)
    walk.tell(Figures({"requests_per_s": 4.0}))
    walk.tell(Figures(figures(ttft_p90=2300)))  # +15%: near
    assert walk.next_load()[0] == "3/s"
    walk.tell(Figures(figures(ttft_p90=2300, tpot_p90=300)))  # TPOT +100%: far
    assert walk.next_load()[0] == "1.5/s"
    walk.tell(Figures(None, "FAILED: RuntimeError: CPU out of memory"))  # no figures: far
    assert walk.next_load()[0] == "0.75/s"


def test_a_cache_that_misses_near_everywhere_still_stops_at_about_a_sixteenth_of_its_ceiling():
    walk = RateWalk("paged", TARGETS, 0.1, 16, None)
    walk.tell(Figures({"requests_per_s": 16.0}))
    rates = []
    while (load := walk.next_load()) is not None:
        rates.append(float(load[0].removesuffix("/s")))
        walk.tell(Figures(figures(tpot_p90=160)))  # +7% at every rate
    assert rates[:3] == [16.0, 12.0, 9.0] and len(rates) <= 11 and 16.0 / 16 * 0.7 < rates[-1] < 16.0 / 8
