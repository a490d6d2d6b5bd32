"""The workload stage: every kind of prompts a job can run (one module or folder each, registered
on import) and the registry callers ask.

`get(kind)` gives a workload's class, `registered()` all of them; no other module names a kind.
`metrics()` is the metric catalogue with every workload's own metrics added, `quality_metrics()`
the ones that judge a workload's answers. A workload's scoring is a `Scored` (kvpipe.record logs it).
`conf/workload/NAME.yaml` is each one's config file.
"""

from kvpipe.registry import import_plugins
from kvpipe.workload._compared import RecordedRun, Section
from kvpipe.workload._scored import Answer, Flip, Scored, ScoredFile, Step
from kvpipe.workload.base import (
    AUTO_REPEATS,
    REGISTRY,
    Batch,
    Common,
    Quality,
    Window,
    Workload,
    get,
    longest_prompt_of,
    metrics,
    names,
    quality_metrics,
    reads,
    registered,
    shortest_and_padded,
)

import_plugins(__name__, __path__, packages=True)

__all__ = [
    "AUTO_REPEATS",
    "Answer",
    "REGISTRY",
    "Batch",
    "Common",
    "Flip",
    "Quality",
    "RecordedRun",
    "Section",
    "Scored",
    "ScoredFile",
    "Step",
    "Window",
    "Workload",
    "get",
    "longest_prompt_of",
    "shortest_and_padded",
    "metrics",
    "names",
    "quality_metrics",
    "reads",
    "registered",
]
