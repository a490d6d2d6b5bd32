"""Which requests have arrived, and when: what a served job's servers (kvpipe.job.servers) ask before
they take requests, and tell when one is answered. Times are seconds on one perf_counter clock.

`Scheduled` is the load's list of requests: arrivals fixed in advance (an open loop: load=offline,
rate, replay) or each arriving as an answer frees its place (a closed loop: load=concurrency).
Sessions of turns are another source (kvpipe.job.session_turns): a turn arrives a think time after
its previous answer, so when it arrives is known only once that answer is back.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class Arrival:
    """A request that has arrived: its number in the pass (its place in the served list), the request
    and when it arrived (TTFT counts from then)."""

    index: int
    request: object  # kvpipe.job.servers.Request
    arrival_s: float


class Scheduled:
    """The load's requests in order: each at start + its offset (open), or each when an answer frees
    one of the `cap` places (closed: the first `cap` at the start)."""

    def __init__(self, requests: list, offsets: list[float], cap: int, closed: bool):
        self.requests, self.offsets, self.cap, self.closed = requests, offsets, cap, closed
        self.total = len(requests)
        self.max_prompt_tokens = max(len(r.ids) for r in requests)
        self.max_new_tokens = max(r.new_tokens for r in requests)
        self.waiting = deque(range(len(requests)))
        self.start_s = 0.0
        self.freed: deque[float] = deque()  # a closed loop's places, each free since then

    def begin(self, start_s: float) -> None:
        self.start_s = start_s
        self.freed = deque([start_s] * self.cap)

    @property
    def untaken(self) -> int:
        return len(self.waiting)

    def next_s(self) -> float | None:
        """When the next request arrives; None where none will before an answer comes back."""
        if not self.waiting:
            return None
        if self.closed:
            return self.freed[0] if self.freed else None
        return self.start_s + self.offsets[self.waiting[0]]

    def take(self, now_s: float, room: int) -> list[Arrival]:
        """Up to `room` requests that have arrived by now, in order."""
        taken = []
        while self.waiting and len(taken) < room:
            due = self.next_s()
            if due is None or due > now_s:
                break
            if self.closed:
                self.freed.popleft()
            index = self.waiting.popleft()
            taken.append(Arrival(index, self.requests[index], due))
        return taken

    def answered(self, index: int, at_s: float, tokens: list[int]) -> None:
        """Request `index` answered (with `tokens`) at at_s: in a closed loop its client sends the next then."""
        if self.closed:
            self.freed.append(at_s)
