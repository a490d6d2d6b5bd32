"""Units shared by every stage: dtype sizes, byte sizes as people write and read them, durations and ETAs."""

from __future__ import annotations

import json
import math
import re

from kvpipe.errors import ConfigError

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
MIB = 2**20
SIZE_UNITS = {
    "": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}  # fmt: skip


def parse_bytes(text: str, field: str = "--memory-budget") -> int:
    """Bytes from '8GiB', '512MiB', '24GB', '1e9'; a one-line ConfigError otherwise."""
    match = re.fullmatch(r"\s*((?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?)\s*([a-z]*)\s*", text, re.IGNORECASE)
    if not match or match.group(2).lower() not in SIZE_UNITS or float(match.group(1)) <= 0:
        raise ConfigError(field, text, "expected a positive size like 8GiB, 512MiB, 24GB or 1e9 (bytes)")
    return int(float(match.group(1)) * SIZE_UNITS[match.group(2).lower()])


def param_text(value) -> str | None:
    """A setting as an MLflow param: plain text, as it would be typed (true, not True; a list as
    JSON, not a Python repr); None for a setting with no value, which is not logged."""
    if value is None or value == [] or value == ():
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return json.dumps(list(value))
    return str(value)


def counted(count: float, noun: str, plural: str | None = None) -> str:
    """A count and its noun, which agree in number: (1, 'prompt') -> '1 prompt', (8, 'prompt') ->
    '8 prompts', (1200, 'request') -> '1,200 requests'; `plural` where adding an s will not do."""
    shown = f"{count:,.0f}"
    return f"{shown} {noun if shown == '1' else plural or noun + 's'}"


def human_bytes(value: float) -> str:
    """1536 -> '1.5 KiB'; a size that rounds to 1024 of a unit shows in the next (1.0 GiB, never
    1024.0 MiB), so one size always reads the same."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(round(value, 0 if unit == "B" else 1)) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def sizes_apart(first: float, second: float) -> str:
    """Two sizes in the larger's unit, with as many decimals (up to 3) as they need to read apart
    where they differ: (1.12 GiB, 1.07 GiB) -> '1.12 GiB vs 1.07 GiB', never '1.1 GiB vs 1.1 GiB'."""
    unit = human_bytes(max(first, second)).split()[-1]
    scale = 1024 ** ("B", "KiB", "MiB", "GiB", "TiB").index(unit)
    if unit == "B":
        return f"{first:.0f} B vs {second:.0f} B"
    digits = next((d for d in (1, 2, 3) if f"{first / scale:.{d}f}" != f"{second / scale:.{d}f}"), 1)
    return f"{first / scale:.{digits}f} {unit} vs {second / scale:.{digits}f} {unit}"


def duration_text(seconds: float) -> str:
    """A duration as kvpipe prints it, in whole seconds rounded down: 45 -> '45s', 65 -> '1m05s',
    5400 -> '90m00s'."""
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def eta_text(elapsed_s: float, done: int, total: int) -> str:
    """The time the total - done steps left will take at the pace of the done ones, rounded up to the
    second (an ETA of 0s means nothing is left); '0s' also where no step is done yet (no pace)."""
    return duration_text(math.ceil(elapsed_s / done * (total - done))) if 0 < done < total else "0s"
