"""The user's limits, declared once: each limit's setting (a flag of recommend and advise, a field of
hydra/sweeper=search), its check, the figure of a run it bounds, and how far a run misses it.
recommend, advise and the search all read this table: a new limit is one entry here."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Callable

from kvpipe import catalogue, workload
from kvpipe.errors import ConfigError
from kvpipe.units import human_bytes, parse_bytes

DEFAULT_KL = 0.05  # nats: the quality limit when none is given
# The run's workload's own quality metric (workload.quality_metrics(): passkey's retrieval accuracy), a
# fraction, as a column kvpipe.decide.runs.with_derived adds: --min-accuracy bounds it.
ANSWER_QUALITY = catalogue.Metric("answer_quality", "accuracy", "", ".0%", catalogue.HIGHER)
_JUDGES = workload.quality_metrics()  # what --min-accuracy's help names: the workloads that judge answers


def _at_least_zero(flag: str, value: float) -> float:
    if not value >= 0:
        raise ConfigError(flag, value, "expected a number ≥ 0")
    return value


def _fraction(flag: str, value: float) -> float:
    if not 0 <= value <= 1:
        raise ConfigError(flag, value, "expected a fraction from 0 to 1, e.g. 0.9")
    return value


@dataclass(frozen=True)
class Limit:
    """One limit: `setting` is its field (hydra.sweeper.NAME) and, dashed, its flag (--max-tpot-ms)."""

    name: str  # as messages say it: "TPOT"
    key: str  # Limits' attribute: limits.tpot_ms
    setting: str
    figure: str  # the run's column it bounds (kvpipe.decide.runs.with_derived's, or an MLflow metric)
    metric: str  # the catalogue entry that shows its values
    help: str
    metavar: str
    parse: Callable[[str, object], float]  # (flag, given) -> the limit, or a one-line ConfigError
    given_as: type = float  # what argparse and Hydra read (a SIZE stays text until parsed)
    minimum: bool = False  # a figure the run must reach, not stay under
    unmeasured: str = ""  # how to measure the figure when a run lacks it
    describe: Callable[[float], str] = str
    quality: bool = False  # one of the quality limits: the first is the default, KL, unless another is given
    default: float | None = None  # Limits(): what a limit not given is

    @property
    def flag(self) -> str:
        return "--" + self.setting.replace("_", "-")

    def excess(self, value: float | None, limit: float) -> float:
        """The one rule for how far a figure is past its limit, relative: above 0 it misses by that
        share (a minimum: the share of the required figure it lacks), at or below 0 it meets it with
        that much to spare; inf where the figure was not measured, or any figure misses a limit of 0."""
        if value is None or value != value:
            return math.inf
        if self.minimum:
            return 1 - value / limit if limit > 0 else 0.0
        if limit > 0:
            return value / limit - 1
        return 0.0 if value <= 0 else math.inf


def accuracy_terms() -> str:
    """What --min-accuracy bounds, in words: 'retrieval or task accuracy', one term per workload that
    judges its answers."""
    terms = dict.fromkeys(q.term for q in workload.quality_metrics().values())  # several task workloads: one "task"
    return " or ".join(terms) + " accuracy"


LIMITS: tuple[Limit, ...] = (
    Limit("memory", "memory_bytes", "memory_budget", "memory_bytes", "peak_memory_bytes", "peak memory, weights included: 8GiB, 512MiB, 1e9",
          "SIZE", lambda flag, text: parse_bytes(text, flag), given_as=str,
          describe=lambda v: f"memory ≤ {human_bytes(v)}"),
    Limit("TPOT", "tpot_ms", "max_tpot_ms", catalogue.column("tpot_ms"), "tpot_ms", "time per output token", "MS", _at_least_zero,
          describe=lambda v: f"TPOT ≤ {v:g} ms"),
    Limit("KL", "kl", "max_kl", "quality_loss", "kl_vs_reference",
          f"KL divergence vs the full-precision reference (default: {DEFAULT_KL}, or none with --min-accuracy)",
          "NATS", _at_least_zero, unmeasured=" (run it with quality=on)", quality=True, default=DEFAULT_KL,
          describe=lambda v: f"KL ≤ {v:g} nats"),
    Limit("accuracy", "accuracy", "min_accuracy", ANSWER_QUALITY.name, ANSWER_QUALITY.name,
          f"{' or '.join(q.axis for q in _JUDGES.values())}, from runs with "
          f"{' or '.join(f'workload={kind}' for kind in _JUDGES)}, e.g. 0.9; the quality limit in place of "
          "the default --max-kl", "FRACTION", _fraction, minimum=True,
          unmeasured=f" (run it with {' or '.join(f'workload={kind}' for kind in _JUDGES)})", quality=True,
          describe=lambda v: f"{accuracy_terms()} ≥ {v:.0%}"),
    # the cache alone: on CPU a quantized cache holds far fewer KV bytes yet can peak higher (its decode
    # dequantizes a layer at a time), so a budget for the cache is not a budget for the process
    Limit("KV", "kv_bytes", "kv_budget", catalogue.column("kv_cache_bytes"), "kv_cache_bytes",
          "bytes the KV cache may hold, the cache alone (--memory-budget bounds the whole peak): 64MiB, 2e8",
          "SIZE", lambda flag, text: parse_bytes(text, flag), given_as=str,
          describe=lambda v: f"KV cache ≤ {human_bytes(v)}"),
)  # fmt: skip


def limit_named(name: str) -> Limit:
    return next(limit for limit in LIMITS if limit.name == name)


def shown(name: str, value: float) -> str:
    """A value of the named limit's figure as messages say it, through its metric's catalogue entry."""
    metric = limit_named(name).metric
    return ANSWER_QUALITY.show(value) if metric == ANSWER_QUALITY.name else workload.metrics()[metric].show(value)


def settings() -> tuple[str, ...]:
    """Every limit's setting: recommend's and advise's flags (dashed), hydra.sweeper's fields."""
    return tuple(limit.setting for limit in LIMITS)


class Limits:
    """The limits a user set (None: no limit), by each limit's key, in LIMITS' order or by name:
    Limits(8 * 2**30, 45.0), Limits(tpot_ms=45.0, kl=None). A limit not given is its default."""

    def __init__(self, *values: float | None, **by_key: float | None):
        keys = [limit.key for limit in LIMITS]
        unknown = set(by_key) - set(keys)
        if len(values) > len(keys) or unknown:
            raise TypeError(f"Limits takes {', '.join(keys)}; got {len(values)} values and {sorted(unknown)}")
        given = {**dict(zip(keys, values)), **by_key}
        self.values = {limit.name: given.get(limit.key, limit.default) for limit in LIMITS}

    def __getattr__(self, key: str):
        limit = next((limit for limit in LIMITS if limit.key == key), None)
        if limit is None:
            raise AttributeError(key)
        return self.values[limit.name]

    def __getitem__(self, name: str) -> float | None:
        return self.values.get(name)

    def __eq__(self, other) -> bool:
        return isinstance(other, Limits) and self.values == other.values

    def __repr__(self) -> str:
        return f"Limits({self.describe() or 'none'})"

    def describe(self) -> str:
        return " · ".join(limit.describe(self[limit.name]) for limit in LIMITS if self[limit.name] is not None)

    def checks(self, run) -> dict[str, tuple[float, float | None]]:
        """Each limit's (the run's figure, the limit)."""
        return {limit.name: (run.get(limit.figure, math.nan), self[limit.name]) for limit in LIMITS}

    def excesses(self, run) -> dict[str, float]:
        """Each limit set: how far the run is past it (Limit.excess)."""
        return {name: limit_named(name).excess(value, limit) for name, (value, limit) in self.checks(run).items()
                if limit is not None}  # fmt: skip

    def misses(self, run) -> dict[str, float]:
        """The limits the run misses, with their relative overshoot (inf where not measured).

        Memory is the measured peak, weights included: the allocator's on CUDA, the process's on CPU."""
        return {name: excess for name, excess in self.excesses(run).items() if excess > 0}


def limits_from(**given) -> Limits:
    """The user's limits by setting (memory_budget="8GiB", max_tpot_ms=80, ...), each checked: a
    one-line error naming the flag. One quality limit by default: KL, or the workload's own accuracy
    when asked for (passkey runs score their answers, and their KL would be over the reference's
    rambling past the answer); both when both are given."""
    unknown = set(given) - set(settings())
    if unknown:
        raise TypeError(f"unknown limit settings {sorted(unknown)}; expected {settings()}")
    values = {}
    for limit in LIMITS:
        raw = given.get(limit.setting)
        values[limit.key] = None if raw is None else limit.parse(limit.flag, raw)
    if not any(values[limit.key] is not None for limit in LIMITS if limit.quality):
        first = next(limit for limit in LIMITS if limit.quality)
        values[first.key] = first.default
    return Limits(**values)


def add_limit_arguments(parser: argparse.ArgumentParser, exclusive_quality: bool = False) -> None:
    """Every limit as a flag (default: none). exclusive_quality: one quality limit at most (advise)."""
    quality = parser.add_mutually_exclusive_group() if exclusive_quality else parser
    for limit in LIMITS:
        (quality if limit.quality else parser).add_argument(
            limit.flag, dest=limit.setting, type=limit.given_as, metavar=limit.metavar, help=limit.help
        )


def limits_of(namespace) -> Limits:
    """The limits from anything with the settings as attributes (argparse's args, SearchSettings)."""
    return limits_from(**{name: getattr(namespace, name, None) for name in settings()})
