"""engine=transformers (the default): kvpipe's own process generates with Hugging Face
transformers, through the cache kvpipe builds (cache=..., backend=..., press=...). Every job is
keyed and recorded as before engines existed."""

from __future__ import annotations

from kvpipe.engine.base import Engine


class Transformers(Engine):
    name = "transformers"
    order = 0
    in_process = True

    def read_fields(self) -> tuple[str, ...]:
        return ()  # keyed and logged as every run before engines: the engine group adds nothing
