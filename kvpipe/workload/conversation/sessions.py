"""A conversation's sessions: each a system prompt and the user's messages, one per turn. Bundled ones
ask successive questions about a passage of Python's own documentation (pydoc's topic pages, as
kvpipe.workload._texts: no download); a user's own come from a file of multi-turn `messages` rows,
read as workload=dataset reads its files (kvpipe.workload.dataset.reading). A session's turn is rendered with the model's own answers
to the turns before it, which is what a live chat sends back."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

from kvpipe.errors import ConfigError
from kvpipe.workload.dataset import reading

PASSAGE_CHARS = 600  # about 150 tokens of documentation: the first turn's context
FIRST_QUESTION = "What is this passage about? Answer in one sentence."
FOLLOW_UPS = (
    "Which Python statement, function or feature does it describe?",
    "Give a short example of it in code.",
    "What mistake do people often make with it?",
    "Summarise our conversation so far in one sentence.",
)
COLUMN = "messages"
EXPECTED_ROW = 'expected {"messages": [{"role": "user", "content": ...}, ...]} with at least 2 user messages'


@dataclass(frozen=True)
class Session:
    """One conversation: its number (a file's row), its system prompt and the user's messages."""

    number: int
    system: str
    questions: tuple[str, ...]

    def messages(self, turn: int, answers: Sequence[str]) -> list[dict]:
        """Turn `turn` (0-based) as chat messages: the system prompt, each earlier question with the
        model's answer to it, then this turn's question."""
        said = [{"role": "system", "content": self.system}] if self.system else []
        for question, answer in zip(self.questions[:turn], answers):
            said += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        return [*said, {"role": "user", "content": self.questions[turn]}]


def bundled(count: int, turns: int, system: str) -> list[Session]:
    """`count` sessions of `turns` questions, each about its own passage of Python's documentation."""
    return [Session(number, system, _questions(_passage(number), turns)) for number in range(count)]


def _passage(number: int) -> str:
    """The opening of one of the documentation's topic pages per session, cut at a word."""
    pages = _pages()
    return pages[(number * 7) % len(pages)][:PASSAGE_CHARS].rsplit(" ", 1)[0]


@lru_cache(maxsize=1)
def _pages() -> list[str]:
    from pydoc_data.topics import topics

    pages = (" ".join(topics[name].split()) for name in sorted(topics))
    return [page for page in pages if len(page) > PASSAGE_CHARS]


def _questions(passage: str, turns: int) -> tuple[str, ...]:
    first = f"Read this passage from Python's documentation:\n\n{passage}\n\n{FIRST_QUESTION}"
    return (first, *(FOLLOW_UPS[turn % len(FOLLOW_UPS)] for turn in range(turns - 1)))


def from_file(path: str, count: int, turns: int, system: str) -> list[Session]:
    """The first `count` rows of the user's file as sessions, each its first `turns` user messages (the
    file's assistant messages are set aside: the model answers each turn itself); a row's own system
    message replaces `system`."""
    data = reading.load(reading.check_path(path), None, path)
    if COLUMN not in data.column_names:
        raise ConfigError("workload.path", path, f"it has no {COLUMN!r} column; {EXPECTED_ROW}")
    return [_session(path, number, value, turns, system) for number, value in enumerate(data[COLUMN][:count])]


def _session(path: str, number: int, value, turns: int, system: str) -> Session:
    if not isinstance(value, list) or not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in value):
        raise ConfigError(
            "workload.path", path, f"row {reading.row_number(number)} is not a list of messages; {EXPECTED_ROW}"
        )
    questions = [m["content"] for m in value if m.get("role") == "user" and m["content"].strip()]
    if len(questions) < 2:
        raise ConfigError(
            "workload.path",
            path,
            f"row {reading.row_number(number)} has {len(questions)} user message(s), not a conversation; {EXPECTED_ROW}",
        )
    own_system = [m["content"] for m in value if m.get("role") == "system"]
    return Session(number, own_system[0] if own_system else system, tuple(questions[:turns]))


def digest(path: str) -> str:
    """The file's content digest (part of the measurement key, as workload=dataset's)."""
    return reading.digest(Path(path).expanduser())
