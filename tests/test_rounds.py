"""Measured rounds and the differences read from them: the shuffled order, fixed and automatic
repeats, a job that fails mid-round, round means, and paired against unpaired ratios on a machine
whose speed drifts."""

from __future__ import annotations

import logging
import math
import random
from types import SimpleNamespace

import pytest

from kvpipe.decide import paired
from kvpipe.measure.round_figures import (
    BATCH_FIGURES,
    converged,
    over_rounds,
    parse_series,
    relative_half_width,
    round_tags,
)
from kvpipe.measure.uncertainty import ratio_interval
from kvpipe.schedule import RoundTaker, run_rounds


class FakeJob(RoundTaker):
    """A job taking part in rounds whose TPOT per round comes from `tpot(round)`: the real stopping
    rule (RoundTaker's, as every job's), with no model behind it."""

    calls_per_round = 2

    def __init__(self, label, repeats=3, tpot=lambda r: 10.0, target=0.05, max_repeats=30, fail_at=None):
        timing = SimpleNamespace(repeats=repeats, target_interval=target, max_repeats=max_repeats, max_measure_s=600.0)
        super().__init__(label, timing, BATCH_FIGURES)
        self.tpot, self.fail_at = tpot, fail_at

    @property
    def values(self) -> list[float]:
        return self.per_round["tpot_ms"]

    def measure_round(self, advance):
        if self.fail_at == self.rounds_done():
            raise RuntimeError("backend failed")
        self.add_round({"ttft_ms": 1.0, "tpot_ms": self.tpot(self.rounds_done()), "decode_tokens_per_s": 100.0})
        for _ in range(self.calls_per_round):
            advance()


def test_each_round_calls_every_job_once_in_an_order_drawn_from_the_seed():
    jobs = [FakeJob(f"#{i}", repeats=6) for i in range(3)]
    rounds = run_rounds(jobs, seed=7, shuffle=True)
    assert [len(job.values) for job in jobs] == [6, 6, 6]
    assert all(sorted(order) == [0, 1, 2] for order in rounds.orders)
    assert len({tuple(order) for order in rounds.orders}) > 1  # shuffled, not the same order each round
    again = run_rounds([FakeJob(f"#{i}", repeats=6) for i in range(3)], seed=7, shuffle=True)
    assert again.orders == rounds.orders  # the seed decides: a sweep asked again takes the same turns
    alone = run_rounds([FakeJob("#0", repeats=4)], seed=7, shuffle=False)
    assert alone.orders == [[0]] * 4 and len(alone.seconds) == 4 and alone.drift()[0] == 0


def test_fixed_repeats_stop_each_job_at_its_own_count():
    short, long = FakeJob("#0", repeats=2), FakeJob("#1", repeats=5)
    rounds = run_rounds([short, long], seed=0, shuffle=True)
    assert (len(short.values), len(long.values), len(rounds.seconds)) == (2, 5, 5)


def test_auto_rounds_go_on_until_every_job_converges_and_stop_at_the_cap():
    steady = FakeJob("#0", repeats="auto", tpot=lambda r: 10.0 + 0.01 * (r % 2))
    jittery = FakeJob("#1", repeats="auto", tpot=lambda r: 10.0 * (1.1 if r % 2 else 0.9) if r < 6 else 10.0)
    run_rounds([steady, jittery], seed=0, shuffle=True)
    assert steady.converged() and jittery.converged()
    assert len(steady.values) == len(jittery.values) > 6  # the steady one kept pairing until the other was done
    never = FakeJob("#0", repeats="auto", tpot=lambda r: 10.0 * (1.5 if r % 2 else 0.5), max_repeats=6)
    run_rounds([never], seed=0, shuffle=False)
    assert len(never.values) == 6 and not never.converged()


def test_a_job_that_fails_mid_round_stops_alone_and_keeps_its_error():
    bad, good = FakeJob("#0", repeats=4, fail_at=1), FakeJob("#1", repeats=4)
    run_rounds([bad, good], seed=0, shuffle=True)
    assert isinstance(bad.failed, RuntimeError) and len(bad.values) == 1
    assert len(good.values) == 4 and good.failed is None


def test_each_round_line_says_the_rounds_left_and_their_eta(caplog):
    with caplog.at_level(logging.INFO, logger="kvpipe.schedule.loop"):
        run_rounds([FakeJob("#0", repeats=2), FakeJob("#1", repeats=3)], seed=0, shuffle=True)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("round ")]
    assert "· 2 rounds left, ETA " in lines[0] and "· 1 round left, ETA " in lines[1]
    assert "left" not in lines[2]  # the last round: nothing left to say
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="kvpipe.schedule.loop"):
        run_rounds([FakeJob("#0", repeats="auto"), FakeJob("#1", repeats=3)], seed=0, shuffle=True)
    assert not [r for r in caplog.records if "ETA" in r.getMessage()]  # auto: its rounds end when it settles


def test_the_rounds_eta_is_each_jobs_mean_round_times_the_rounds_it_still_wants():
    from kvpipe.schedule.loop import _left_text

    short, long = FakeJob("#0", repeats=2), FakeJob("#1", repeats=5)
    for job in (short, long):
        for _ in range(2):
            job.add_round({"ttft_ms": 1.0, "tpot_ms": 1.0, "decode_tokens_per_s": 1.0})
    assert _left_text([short, long], measured_s=[2.0, 4.0], taken=[2, 2]) == " · 3 rounds left, ETA 6s"


def test_round_means_become_tags_and_the_interval_over_rounds():
    per_round = {"ttft_ms": [5.0, 5.2, 4.9], "tpot_ms": [2.0, 2.1, 1.9], "decode_tokens_per_s": [500, 476, 526]}
    metrics = over_rounds(per_round)
    assert metrics["rounds"] == 3 and metrics["tpot_ms_ci_low"] <= 2.0 <= metrics["tpot_ms_ci_high"]
    tags = round_tags(per_round)
    assert parse_series(tags["round_tpot_ms"]) == [2.0, 2.1, 1.9] and tags["interval_over"] == "rounds"
    two = {name: values[:2] for name, values in per_round.items()}
    assert "tpot_ms_ci_low" not in over_rounds(two) and round_tags(two)["interval_over"] == "calls"
    assert parse_series(float("nan")) == []  # a run recorded before rounds were kept


def drifting(rounds: int, seed: int, slowdown: float = 1.0):
    """Two jobs' round means on a machine whose speed swings by ±30% from round to round; the second
    `slowdown` times slower."""
    draw = random.Random(seed)
    speed = [1 + 0.3 * math.sin(r) + draw.gauss(0, 0.01) for r in range(rounds)]
    a = [10 * s * (1 + draw.gauss(0, 0.01)) for s in speed]
    b = [10 * slowdown * s * (1 + draw.gauss(0, 0.01)) for s in speed]
    return a, b


def test_a_paired_ratio_cancels_the_drift_an_unpaired_one_cannot():
    a, b = drifting(10, seed=1)
    ratio, low, high = ratio_interval(b, a, paired=True)
    assert abs(ratio - 1) < 0.02 and high - low < 0.04
    _, low_unpaired, high_unpaired = ratio_interval(b, a, paired=False)
    assert high_unpaired - low_unpaired > 5 * (high - low)
    a, b = drifting(10, seed=2, slowdown=1.1)
    verdict = paired.Ratio(*ratio_interval(b, a, paired=True), paired=True)
    assert verdict.clear and verdict.low > 1.05
    assert verdict.text().startswith("clearly slower: 1.10× (")


@pytest.mark.parametrize(
    "low, high, clear",
    [(0.95, 1.04, False), (1.01, 1.05, False), (1.03, 1.09, True), (0.90, 0.97, True), (math.nan, math.nan, False)],
)
def test_a_difference_is_clear_only_beyond_two_percent(low, high, clear):
    ratio = paired.Ratio(1.0, low, high, paired=True)
    assert ratio.clear is clear
    assert ratio.text().startswith(("clearly slower", "clearly faster")) is clear


def test_too_few_rounds_give_the_measured_ratio_without_an_interval():
    """One round each still says how the two compared; only the interval needs more."""
    ratio, low, high = ratio_interval([3.0], [2.0, 4.0], paired=True)  # round 1 against round 1
    assert ratio == 1.5 and math.isnan(low) and math.isnan(high)
    ratio, low, high = ratio_interval([3.0], [2.0, 4.0], paired=False)  # mean against mean
    assert ratio == 1.0 and math.isnan(low) and math.isnan(high)
    assert paired.Ratio(1.5, math.nan, math.nan, paired=True).text() == "1.50× (no interval)"
    assert all(math.isnan(v) for v in ratio_interval([], [1.0, 2.0], paired=False))


def test_the_signed_rank_interval_holds_the_true_ratio_as_often_as_it_says():
    import numpy as np

    draw = np.random.default_rng(3)
    for rounds in (6, 12):
        held = 0
        for _ in range(400):
            base = 10 * np.exp(draw.normal(0, 0.2, rounds))  # the machine's drift, shared by both
            _, low, high = ratio_interval(list(base * np.exp(draw.normal(0, 0.05, rounds))), list(base), paired=True)
            held += low <= 1 <= high
        assert 0.92 <= held / 400 <= 0.995


def test_a_round_split_by_a_slow_spell_does_not_carry_the_ratio():
    a, b = drifting(12, seed=4, slowdown=1.1)
    b[3], b[8] = b[3] * 1.6, b[8] / 1.6  # two rounds in which the spell began or ended between the jobs
    verdict = paired.Ratio(*ratio_interval(b, a, paired=True), paired=True)
    assert verdict.clear and 1.07 < verdict.value < 1.13


def test_auto_stops_when_the_tpot_interval_is_within_target_after_the_fewest_rounds():
    steady = FakeJob("#0", repeats="auto", tpot=lambda r: 10.0 + 0.01 * (r % 2), target=0.05)
    run_rounds([steady], seed=0, shuffle=False)
    assert len(steady.values) == 3  # MIN_ROUNDS, and within ±5% then
    assert relative_half_width(steady.values) <= 0.05 and converged(steady.per_round, 0.05)
    assert not converged({"tpot_ms": steady.values[:2]}, 0.05)  # two rounds: too few, however close


@pytest.mark.slow  # a real job of the tiny random model, in this process
def test_repeats_auto_on_a_real_job_stops_at_its_cap_and_says_how_wide_it_got():
    from kvpipe.job import runner

    from conftest import TINY, spec_for

    # a target no real interval reaches: the cap decides, whatever the machine does
    capped = runner.run_job(spec_for(*TINY, "workload.prompts=[Hi.]", "workload.repeats=auto",
                                     "workload.target_interval=0.000001", "workload.max_repeats=4"))  # fmt: skip
    assert capped.metrics["rounds"] == 4 and capped.metrics["rounds_converged"] == 0.0
    assert len(parse_series(capped.tags["round_tpot_ms"])) == 4 and capped.tags["interval_over"] == "rounds"
    (note,) = [note for note in capped.notes if note.startswith("repeats=auto stopped after 4 rounds")]
    assert "workload.target_interval=1e-06" in note and "with TPOT within ±" in note
