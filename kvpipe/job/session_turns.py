"""Sessions of turns as a server's queue (kvpipe.job.arrivals' other source): a turn arrives
`think_time_s` after its previous turn's answer came back, which fixed arrivals cannot express.

The load decides when sessions start and how many are in flight at once, as it decides for requests:
a closed loop (load=concurrency) starts a session when one ends (the first `cap` at once); an open
one (load=offline, load=rate) starts each at its arrival. A session is in flight from its first
turn's arrival to its last answer, and has at most one turn in flight. A turn's prompt is rendered
when the answer before it comes back (its client writes it while its user thinks), so rendering is
never part of its TTFT.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

from kvpipe.job.arrivals import Arrival

# (session, turn, the answers' tokens so far, whether it is the session's last turn, its position) -> a Request
Render = Callable[[object, int, list, bool, int], object]


class SessionTurns:
    """One round's sessions, their turns taken as they arrive; `turn_of` says, per request index,
    which session position and turn it was."""

    def __init__(self, sessions: list, offsets: list[float], cap: int, closed: bool, think_time_s: float,
                 render: Render, max_prompt_tokens: int, max_new_tokens: int):  # fmt: skip
        self.sessions, self.offsets, self.cap, self.closed = sessions, offsets, cap, closed
        self.think_time_s, self.render = think_time_s, render
        self.max_prompt_tokens, self.max_new_tokens = max_prompt_tokens, max_new_tokens
        self.total = sum(len(session.questions) for session in sessions)
        self.unstarted = deque(range(len(sessions)))
        self.answers: dict[int, list] = {}  # position -> each answered turn's tokens
        self.due: dict[int, tuple[float, object]] = {}  # position -> (arrival, request) of its next turn
        self.turn_of: list[tuple[int, int]] = []  # request index -> (session position, turn)
        self.requests: list = []  # request index -> the request
        self.in_flight = 0  # sessions started and not yet done
        self.start_s = 0.0
        self.freed: deque[float] = deque()

    def begin(self, start_s: float) -> None:
        self.start_s = start_s
        self.freed = deque([start_s] * self.cap)

    @property
    def untaken(self) -> int:
        return self.total - len(self.requests)

    def next_s(self) -> float | None:
        """When the next turn arrives: a waiting session's next, or a new session's first."""
        times = [arrival for arrival, _ in self.due.values()]
        start = self._next_start()
        return min([*times, *([start] if start is not None else [])], default=None)

    def _next_start(self) -> float | None:
        if not self.unstarted:
            return None
        if self.closed:
            return self.freed[0] if self.freed else None
        return self.start_s + self.offsets[self.unstarted[0]] if self.in_flight < self.cap else None

    def take(self, now_s: float, room: int) -> list[Arrival]:
        """Up to `room` turns that have arrived by now, earliest first."""
        while (start := self._next_start()) is not None and start <= now_s:
            if self.closed:
                self.freed.popleft()
            position = self.unstarted.popleft()
            self.in_flight += 1
            self.answers[position] = []
            self.due[position] = (start, self._rendered(position))
        arrived = sorted((arrival, position) for position, (arrival, _) in self.due.items() if arrival <= now_s)
        taken = []
        for arrival, position in arrived[:room]:
            _, request = self.due.pop(position)
            taken.append(Arrival(len(self.requests), request, arrival))
            self.turn_of.append((position, len(self.answers[position])))
            self.requests.append(request)
        return taken

    def answered(self, index: int, at_s: float, tokens: list[int]) -> None:
        """Turn `index` answered at at_s: its session's next turn is due a think time later, or the
        session ends (in a closed loop the next session starts then)."""
        position, _ = self.turn_of[index]
        self.answers[position].append(tokens)
        if len(self.answers[position]) < len(self.sessions[position].questions):
            self.due[position] = (at_s + self.think_time_s, self._rendered(position))
            return
        self.in_flight -= 1
        if self.closed:
            self.freed.append(at_s)

    def _rendered(self, position: int):
        session, answers = self.sessions[position], self.answers[position]
        turn = len(answers)
        request = self.render(session, turn, answers, turn == len(session.questions) - 1, position)
        if len(request.ids) > self.max_prompt_tokens:  # caches were sized for at most this
            raise RuntimeError(
                f"session {position}'s turn {turn} came to {len(request.ids)} prompt tokens, past the "
                f"{self.max_prompt_tokens} its caches were sized for"
            )
        return request
