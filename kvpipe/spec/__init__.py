"""The spec stage: a composed config becomes a validated, typed `Spec`, what one job will do.

`schema.py` assembles the whole config's typed schema from kvpipe.config's plain schemas and the
cache, backend and workload registries, and composes conf/ with it (`compose`); `spec.py` validates
a composed config into a `Spec` (`make_spec`), whose strategy, measurement key and params every
later stage reads. Pure Python: no torch, transformers or mlflow.
"""

from kvpipe.spec.schema import KvpipeConfig, compose, register_schemas
from kvpipe.spec.spec import (
    LATE_MODEL_FIELDS,
    RANDOM_LAYER_TYPES,
    STRATEGY_GROUPS,
    Spec,
    hf_model_name,
    looks_local,
    make_spec,
    override_group,
)

__all__ = [
    "LATE_MODEL_FIELDS", "RANDOM_LAYER_TYPES", "STRATEGY_GROUPS", "KvpipeConfig", "Spec", "compose", "hf_model_name",
    "looks_local", "make_spec", "override_group", "register_schemas",
]  # fmt: skip
