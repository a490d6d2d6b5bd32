"""load.stop_when_missed_at: a pass stops letting requests in once its targets are missed at that
percentile whatever its other requests do, which is how `kvpipe capacity` ends a rate point it has
already failed; and the capacity search's points after a cache's ceiling skip the warm-up."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from kvpipe.job.runner import run_job
from kvpipe.measure.request_figures import Served, certain_miss, percentile
from kvpipe.orchestrate.capacity.walker import Walker

from conftest import TINY, spec_for

RATE = (*TINY, "workload.max_new_tokens=4", "workload.repeats=1", "workload.warmup=0", "load=rate", "load.rate=50")


def answered(ttft_ms: float) -> Served:
    return Served(0.0, 0.0, [ttft_ms / 1e3, ttft_ms / 1e3 + 0.01], 0.1, 4, [1, 2])


@pytest.mark.parametrize("at", [50, 90, 99])
def test_the_rule_says_missed_exactly_when_the_pass_misses_even_if_every_other_request_meets(at):
    """For every pass size and every count of answered requests and misses among them: the rule calls
    the miss certain exactly when the pass's nearest-rank percentile exceeds the target with every
    request not yet answered meeting it (the best the rest could do)."""
    for total in range(1, 21):
        for done, missed in itertools.product(range(total + 1), range(total + 1)):
            if missed > done:
                continue
            so_far = [answered(500.0)] * missed + [answered(10.0)] * (done - missed)
            best_case = [s.ttft_ms for s in so_far] + [10.0] * (total - done)
            misses = percentile(best_case, at / 100) > 100.0
            assert bool(certain_miss(so_far, total, 100.0, None, at)) == misses, (total, done, missed)
            if misses:  # and the answered requests alone show it: their figures are what the run records
                assert percentile([s.ttft_ms for s in so_far], at / 100) > 100.0


def test_the_rule_reads_tpot_as_well_and_says_why():
    slow = Served(0.0, 0.0, [0.01, 1.01], 1.01, 4, [1, 2])  # TPOT 1,000 ms
    assert certain_miss([slow] * 2, 16, None, 500.0, 90) == "2 of its 16 requests had TPOT above 500 ms, so p90 TPOT misses it"  # fmt: skip
    assert certain_miss([slow], 16, None, 500.0, 90) is None
    assert certain_miss([slow] * 16, 16, 10_000.0, None, 90) is None  # no TPOT target: only TTFT's counts


@pytest.mark.slow  # two served jobs of the tiny model
@pytest.mark.parametrize("cache", ["dynamic", "paged"])  # static batches, and continuous batching
def test_a_pass_that_has_missed_its_target_lets_no_more_requests_in_and_says_so(cache):
    spec = spec_for(*RATE, f"cache={cache}", "load.requests=8", "load.max_ttft_ms=0.001", "load.stop_when_missed_at=90")
    job = run_job(spec)
    served = int(job.metrics["served_requests"])
    assert 1 <= served < 8  # p90 of 8: the slowest one; the first TTFT over 1 µs decides it
    assert job.metrics["ttft_p90_ms"] > 0.001 and job.metrics["within_targets"] == 0
    (note,) = [n for n in job.notes if "stop_when_missed_at" in n]
    assert note.startswith(f"stopped after {served} of its 8 requests") and "p90 TTFT misses it" in note
    everyone = run_job(spec_for(*RATE, f"cache={cache}", "load.requests=8", "load.max_ttft_ms=0.001"))
    assert everyone.metrics["served_requests"] == 8 and not [n for n in everyone.notes if "stop_when" in n]


def test_unset_it_leaves_a_served_runs_key_and_params_alone_and_set_it_is_keyed():
    plain, stopping = spec_for(*RATE, "load.max_ttft_ms=100"), spec_for(*RATE, "load.max_ttft_ms=100", "load.stop_when_missed_at=90")  # fmt: skip
    assert "load.stop_when_missed_at" not in plain.params() and stopping.params()["load.stop_when_missed_at"] == "90"
    assert plain.measurement_key() != stopping.measurement_key()


@pytest.mark.parametrize(
    "overrides, says",
    [
        (("load.max_ttft_ms=100", "load.stop_when_missed_at=95"), "expected one of 50, 90, 99"),
        (("load.stop_when_missed_at=90",), "it stops on a missed target: expected load.max_ttft_ms"),
        (("load.max_ttft_ms=100", "load.stop_when_missed_at=90", "workload.repeats=2"), "expected workload.repeats=1"),
        (("load.max_ttft_ms=100", "load.stop_when_missed_at=90", "workload=conversation"), "turns arrive after"),
    ],
)
def test_a_bad_setting_is_one_line_naming_the_field(overrides, says):
    from kvpipe.errors import ConfigError

    with pytest.raises(ConfigError, match="load.stop_when_missed_at") as refused:
        spec_for(*RATE, *overrides)
    assert says in str(refused.value) and "\n" not in str(refused.value)


def walker(jobs_run_here: bool, *fixed: str, max_accuracy_drop: float | None = None) -> Walker:
    settings = SimpleNamespace(walk="rate", percentile=90, max_ttft_ms=2000.0, max_tpot_ms=None,
                               max_accuracy_drop=max_accuracy_drop)  # fmt: skip
    spec = spec_for(*TINY, *fixed, "load=rate")
    return Walker(settings, ["dynamic"], list(fixed), spec, {}, None, None, jobs_run_here)


def test_a_rate_point_stops_once_missed_and_skips_the_warm_up_after_its_caches_ceiling_ran_here():
    here = walker(True)
    ceiling, rate = ["load=offline"], ["load=rate"]
    assert "workload.warmup=0" not in here.point_overrides("dynamic", ceiling)  # the first job warms the cache up
    assert "load.stop_when_missed_at=90" not in here.point_overrides("dynamic", ceiling)  # the ceiling serves all
    assert "workload.warmup=0" not in here.point_overrides("dynamic", rate)  # not served here yet
    here.warm.add("dynamic")  # its ceiling ran in this process
    assert {"workload.warmup=0", "load.stop_when_missed_at=90"} <= set(here.point_overrides("dynamic", rate))
    # what the user set stands: their warm-up, their passes (and so every request of each)
    theirs = walker(True, "workload.warmup=2", "workload.repeats=3")
    theirs.warm.add("dynamic")
    assert not {"workload.warmup=0", "load.stop_when_missed_at=90"} & set(theirs.point_overrides("dynamic", rate))


def test_only_a_search_that_needs_full_precisions_accuracy_runs_the_quality_pass_on_its_ceilings():
    ceiling, rate = ["load=offline"], ["load=rate"]
    latency_only = walker(True)
    assert "quality=off" in latency_only.point_overrides("dynamic", ceiling)
    assert "quality=off" in latency_only.point_overrides("dynamic", rate)
    against_full_precision = walker(True, max_accuracy_drop=0.1)  # its reference: the ceilings' quality pass
    assert "quality=off" not in against_full_precision.point_overrides("dynamic", ceiling)
    assert "quality=off" in against_full_precision.point_overrides("dynamic", rate)
    asked = walker(True, "quality.windows=2")  # the user's quality settings stand
    assert "quality=off" not in asked.point_overrides("dynamic", ceiling) + asked.point_overrides("dynamic", rate)
