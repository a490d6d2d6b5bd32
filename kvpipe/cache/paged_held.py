"""The most a paged cache's requests held at once, read where it cannot be missed.

What the requests hold grows only when transformers' scheduler hands a request blocks, and shrinks
only when a request's blocks are released (it finished or was cancelled) or a full block is swapped
for an identical shared one. So the largest value it ever takes is the one just before some shrink,
or the one now: the generation thread reads it there, in the cache's own calls, and a request that
starts and ends between two looks of the client (a short answer on a fast machine) is still counted.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

# the PagedAttentionCache calls after which its requests may hold less than before
SHRINKING_CALLS = ("free_blocks", "mark_complete_blocks")


@dataclass
class HeldPeak:
    """The largest reading of `read` (a (blocks, bytes) pair) taken before each shrinking call of a
    paged cache, and at `peak()` itself."""

    read: Callable[[], tuple[int, int]]
    blocks: int = 0
    bytes: int = 0
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    def watch(self, cache) -> None:
        """Read before each of the cache's shrinking calls (on its instance: the class is left alone)."""
        for name in SHRINKING_CALLS:
            setattr(cache, name, self._reading_before(getattr(cache, name)))

    def _reading_before(self, call):
        def shrinking(*args, **kwargs):
            with self._lock:  # the reading and the shrink at once: peak() sees one or the other, never neither
                self._take()
                return call(*args, **kwargs)

        return shrinking

    def _take(self) -> None:
        blocks, held = self.read()
        self.blocks, self.bytes = max(self.blocks, blocks), max(self.bytes, held)

    def peak(self) -> tuple[int, int]:
        """The most blocks and bytes held at once so far (the two maxima: each is exact)."""
        with self._lock:
            self._take()
            return self.blocks, self.bytes
