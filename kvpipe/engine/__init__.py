"""The engine stage: what generates the tokens. transformers in kvpipe's own process (the default,
engine=transformers), or a serving engine's own server that kvpipe starts, sends the workload's
requests to over HTTP, reads its own reports from, and stops (engine=llama_cpp, vllm), or an
OpenAI-compatible server the user runs, which kvpipe only sends requests to (engine=openai). One module each,
registered on import. Pure Python: the served job (kvpipe.job.engine_served) runs them."""

from kvpipe.engine.base import Engine, get, names, registered
from kvpipe.registry import import_plugins

import_plugins(__name__, __path__)

__all__ = ["Engine", "get", "names", "registered"]
