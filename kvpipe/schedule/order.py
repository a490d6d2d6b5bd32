"""Order: who calls next.

Where jobs take turns (a sweep's interleaved jobs), a machine whose speed drifts must slow each job
alike, not the one that happened to run late (google-benchmark's random interleaving). By call (the
default), every job makes call i before any makes call i + 1, in an order drawn from the seed and
then reversed (ABBA), so that over each two calls every job goes first as often as last. By pass,
each job's whole round is one turn, in an order shuffled each round from the seed. A job alone
simply takes its turns.
"""

from __future__ import annotations

import random

from kvpipe.errors import require_choice

TURNS = ("call", "pass")  # what takes a turn in a sweep: one measured call, or a job's whole pass


def check_turn(turn: str) -> str:
    """hydra.launcher.turn, checked at the sweep's door."""
    require_choice("hydra.launcher.turn", turn, TURNS)
    return turn


class Counterbalanced:
    """Call turns' orders: a fresh order drawn from the seed, then its reverse (ABBA), so that over
    each pair of calls every job goes first as often as last and none is systematically first."""

    def __init__(self, seed: int):
        self.draw = random.Random(seed)
        self.last: list[int] = []
        self.taken = 0

    def next(self, taking: list[int]) -> list[int]:
        if self.taken % 2 == 0 or not self.last:
            order = list(taking)
            self.draw.shuffle(order)
        else:
            order = [i for i in reversed(self.last) if i in taking] + [i for i in taking if i not in self.last]
        self.last, self.taken = order, self.taken + 1
        return order


class Passes:
    """Whole-pass turns' orders: shuffled each round from the seed where `shuffle`, else as given."""

    def __init__(self, seed: int, shuffle: bool):
        self.draw, self.shuffle = random.Random(seed), shuffle

    def next(self, taking: list[int]) -> list[int]:
        order = list(taking)
        if self.shuffle:
            self.draw.shuffle(order)
        return order
