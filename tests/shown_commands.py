"""The kvpipe commands the README and the manual show, as their pages write them: one helper for
the test that composes each (test_docs_commands) and the one that runs each (test_docs_run)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
# a command, not a table's title line ("kvpipe plan · llama31_8b_instruct · cuda")
COMMAND = re.compile(r"^(?:\$ )?(?:[A-Z_]+=\S+ )*(?:\.venv/bin/)?(python -m kvpipe|kvpipe)(?: (?![^#]*·)|$)(.*)$")
ELIDED = ("…", "...")  # the docs' "and so on": not an argument
SHOWN_ERROR = "kvpipe: error: "


class Shown(NamedTuple):
    page: str  # relative to the repository: README.md, docs/caches.md
    line: int
    command: str
    error: str  # the one-line error the page shows right after it ("" where it shows none)

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def shown_commands() -> list[Shown]:
    """Every kvpipe command in a fenced block, in page order."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for block in FENCE.finditer(text):
            body = block.group(1).replace("\\\n", " ")
            lines = body.splitlines()
            first_line = text[: block.start()].count("\n") + 2
            for index, line in enumerate(lines):
                if not COMMAND.match(line.strip()):
                    continue
                following = [f for f in lines[index + 1 : index + 3] if SHOWN_ERROR in f]
                error = following[0].split(SHOWN_ERROR, 1)[1].strip() if following else ""
                found.append(Shown(page.relative_to(REPO).as_posix(), first_line + index, line.strip(), error))
    return found


def words_of(command: str) -> list[str]:
    """The command's arguments: its comment, the environment before it, a pipe after it and the
    elisions left out."""
    match = COMMAND.match(command)
    words = [word for word in shlex.split(match.group(2), comments=True) if word not in ELIDED]
    return words[: words.index("|")] if "|" in words else words
