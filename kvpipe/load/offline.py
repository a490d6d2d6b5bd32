"""load=offline: every request arrives at once, and as many are served together as the server takes
(batch throughput)."""

from __future__ import annotations

from kvpipe.load.base import Load


class Offline(Load):
    name = "offline"
    order = 10
    test_overrides = ("load.requests=3",)
