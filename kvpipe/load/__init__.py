"""The load stage: how requests arrive at a served model (load=offline|concurrency|rate|replay), one module
each, registered on import. Independent of which prompts (workload=) and which cache (cache=).
Without a load (the default), a job runs its workload's batches one after another."""

from kvpipe.load.base import PERCENTILES, Common, Load, get, names, registered
from kvpipe.registry import import_plugins

import_plugins(__name__, __path__)

__all__ = ["PERCENTILES", "Common", "Load", "get", "names", "registered"]
