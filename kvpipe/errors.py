"""User errors: one line naming the field, the value given and what would work."""

from __future__ import annotations

import re
from dataclasses import fields
from typing import Iterable, Optional


class KvpipeError(Exception):
    """A mistake the user can fix. Printed as one line, exit status 2, no traceback."""

    exit_code = 2


class ConfigError(KvpipeError):
    """A bad config value, found before any model is loaded."""

    def __init__(self, field: str, value: object, expected: str):
        self.field, self.value, self.expected = field, value, expected
        super().__init__(f"{field}={value!r} is not valid: {expected}")


def first_line(exc: BaseException) -> str:
    """The first non-blank line of an exception's message, or its type name when it has none."""
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)


def choices(valid: Iterable[object]) -> str:
    return "expected one of: " + ", ".join(str(v) for v in valid)


def require_choice(field: str, value: object, valid: Iterable[object]) -> None:
    valid = tuple(valid)
    if value not in valid:
        raise ConfigError(field, value, choices(valid))


def from_hydra(exc: BaseException) -> Optional[str]:
    """Turn a Hydra/OmegaConf composition error into one line, or None if it is not one."""
    text = str(exc)
    cause = exc.__cause__ or exc.__context__
    full = text + "\n" + (str(cause) if cause else "")

    missing_option = re.search(r"Could not find '([\w/]+)/([^']+)'", full)
    if missing_option:
        group, option = missing_option.groups()
        available = re.search(r"Available options in '[\w/]+':\s*((?:\n\s+\S+)+)", full)
        options = available.group(1).split() if available else []
        return f"{group}={option} is not a known option; " + (choices(options) if options else "no options found")

    unknown_key = re.search(r"Key '([^']+)' not in '(\w+)'", full)
    full_key = re.search(r"full_key: (\S+)", full)
    if unknown_key:
        key = full_key.group(1) if full_key else unknown_key.group(1)
        valid = _schema_fields(unknown_key.group(2))
        return f"{key} is not a known key; " + (choices(valid) if valid else "check the spelling")

    wrong_type = re.search(r"Value '([^']*)' (?:of type '\w+' )?could not be converted to (\w+)", full)
    if wrong_type and full_key:
        return f"{full_key.group(1)}={wrong_type.group(1)!r} has the wrong type; expected {wrong_type.group(2)}"

    missing_value = re.search(r"Missing mandatory value: (\S+)", full)
    if missing_value:
        return f"{missing_value.group(1)} must be set, e.g. {missing_value.group(1)}=/path/to/model"

    bad_override = re.search(r"Error parsing override '([^']+)'", full)
    if bad_override:
        return f"could not parse the override {bad_override.group(1)!r}; expected key=value"

    line = next((line for line in text.splitlines() if line.strip()), text)
    return line or None


def _schema_fields(class_name: str) -> list[str]:
    from kvpipe import config  # config imports the registries, which import this module

    schema = getattr(config, class_name, None)
    return [f.name for f in fields(schema)] if schema else []
