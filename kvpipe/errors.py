"""User errors: one line naming the field, the value given and what would work."""

from __future__ import annotations

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


def choices(valid: Iterable[object]) -> str:
    return "expected one of: " + ", ".join(str(v) for v in valid)


def require_choice(field: str, value: object, valid: Iterable[object]) -> None:
    valid = tuple(valid)
    if value not in valid:
        raise ConfigError(field, value, choices(valid))
