"""A served job whose workload comes in sessions (Workload.in_sessions: workload=conversation): each
round serves every session the load picks, turn by turn, a turn arriving a think time after its
previous answer (kvpipe.job.session_turns), through the same two servers as any served job
(kvpipe.job.servers). Its figures are every served job's, over turns as requests, plus what re-sending
the history costs and what sharing or keeping it saves:

- prefix_hit_rate: prompt tokens served from cache over prompt tokens: a paged pool's shared blocks
  (transformers' prefix match, cache.allow_block_sharing), or a session's kept cache
  (workload.keep_session_cache);
- session_kv_held_bytes: with kept caches, the most bytes they held at once between turns;
- ttft_first_turn_p50_ms and ttft_later_turns_p50_ms: TTFT of sessions' first turns, and of the turns
  that re-send a history.

A session of a load that asks for more requests than there are sessions is served again, as a
request is (kvpipe.load cycles them).
"""

from __future__ import annotations

from kvpipe.job.kept_caches import KeptCaches
from kvpipe.job.phases import eos_ids
from kvpipe.job.served import SHOWN_TEXTS, ServedJob
from kvpipe.job.servers import Request, requests_of
from kvpipe.job.session_turns import SessionTurns
from kvpipe.measure.request_figures import percentile
from kvpipe.workload.base import until_eos


class SessionsJob(ServedJob):
    """Every session its load picks served once a round, turn after turn."""

    def plan(self) -> None:
        sessions = self.workload.sessions()
        self.sessions = self.load.requests(sessions)
        self.arrivals = self.load.arrivals(self.sessions)  # when each session's first turn arrives
        self.cap = self.load.in_flight(self.sessions)  # sessions in flight at once
        firsts = dict(zip(map(id, sessions), requests_of(self.batches, self.spec.workload.max_new_tokens)))
        self.prompts = self.requests = [firsts[id(session)] for session in self.sessions]  # warm-up's
        self.longest_turn = self.workload.longest_prompt(None, self.batches)
        self.rounds_turns: list[SessionTurns] = []  # each round's queue, beside self.passes

    @property
    def calls_per_round(self) -> int:
        return sum(len(session.questions) for session in self.sessions)

    def queue(self) -> SessionTurns:
        new_tokens = self.spec.workload.max_new_tokens
        turns = SessionTurns(self.sessions, self.arrivals, self.cap, self.load.closed,
                             self.workload.think_time_s, self._render, self.longest_turn,
                             new_tokens)  # fmt: skip
        self.rounds_turns.append(turns)
        return turns

    def _serve(self, queue, cap: int, kept=None, stop=None):
        if self.workload.keeps_session_cache and self.setup is not None:
            kept = KeptCaches()
        return super()._serve(queue, cap, kept, stop)

    def _render(self, session, turn: int, answers: list, last: bool, position: int) -> Request:
        """A turn's request: the history with the model's answers (the text before its end-of-sequence)."""
        tokenizer, stops = self.loaded.tokenizer, eos_ids(self.loaded.model)
        said = [tokenizer.decode(until_eos(tokens, stops), skip_special_tokens=True) for tokens in answers]
        ids = self.workload.turn_ids(tokenizer, session, turn, said)
        return Request(ids, self.spec.workload.max_new_tokens, "", session=position, last_turn=last)

    def answered(self) -> tuple[list, list]:
        """None to score: a conversation's turns carry no labelled answers (its workload scores none)."""
        return [], []

    def summary(self):
        metrics, notes, tags = super().summary()
        passes = self.passes
        prompt_tokens = sum(s.prompt_tokens for outcome in passes for s in outcome.served)
        hits = [outcome.prefix_hit_tokens for outcome in passes]
        if None not in hits:
            metrics["prefix_hit_rate"] = sum(hits) / prompt_tokens
        held = [outcome.session_kv_held_bytes for outcome in passes if outcome.session_kv_held_bytes is not None]
        if held:
            metrics["session_kv_held_bytes"] = float(max(held))
        first, later = self._ttft_by_turn()
        metrics["ttft_first_turn_p50_ms"] = percentile(first, 0.5)
        if later:
            metrics["ttft_later_turns_p50_ms"] = percentile(later, 0.5)
        return metrics, notes, tags

    def _ttft_by_turn(self) -> tuple[list[float], list[float]]:
        first, later = [], []
        for outcome, turns in zip(self.passes, self.rounds_turns):
            for served, (_, turn) in zip(outcome.served, turns.turn_of):
                (first if turn == 0 else later).append(served.ttft_ms)
        return first, later

    def turns_served(self, round_index: int = 0) -> list[tuple[int, int, Request, object]]:
        """A round's turns in arrival order: (session position, turn, request, as served)."""
        turns = self.rounds_turns[round_index]
        served = self.passes[round_index].served
        return [(p, t, r, s) for (p, t), r, s in zip(turns.turn_of, turns.requests, served)]

    def prompt_tokens(self) -> list[int]:
        return [len(request.ids) for _, _, request, _ in self.turns_served()]

    def texts(self) -> list[dict[str, str]]:
        """The first session's turns, each prompt with the history it re-sent."""
        decode = self.loaded.tokenizer.decode
        shown = [(turn, request, served) for position, turn, request, served in self.turns_served() if position == 0]
        return [
            {"prompt": decode(request.ids), "completion": decode(served.tokens, skip_special_tokens=True)}
            for _, request, served in sorted(shown, key=lambda item: item[0])[:SHOWN_TEXTS]
        ]

    def quality_inputs(self) -> tuple[list, list]:
        """Each session's first turn (the prompts known before the model answers), with its answer."""
        import torch

        answers = {}
        for position, turn, _, served in self.turns_served():
            if turn == 0:
                answers.setdefault(id(self.sessions[position]), served)
        pairs = [(batch, answers[id(batch.rows[0])]) for batch in self.batches if id(batch.rows[0]) in answers]
        return [batch for batch, _ in pairs], [torch.tensor([served.tokens]) for _, served in pairs]
