"""How jobs are measured against one another: the whole measuring policy, in one room.

A round calls every job once (every batch of a batch job, one pass over a served job's requests);
a job alone is the same loop with one job, its repeats its rounds. Three parts decide everything,
each in its own module, over a narrow protocol that a job keeps (`taker.RoundTaker`: its calls and
their keys, its figures round by round and call by call; it does not know it is interleaved):

- **Order** (`order.py`): who calls next. In a sweep taking turns by call, every job makes call i
  before any makes call i + 1, in a counterbalanced order (ABBA); with whole-pass turns, an order
  shuffled each round from the seed; a job alone, in turn.
- **Guard** (`guard.py`): whether a pair of calls counts. It counts where its calls saw the same
  machine; a call taken while the load around it changed is left out, and the next call may wait
  for quiet; a neighbour that stays through a turn slows its calls alike, and they count (the
  job's contention verdict records it).
- **StopRule** (`stop_rule.py`): when the rounds end. Fixed repeats; repeats=auto until each job's
  own TPOT interval is narrow; or, in a sweep taking turns by call with every job on auto, until
  every paired ratio against the baseline decides. One set of caps, the same in every path.

The loop that drives them is `loop.run_rounds`.
"""

from kvpipe.schedule.guard import QUIET_WAIT_S, check_quiet_wait
from kvpipe.schedule.loop import Rounds, baseline_of, paired, run_rounds
from kvpipe.schedule.order import TURNS, check_turn
from kvpipe.schedule.taker import RoundTaker, take_turn

__all__ = [
    "QUIET_WAIT_S",
    "TURNS",
    "RoundTaker",
    "Rounds",
    "baseline_of",
    "check_quiet_wait",
    "check_turn",
    "paired",
    "run_rounds",
    "take_turn",
]
