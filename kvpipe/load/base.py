"""What a load is: one class per way requests arrive, registered by subclassing. A load receives the
workload's requests (vLLM's `get_request(requests, rate, burstiness)` shape) and says which of them a
run serves, when each arrives (offsets from the start, in seconds), and how many it lets be in flight
at once. Pure Python: the served job (kvpipe.job.served) runs it. A request is whatever the job hands
over; a load may read its `arrival_s` (when the workload says it arrived, or None)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Optional, Sequence

from kvpipe.errors import ConfigError
from kvpipe.registry import Registered, Registry

# The percentiles of its requests a served run records (TTFT, TPOT, ... at p50, p90, p99), and at which
# its targets can be held
PERCENTILES = (50, 90, 99)


@dataclass
class Common:
    """The load.* settings every kind reads."""

    requests: Optional[int] = None  # how many requests; default: one per prompt of the workload
    # the latency targets goodput counts against (AIPerf's and DistServe's definition): a request
    # meets them when its TTFT (from arrival) and its TPOT are both within; null: no target
    max_ttft_ms: Optional[float] = None
    max_tpot_ms: Optional[float] = None
    # 50, 90 or 99: stop letting requests in once so many have missed a target that the pass's TTFT or
    # TPOT at this percentile misses it whatever the rest do (those in flight are answered; one pass,
    # workload.repeats=1); null: every request served. kvpipe capacity's rate points set it.
    stop_when_missed_at: Optional[int] = None


COMMON_FIELDS = tuple(f.name for f in dataclasses.fields(Common))
# Common settings added after runs were keyed, as a kind's late_defaults below
LATE_COMMON: dict[str, Any] = {"stop_when_missed_at": None}


@dataclass
class NoSettings:
    """A load that reads no load.* field beyond the common ones."""


class Load(Registered):
    """Base class: subclass it with `name`, its `Settings`, and `requests` / `arrivals` / `in_flight`
    where they differ from "the workload's prompts, every one at once, all in flight"."""

    registry: ClassVar[Registry[Load]] = Registry("load.kind")
    Settings: ClassVar[type] = NoSettings
    # a closed loop: each request arrives when one in flight is answered (its client was waiting);
    # otherwise arrivals are fixed in advance and a request may wait for the server
    closed: ClassVar[bool] = False
    # runs with any workload's requests (what a refusal suggests); False: it needs something of them
    # that not every workload carries (load=replay: their own arrival times)
    any_workload: ClassVar[bool] = True
    # Settings added after runs were keyed, with the value they mean unset: at it (or null) they are
    # neither keyed nor logged, so resume=true still finds the older runs
    late_defaults: ClassVar[dict[str, Any]] = {}
    # the Hydra overrides, beyond load=NAME, that make a quick, valid job of it on model=tiny_random

    def __init__(self, load_cfg):
        self.config = load_cfg
        self.settings = self.Settings(**{f.name: getattr(load_cfg, f.name) for f in dataclasses.fields(self.Settings)})

    def read_fields(self) -> tuple[str, ...]:
        """The load.* fields this load's measurement depends on (its key, its params)."""
        fields = (*COMMON_FIELDS, *(f.name for f in dataclasses.fields(self.Settings)))
        return ("load.kind", *(f"load.{name}" for name in fields if not self._at_late_default(name)))

    def _at_late_default(self, name: str) -> bool:
        late = {**LATE_COMMON, **self.late_defaults}
        return name in late and getattr(self.config, name, None) in (None, late[name])

    def check(self) -> None:
        """Checks against the config alone; raises a one-line ConfigError."""
        if self.config.requests is not None and self.config.requests < 1:
            raise ConfigError("load.requests", self.config.requests, "expected a positive number of requests, or null")
        for name in ("max_ttft_ms", "max_tpot_ms"):
            value = getattr(self.config, name)
            if value is not None and not value > 0:
                raise ConfigError(f"load.{name}", value, "expected a latency target in ms above 0, or null")
        stop_at = getattr(self.config, "stop_when_missed_at", None)
        if stop_at is not None:
            if stop_at not in PERCENTILES:
                raise ConfigError("load.stop_when_missed_at", stop_at,
                                  f"expected one of {', '.join(map(str, PERCENTILES))} (a recorded percentile), or null")  # fmt: skip
            if self.config.max_ttft_ms is None and self.config.max_tpot_ms is None:
                raise ConfigError("load.stop_when_missed_at", stop_at, "it stops on a missed target: expected "
                                  "load.max_ttft_ms or load.max_tpot_ms, or null")  # fmt: skip

    def requests(self, prompts: Sequence) -> list:
        """The requests a run serves, in the order they arrive, from the workload's (one per prompt):
        load.requests of them, the prompts cycled, else one per prompt."""
        return cycled(prompts, self.config.requests or len(prompts))

    def arrivals(self, requests: Sequence) -> list[float]:
        """When each request arrives, in seconds from the start: all at once unless the kind says."""
        return [0.0] * len(requests)

    def in_flight(self, requests: Sequence) -> int:
        """The most requests served at once: all of them unless the kind says."""
        return len(requests)

    def label(self) -> str:
        """How the run's title names it: load=concurrency(4)."""
        return self.name

    def served_label(self, requests: Sequence) -> str:
        """Its label as served to `requests`, where a setting could not act as given; a kind whose
        settings always act keeps label() (a plugin need not know of this)."""
        return self.label()

    def notes(self, requests: Sequence) -> list[str]:
        """What a run serving these requests should say of its load where a setting could not act as
        given (more in flight asked for than there are requests)."""
        return []


def cycled(prompts: Sequence, count: int) -> list:
    """`count` requests: the prompts in turn, from the first again where more are asked for."""
    return [prompts[i % len(prompts)] for i in range(count)]


registered = Load.registry.registered
names = Load.registry.names
get = Load.registry.get  # raises a one-line ConfigError naming the registered ones
