"""Bursts and ramps on load=rate: the gaps' coefficient of variation the burstiness sets, the ramp's
arrivals (sparse at first, the rate once it ends), the offered load a served run records, and the
refusals of a ramp that is negative or outlasts the run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kvpipe.errors import ConfigError
from kvpipe.measure.request_figures import arrival_figures

from conftest import REPO, TINY, run_cli, spec_for

SERVE = (*TINY, "workload.repeats=1")
# At 20,000 gaps the sample CV's standard error is under 3% even for shape 0.25 (kurtosis 3 + 6/k = 27:
# the stdev's relative error is about sqrt(26 / 20,000) / 2 = 1.8%, the mean's 2 / sqrt(20,000) = 1.4%),
# so 10% is more than three of them; the seed fixes the draw, so the test cannot flake.
GAPS = 20_000


def load_of(*overrides: str):
    return spec_for(*SERVE, "load=rate", *overrides).bound_load


def untimed(count: int) -> list:
    return [SimpleNamespace(arrival_s=None)] * count


@pytest.mark.parametrize("burstiness, cv", [(0.25, 2.0), (1.0, 1.0), (4.0, 0.5)])
def test_the_arrivals_cv_is_one_over_the_root_of_the_burstiness(burstiness, cv):
    arrivals = load_of("load.rate=4", f"load.burstiness={burstiness}").arrivals(untimed(GAPS + 1))
    offered = arrival_figures(arrivals)
    assert offered["arrival_gap_cv"] == pytest.approx(cv, rel=0.1)  # a gamma of shape k: cv 1/sqrt(k)
    assert offered["arrival_rate_per_s"] == pytest.approx(4.0, rel=0.05)  # the mean's error: cv / sqrt(N) < 1.5%


def test_arrivals_at_fewer_than_three_distinct_times_have_no_cv():
    assert arrival_figures([0.0] * 8) == {}  # load=offline: all at once
    assert arrival_figures([0.0, 0.0, 1.0, 1.0]) == {}
    assert arrival_figures([0.0, 1.0, 1.0, 3.0]) == pytest.approx({"arrival_gap_cv": 1.0, "arrival_rate_per_s": 1.0})


def test_a_replayed_traces_offered_load_is_its_own_arrivals():
    replay = spec_for(*SERVE, "load=replay").bound_load
    arrivals = replay.arrivals([SimpleNamespace(arrival_s=t) for t in (100.0, 100.2, 100.2, 100.5, 101.3)])
    offered = arrival_figures(arrivals)  # gaps 0.2, 0, 0.3, 0.8: mean 0.325
    assert offered["arrival_rate_per_s"] == pytest.approx(1 / 0.325) and offered["arrival_gap_cv"] > 1
    assert not replay.closed and spec_for(*SERVE, "load=concurrency").bound_load.closed  # recorded / not


def test_a_ramps_arrivals_are_sparse_at_first_then_at_the_rate():
    ramp_s, rate = 60.0, 10.0
    arrivals = load_of(f"load.rate={rate}", f"load.ramp_up_s={ramp_s}").arrivals(untimed(3000))
    thirds = [sum(start <= t < start + ramp_s / 3 for t in arrivals) for start in (0.0, ramp_s / 3, 2 * ramp_s / 3)]
    # rate(t) = R t / T: the thirds expect R T / 18 x (1, 3, 5) = 33, 100, 167 arrivals
    assert thirds[0] < thirds[1] < thirds[2] and thirds[2] > 3 * thirds[0]
    assert sum(thirds) == pytest.approx(rate * ramp_s / 2, rel=0.15)  # half the unramped count: 300
    after = [t for t in arrivals if t >= ramp_s]
    assert arrival_figures(after)["arrival_rate_per_s"] == pytest.approx(rate, rel=0.05)  # ~2,700 gaps


def test_past_the_ramp_the_gaps_are_the_unramped_ones_half_a_ramp_later():
    unramped = load_of("load.rate=4", "load.seed=5").arrivals(untimed(400))
    ramped = load_of("load.rate=4", "load.seed=5", "load.ramp_up_s=8").arrivals(untimed(400))
    assert ramped[0] == 0.0 and all(b > a for a, b in zip(ramped, ramped[1:]))
    assert [t for t in ramped if t > 8] == pytest.approx([s + 4 for s in unramped if s > 4])
    assert [t for t in ramped if t <= 8] == pytest.approx([(2 * 8 * s) ** 0.5 for s in unramped if s <= 4])


def test_no_ramp_leaves_the_arrivals_key_and_label_as_they_were():
    plain = spec_for(*SERVE, "load=rate")
    for unset in ("load.ramp_up_s=0", "load.ramp_up_s=null"):
        same = spec_for(*SERVE, "load=rate", unset)
        assert same.measurement_key() == plain.measurement_key() and same.params() == plain.params()
        assert same.bound_load.arrivals(untimed(50)) == plain.bound_load.arrivals(untimed(50))
    ramped = spec_for(*SERVE, "load=rate", "load.rate=2", "load.ramp_up_s=10")
    assert ramped.params()["load.ramp_up_s"] == "10.0" and ramped.measurement_key() != plain.measurement_key()
    assert ramped.bound_load.label() == "rate(2/s, ramp 10s)"
    assert load_of("load.burstiness=0.5", "load.ramp_up_s=2.5").label() == "rate(1/s, burstiness 0.5, ramp 2.5s)"


@pytest.mark.parametrize(
    "overrides, says",
    [
        (("load.ramp_up_s=-1",), r"load.ramp_up_s=-1.0 is not valid: expected seconds of 0 or more"),
        (("load.ramp_up_s=20", "load.duration_s=10"), r"expected at most load.duration_s=10: the ramp must end"),
        (("load.ramp_up_s=100", "load.requests=8"), r"all 8 requests would arrive within the ramp \(the last at"),
    ],
)
def test_a_bad_ramp_is_one_line_naming_it(overrides, says):
    with pytest.raises(ConfigError, match=says) as refused:
        spec_for(*SERVE, "load=rate", *overrides)
    assert "\n" not in str(refused.value) and str(refused.value).startswith("load.ramp_up_s=")


def test_a_ramp_as_long_as_the_duration_ends_within_it():
    load = load_of("load.rate=10", "load.duration_s=6", "load.ramp_up_s=6")
    assert max(load.arrivals(load.requests(untimed(3)))) < 6.0


@pytest.mark.slow  # composes and validates a job through the command line, with the tokenizer: ~1 s
def test_a_ramp_outlasting_one_request_per_prompt_is_refused_before_the_model_loads(tmp_path):
    said = run_cli([*SERVE, "tracking=sqlite", "load=rate", "load.ramp_up_s=3600"], cwd=tmp_path)
    lines = said.stderr.strip().splitlines()
    assert said.returncode == 2 and len(lines) == 1, said.stderr
    assert lines[0].startswith("kvpipe: error: load.ramp_up_s=3600.0 is not valid: all ")
    assert "never reaches load.rate" in lines[0] and "Traceback" not in said.stderr
    assert not (tmp_path / "outputs" / "mlflow.db").exists()  # nothing recorded (Hydra's run folder aside)
    assert not list(tmp_path.rglob("result.json"))


@pytest.mark.slow  # two quick served jobs on the tiny model: ~3 s
def test_an_open_loop_records_its_offered_load_and_a_closed_one_does_not(monkeypatch):
    from kvpipe.job.runner import job_for
    from kvpipe.schedule import run_rounds

    monkeypatch.chdir(REPO)
    results = {}
    for load in (("load=rate", "load.rate=50", "load.requests=6"), ("load=concurrency", "load.concurrency=2")):
        job = job_for(spec_for(*SERVE, *load))
        job.prepare()
        run_rounds([job], seed=0, shuffle=False)
        results[load[0]] = (job, job.result({}).metrics)
    job, metrics = results["load=rate"]
    assert metrics["arrival_gap_cv"] == pytest.approx(arrival_figures(job.arrivals)["arrival_gap_cv"])
    assert metrics["arrival_rate_per_s"] == pytest.approx((len(job.arrivals) - 1) / job.arrivals[-1])
    assert "arrival_gap_cv" not in results["load=concurrency"][1]
