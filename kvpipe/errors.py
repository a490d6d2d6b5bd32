"""User errors: one line naming the field, the value given and what would work."""

from __future__ import annotations

import difflib
import sys
from typing import Iterable, NoReturn


class KvpipeError(Exception):
    """A mistake the user can fix. Printed as one line, exit status 2, no traceback."""

    exit_code = 2


class ConfigError(KvpipeError):
    """A bad config value, found before any model is loaded."""

    def __init__(self, field: str, value: object, expected: str):
        self.field, self.value, self.expected = field, value, expected
        super().__init__(f"{field}={value!r} is not valid: {expected}")


def fail(message: str, exit_code: int = 2) -> NoReturn:
    """A user mistake as one line on stderr, `kvpipe: error: ...`, and the exit status."""
    print(f"kvpipe: error: {message}", file=sys.stderr)
    sys.exit(exit_code)


def first_line(exc: BaseException) -> str:
    """The first non-blank line of an exception's message, or its type name when it has none."""
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)


def did_you_mean(given: object, valid: Iterable[object]) -> str:
    """`; did you mean X?` when one of `valid` is spelt close to `given` (a typo), else nothing."""
    close = difflib.get_close_matches(str(given), [str(v) for v in valid], n=1)
    return f"; did you mean {close[0]}?" if close else ""


def choices(valid: Iterable[object], given: object = None) -> str:
    """`expected one of: ...`, and with `given` (what the user wrote) a guess at the one they meant."""
    valid = tuple(valid)
    guess = did_you_mean(given, valid) if given is not None else ""
    return "expected one of: " + ", ".join(str(v) for v in valid) + guess


def require_choice(field: str, value: object, valid: Iterable[object]) -> None:
    valid = tuple(valid)
    if value not in valid:
        raise ConfigError(field, value, choices(valid, given=value))
