"""The measurement key: what a job measures, hashed, so that a sweep skips a duplicate and
`resume=true` finds the runs it already made. Every setting added since runs were first keyed is
kept out of the key at what it means unset, so older runs still match (the compatibility rules
are all here, each with its reason)."""

from __future__ import annotations

import hashlib
import json

from kvpipe import cache as cache_strategies
from kvpipe import config
from kvpipe import workload as workloads
from kvpipe.jobspec.names import hf_model_name

# model.* fields added since runs were first keyed: left unset, they stay out of the key
LATE_MODEL_FIELDS = ("layer_types", "threads")
# workload.noise_threshold is a judgement of the timings, not part of what is measured: keyed as
# every run before it was calibrated
KEYED_NOISE_THRESHOLD = 0.10


def measurement_key(spec) -> str:
    """Hash of what the spec measures: equal for configs that measure the same thing (settings the
    strategy or the workload's kind ignores, and tracking, are left out)."""
    data = spec.as_dict()
    data.pop("tracking"), data.pop("fallback")
    if spec.engine is not None:  # engine=transformers is keyed as every job was before engines existed
        read = spec.bound_engine.read_fields()
        data["engine"] = {k: v for k, v in data["engine"].items() if f"engine.{k}" in read}
    if spec.load is not None:  # a job without one is keyed as every job was before loads existed
        read = spec.bound_load.read_fields()
        data["load"] = {k: v for k, v in data["load"].items() if f"load.{k}" in read}
    # what the workload reads, and what that points at (a dataset file's digest): a chat job's
    # passkey depths measure nothing, a changed file is a new measurement
    data["workload"] = spec.bound_workload.identity()
    data["workload"]["noise_threshold"] = KEYED_NOISE_THRESHOLD
    if data["workload"]["repeats"] != "auto":  # how repeats=auto stops: nothing to a fixed count
        for name in workloads.AUTO_REPEATS:
            data["workload"].pop(name, None)
    elif data["workload"].get("decide_within") == workloads.Common.decide_within:
        data["workload"].pop("decide_within")  # added later: its default keys as runs made before it did
    # quality.scored_tokens set to what it defaults to measures what unset does (a search sets it)
    if data["quality"]["scored_tokens"] == config.QualityConfig.default_scored_tokens(spec.residual_length):
        data["quality"]["scored_tokens"] = None
    read, late = spec.read_fields(), cache_strategies.get(spec.cache.strategy).late_defaults
    for group in cache_strategies.CacheChoice.GROUPS:
        kept = {k: v for k, v in data.get(group, {}).items() if f"{group}.{k}" in read or f"{group}.*" in read}
        data[group] = kept
        if not kept:
            data.pop(group, None)
    # settings added since runs were first keyed leave the key alone at what they mean unset
    for key in late:
        if key in data.get("cache", {}) and data["cache"][key] in (None, late[key]):
            data["cache"].pop(key)
    for key in LATE_MODEL_FIELDS:
        if data["model"].get(key) is None:
            data["model"].pop(key, None)
    if spec.model.source == "hf" and spec.model.name == hf_model_name(spec.model.name_or_path):
        data["model"]["name"] = "hf"  # the name model=hf runs were keyed with before they took the folder's
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
