"""workload=conversation: sessions of several turns, each turn sending the whole history (the shared
system prompt, every earlier question with the model's own answer to it) plus a new user message,
with a think time between an answer and the next message. It is served under a load (kvpipe.job's
served_sessions): the load decides when sessions start and how many are in flight, and each
session's next turn arrives `workload.think_time_s` after its previous answer came back.

Re-sending the history is where a cache that shares or keeps a prefix saves: cache=paged with
cache.allow_block_sharing serves a turn's prompt from the blocks its earlier turns (and the other
sessions' system prompt) left, and `workload.keep_session_cache=true` keeps each session's cache
between its turns for strategies that can continue one (`continues_cache`), prefilling only what the
cache does not hold. The run records the prefix hit rate, TTFT by first and later turns, and the KV
bytes kept sessions hold while their users think.

The sessions are bundled (questions about passages of Python's documentation: `sessions.py`) or the
user's file of multi-turn `messages` rows (`workload.path`). The model's own answers, not the file's
assistant messages, are what each later turn sends back, as a live chat would. A tokenizer with no
chat template gets the turns as plain text, `System:` / `User:` / `Assistant:` paragraphs.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Optional, Sequence

from kvpipe.errors import ConfigError
from kvpipe.workload import _encoding
from kvpipe.workload._texts import long_context_ids
from kvpipe.workload.base import Batch, Window, Workload, padded_batch
from kvpipe.workload.conversation import sessions
from kvpipe.workload.conversation.sessions import Session

SYSTEM_PROMPT = (
    "You are a patient Python tutor. The user shares passages of Python's documentation and asks about "
    "them; answer briefly, accurately and in plain English."
)
PLAIN_ROLES = {"system": "System", "user": "User", "assistant": "Assistant"}


class Conversation(Workload):
    name = "conversation"
    order = 60
    chat_style = True
    in_sessions = True
    context_fields = ("turns", "sessions", "path")
    test_overrides = ("load=concurrency", "load.concurrency=2", "workload.sessions=2", "workload.turns=2",
                      "workload.think_time_s=0.01")  # fmt: skip

    @dataclass
    class Settings:
        turns: int = 4  # turns per session (a file's row: at most its user messages)
        sessions: int = 4  # conversations (a file: its first rows)
        think_time_s: float = 1.0  # from an answer back to the session's next message
        system_prompt: str = SYSTEM_PROMPT  # every session's (a file's row may carry its own)
        path: Optional[str] = None  # a JSONL (or JSON, CSV, Parquet) file of multi-turn `messages` rows
        keep_session_cache: bool = False  # keep each session's cache between its turns and continue from it

    def check(self) -> dict:
        for name in ("turns", "sessions"):
            if getattr(self.settings, name) < 1:
                raise ConfigError(f"workload.{name}", getattr(self.settings, name), "expected 1 or more")
        if not self.settings.think_time_s >= 0:
            raise ConfigError("workload.think_time_s", self.settings.think_time_s, "expected seconds, 0 or more")
        checked = super().check()
        self.sessions()  # a file's every problem, now: before the model loads
        return checked

    @cached_property
    def _sessions(self) -> list[Session]:
        settings = self.settings
        if settings.path is None:
            return sessions.bundled(settings.sessions, settings.turns, settings.system_prompt)
        return sessions.from_file(settings.path, settings.sessions, settings.turns, settings.system_prompt)

    def sessions(self) -> list[Session]:
        """The conversations a job serves, in order (a load picks among them as among prompts)."""
        return self._sessions

    @property
    def think_time_s(self) -> float:
        return self.settings.think_time_s

    def identity_extras(self) -> dict:
        return {} if self.settings.path is None else {"digest": sessions.digest(self.settings.path)}

    def size_label(self) -> str:
        source = "" if self.settings.path is None else f" of {self.settings.path.rsplit('/', 1)[-1]}"
        return f"{len(self.sessions())}x{self.settings.turns} turns{source}"

    # ---- prompts ------------------------------------------------------------------------------

    def turn_ids(self, tokenizer, session: Session, turn: int, answers: Sequence[str]) -> list[int]:
        """Turn `turn`'s prompt ids: the chat template over the history with the model's answers and
        the new question (plain-text paragraphs without a template), BOS once."""
        messages = session.messages(turn, answers)
        if _encoding.has_chat_template(tokenizer):
            return self.chat_ids(tokenizer, messages)
        _encoding.warn_no_template(tokenizer, self.name)
        return _encoding.encode(tokenizer, plain_text(messages))

    def batches(self, tokenizer, device: str) -> list[Batch]:
        """Each session's first turn, the only prompts known before the model answers (the quality
        pass scores them); later turns are rendered as their answers come back. Measures, with the
        tokenizer at hand, how long the last turn may grow (longest_prompt, check_fits)."""
        self._longest_turn = max(self._longest_turn_of(tokenizer, session) for session in self.sessions())
        return [
            padded_batch(tokenizer, [self.turn_ids(tokenizer, session, 0, [])], device, [session])
            for session in self.sessions()
        ]

    def _longest_turn_of(self, tokenizer, session: Session) -> int:
        """Its last turn's length with every earlier answer as long as it may come back: max_new_tokens
        tokens, decoded and encoded again, can return a few tokens longer."""
        tokens = self.common.max_new_tokens + self.common.max_new_tokens // 4 + 4
        answer = tokenizer.decode(long_context_ids(tokenizer, tokens))
        last = len(session.questions) - 1
        return len(self.turn_ids(tokenizer, session, last, [answer] * last))

    def longest_prompt(self, tokenizer, batches: list[Batch]) -> int:
        """The longest turn any session can send (what caches are sized for)."""
        return self._longest_turn

    def check_fits(self, shape, batches: list[Batch]) -> None:
        """The last turn, at its longest, must fit the model's positions."""
        positions, new, longest = shape.max_positions, self.common.max_new_tokens, self._longest_turn
        if positions and longest + new > positions:
            raise ConfigError(
                "workload.turns", self.settings.turns,
                f"the last turn re-sends up to {longest} tokens of history, which with {new} new tokens exceeds "
                f"the model's {positions} positions; expected fewer turns or a smaller workload.max_new_tokens",
            )  # fmt: skip

    def windows(self, tokenizer, count: int, scored_tokens: int) -> list[Window]:
        """Its sessions' first turns as the model sees them; the reference writes what follows."""
        return [Window(self.turn_ids(tokenizer, session, 0, []), None) for session in self.sessions()[:count]]


def plain_text(messages: list[dict]) -> str:
    """Messages as plain paragraphs for a tokenizer without a chat template, `Role: content` each,
    ending with `Assistant:` for the model to go on from."""
    said = [f"{PLAIN_ROLES.get(m['role'], m['role'].capitalize())}: {m['content']}" for m in messages]
    return "\n\n".join([*said, "Assistant:"])
