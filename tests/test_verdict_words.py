"""compare's paired verdict: three states, each in words its interval bears out."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvpipe.decide import paired
from kvpipe.decide.paired import NEGLIGIBLE, Ratio


@pytest.mark.parametrize(
    "value, low, high, words",
    [
        (1.09, 1.03, 1.16, "clearly slower: 1.09× (1.03–1.16)"),
        (0.90, 0.85, 0.95, "clearly faster: 0.90× (0.85–0.95)"),
        (1.00, 0.99, 1.01, "the same within 2%: 1.00× (0.99–1.01)"),
        (1.09, 1.01, 1.18, "not yet decided: 1.09× (1.01–1.18)"),  # once called 'no clear difference'
        (1.00, 0.95, 1.06, "not yet decided: 1.00× (0.95–1.06)"),
    ],
)
def test_the_verdict_says_what_the_interval_says(value, low, high, words):
    assert Ratio(value, low, high, paired=True).text() == words


def test_every_verdict_matches_its_interval_against_the_two_percent_band():
    draw = np.random.default_rng(21)
    for _ in range(2000):
        low, high = sorted(float(v) for v in np.exp(draw.normal(0, 0.05, 2)))
        text = Ratio(math.sqrt(low * high), low, high, paired=True).text()
        beyond, inside = low > 1 + NEGLIGIBLE or high < 1 - NEGLIGIBLE, 1 - NEGLIGIBLE <= low and high <= 1 + NEGLIGIBLE
        assert text.startswith("clearly slower") is (low > 1 + NEGLIGIBLE)
        assert text.startswith("clearly faster") is (high < 1 - NEGLIGIBLE)
        assert text.startswith("the same within 2%") is inside
        assert text.startswith("not yet decided") is (not beyond and not inside)


def test_an_end_that_would_print_on_the_band_s_edge_gets_a_third_decimal():
    assert Ratio(1.05, 1.0181, 1.08, paired=True).text() == "not yet decided: 1.05× (1.018–1.08)"
    assert Ratio(1.05, 1.0221, 1.08, paired=True).text() == "clearly slower: 1.05× (1.022–1.08)"
    assert Ratio(0.95, 0.92, 0.9799, paired=True).text() == "clearly faster: 0.95× (0.92–0.9799)"


def test_an_undecided_verdict_says_how_many_rounds_might_decide_it():
    """An interval 6 rounds wide that straddles 1.02 from a centre at 1.09: half as wide would clear
    the edge, so about four times the rounds."""
    ratio = Ratio(1.09, 1.01, 1.18, paired=True, rounds=6)
    needed = ratio.rounds_to_decide()
    half, room = math.log(1.18 / 1.01) / 2, math.log(math.sqrt(1.18 * 1.01) / 1.02)
    assert needed == math.ceil(6 * (half / room) ** 2)
    assert ratio.text() == f"not yet decided: 1.09× (1.01–1.18); ~{needed} rounds might decide it"
    assert Ratio(1.02, 1.00, 1.04, paired=True, rounds=6).rounds_to_decide() is None  # its centre on the edge
    assert Ratio(1.09, 1.03, 1.16, paired=True, rounds=6).rounds_to_decide() is None  # decided already


def test_one_round_each_shows_the_measured_ratio_and_no_verdict():
    ratio = Ratio(1.07, math.nan, math.nan, paired=True, rounds=1)
    assert ratio.state == paired.NO_INTERVAL and not ratio.clear
    assert ratio.text() == "1.07× (1 round, no interval)"


def test_only_a_clear_verdict_names_a_winner():
    """recommend and the search take a side only on `clear`: the same within 2% and undecided are ties."""
    assert Ratio(1.1, 1.05, 1.15, paired=True).clear and Ratio(0.9, 0.85, 0.95, paired=True).clear
    assert not Ratio(1.0, 0.99, 1.01, paired=True).clear and not Ratio(1.09, 1.01, 1.18, paired=True).clear
