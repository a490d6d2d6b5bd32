"""load=replay: the workload's own traffic, each request arriving when its row says (a dataset's
`timestamp` or `arrival_s` column), in the order they arrived, each once (the first load.requests of
them where fewer are asked for). Open loop, as load=rate: a request that arrives while the server is
busy waits, and its wait counts in its TTFT."""

from __future__ import annotations

from kvpipe.errors import ConfigError
from kvpipe.load.base import Load


class Replay(Load):
    name = "replay"
    order = 40
    any_workload = False
    test_overrides = ("workload=dataset", "workload.path=examples/traffic.jsonl")

    def requests(self, prompts) -> list:
        timed = sorted(prompts, key=self._arrival)
        return timed[: self.config.requests or len(timed)]

    def arrivals(self, requests) -> list[float]:
        first = self._arrival(requests[0])
        return [self._arrival(request) - first for request in requests]

    def _arrival(self, request) -> float:
        if request.arrival_s is None:
            raise ConfigError(
                "load.kind", self.name,
                "the workload's prompts carry no arrival times; expected workload=dataset with a timestamp or "
                "arrival_s column, or load=rate to draw arrivals",
            )  # fmt: skip
        return request.arrival_s
