"""What a load is: one class per way requests arrive, registered by subclassing. A load knows its
settings and their checks, when each request arrives (offsets from the start, in seconds), and how
many it lets be in flight at once. Pure Python: the serving job (kvpipe.job.serve) runs it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Optional

from kvpipe.errors import ConfigError
from kvpipe.registry import Registered, Registry


@dataclass
class Common:
    """The load.* settings every kind reads."""

    requests: Optional[int] = None  # how many requests; default: one per prompt of the workload
    # the latency targets goodput counts against (AIPerf's and DistServe's definition): a request
    # meets them when its TTFT (from arrival) and its TPOT are both within; null: no target
    max_ttft_ms: Optional[float] = None
    max_tpot_ms: Optional[float] = None


COMMON_FIELDS = tuple(f.name for f in dataclasses.fields(Common))


@dataclass
class NoSettings:
    """A load that reads no load.* field beyond the common ones."""


class Load(Registered):
    """Base class: subclass it with `name`, its `Settings`, and `arrivals` / `in_flight` where they
    differ from "every request at once, all in flight"."""

    registry: ClassVar[Registry[Load]] = Registry("load.kind")
    Settings: ClassVar[type] = NoSettings
    # a closed loop: each request arrives when one in flight is answered (its client was waiting);
    # otherwise arrivals are fixed in advance and a request may wait for the server
    closed: ClassVar[bool] = False
    # replays the arrival times a workload's requests carry (a dataset's timestamp column), where they do
    replays_arrivals: ClassVar[bool] = False

    def __init__(self, load_cfg):
        self.config = load_cfg
        self.settings = self.Settings(**{f.name: getattr(load_cfg, f.name) for f in dataclasses.fields(self.Settings)})

    @classmethod
    def read_fields(cls) -> tuple[str, ...]:
        """The load.* fields this kind's measurement depends on."""
        return ("load.kind", *(f"load.{name}" for name in COMMON_FIELDS),
                *(f"load.{f.name}" for f in dataclasses.fields(cls.Settings)))  # fmt: skip

    def check(self) -> None:
        """Checks against the config alone; raises a one-line ConfigError."""
        if self.config.requests is not None and self.config.requests < 1:
            raise ConfigError("load.requests", self.config.requests, "expected a positive number of requests, or null")
        for name in ("max_ttft_ms", "max_tpot_ms"):
            value = getattr(self.config, name)
            if value is not None and not value > 0:
                raise ConfigError(f"load.{name}", value, "expected a latency target in ms above 0, or null")

    def request_count(self, prompts: int) -> int:
        """How many requests the run serves: load.requests, else one per prompt of the workload."""
        return self.config.requests or prompts

    def arrivals(self, count: int) -> list[float]:
        """When each request arrives, in seconds from the start: all at once unless the kind says."""
        return [0.0] * count

    def in_flight(self, count: int) -> int:
        """The most requests served at once: all of them unless the kind says."""
        return count

    def label(self) -> str:
        """How the run's title names it: load=concurrency(4)."""
        return self.name


registered = Load.registry.registered
names = Load.registry.names
get = Load.registry.get  # raises a one-line ConfigError naming the registered ones
