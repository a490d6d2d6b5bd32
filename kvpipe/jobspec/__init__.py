"""The job-spec stage: a composed config becomes a validated, typed `Spec`, what one job will do.

`schema.py` assembles the whole config's schema from kvpipe.config's plain schemas and, for the
groups plugins extend, a permissive schema per group built from the registries, and composes conf/
with it (`compose`); `options.py` checks each such group's chosen option against its own typed
dataclass and sets another option's settings aside as warnings; `validated.py` validates a composed
config into a `Spec` (`make_spec`, or `spec_from(overrides)` for both steps), whose strategy,
measurement key (`key.py`, with its rules for older runs) and params every later stage reads. Pure
Python: no torch, transformers or mlflow.
"""

from kvpipe.jobspec.key import LATE_MODEL_FIELDS
from kvpipe.jobspec.names import hf_model_name, looks_local
from kvpipe.jobspec.schema import KvpipeConfig, compose, register_schemas
from kvpipe.jobspec.validated import (
    RANDOM_LAYER_TYPES,
    STRATEGY_GROUPS,
    Spec,
    make_spec,
    override_group,
    reject_unknown_keys,
    spec_from,
)

__all__ = [
    "LATE_MODEL_FIELDS", "RANDOM_LAYER_TYPES", "STRATEGY_GROUPS", "KvpipeConfig", "Spec", "compose", "hf_model_name",
    "looks_local", "make_spec", "override_group", "register_schemas", "reject_unknown_keys", "spec_from",
]  # fmt: skip
