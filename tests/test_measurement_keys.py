"""What a config measures, pinned: its measurement key (resume=true finds earlier runs by it), its
params (compare and recommend read them), its warnings and its one-line description, for every
strategy, backend, axis layout and workload on a dense and a sliding-window model, and some odd
settings. Moving code must leave them all as they were; only a deliberate change of what is measured
regenerates them: `python tests/test_measurement_keys.py` (from the repository root) rewrites
data/measurement_keys.json."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from kvpipe.errors import ConfigError

PINNED = Path(__file__).parent / "data" / "measurement_keys.json"

CONFIGS = [
    *((model, f"cache={cache}") for model in ("model=tiny_random", "model=tiny_sliding")
      for cache in ("dynamic", "static", "static_compiled", "offloaded", "offloaded_static", "quantized")),
    *(("model=tiny_random", "cache=quantized", f"backend={backend}", f"axis={axis}")
      for backend in ("quanto", "hqq", "fp8") for axis in ("kivi", "per_token", "per_channel")),
    *(("model=tiny_sliding", "cache=quantized", f"backend={backend}") for backend in ("hqq", "fp8")),
    *(("model=tiny_random", f"workload={kind}") for kind in ("chat", "long_context", "passkey")),
    ("model=tiny_random", "workload=dataset", "workload.path=examples/prompts.jsonl"),
    ("model=tiny_random", "cache=static", "cache.max_cache_len=4096", "workload.max_new_tokens=7"),
    ("model=tiny_random", "cache=quantized", "backend.nbits=2", "axis.key=0", "backend.residual_length=16"),
    ("model=tiny_random", "cache=quantized", "backend=hqq", "backend.q_group_size=32", "quality.scored_tokens=48"),
    ("model=tiny_random", "cache=quantized", "quality.scored_tokens=160"),  # what unset means: keyed as unset
    ("model=tiny_sliding", "cache=quantized", "cache.quantize_sliding=true", "backend=hqq"),
    ("model=tiny_sliding", "cache=offloaded", "cache.offload_only_non_sliding=false"),
    ("model=tiny_sliding", "cache=offloaded_static", "cache.offload_only_non_sliding=false", "cache.max_cache_len=512"),
    ("model=tiny_random", "cache=dynamic", "backend=hqq", "axis=per_token"),  # ignored, with a warning
    ("model=tiny_random", "cache=offloaded", "cache.max_cache_len=100"),
    ("model=tiny_random", "quality=off", "tracking=off", "workload.repeats=5", "workload.noise_threshold=0.3"),
    ("model=tiny_random", "workload=passkey", "workload.context_tokens=300", "workload.depths=[0.5]", "cache=static"),
    ("model=tiny_random", "workload=long_context", "workload.batch_size=2", "cache=quantized", "backend=fp8"),
    ("model=tiny_random", "model.threads=2", "model.dtype=bfloat16", "fallback=[static,dynamic]"),
    ("model=tiny_random", "cache=dynamic", "cache.compile=true"),  # refused: one line
    ("model=tiny_random", "cache=quantized", "backend.nbits=3"),
    ("model=tiny_random", "+cache.nope=1"),
    # a press, a load and a paged cache (pinned before options became typed per choice)
    *(("model=tiny_random", f"press={press}") for press in ("streaming", "knorm", "snapkv")),
    ("model=tiny_random", "press=streaming", "press.window=16", "press.sinks=2"),
    ("model=tiny_random", "press=snapkv", "press.ratio=0.25", "press.window=8", "press.kernel=3"),
    ("model=tiny_random", "cache=quantized", "press=knorm", "press.ratio=0.75"),
    *(("model=tiny_random", f"load={load}") for load in ("offline", "concurrency", "rate")),
    ("model=tiny_random", "load=rate", "load.rate=2.5", "load.requests=8", "load.max_tpot_ms=50"),
    ("model=tiny_random", "cache=paged", "load=concurrency", "load.concurrency=2"),
    ("model=tiny_random", "cache=paged", "load=rate", "cache.block_size=16"),
    ("model=tiny_random", "cache=paged"),  # refused: it needs a load
    ("model=tiny_random", "press=snapkv", "load=offline"),  # one request per call
    ("model=tiny_random", "press=snapkv", "load=offline", "press.protocol=query_agnostic"),  # refused: under a load
]  # fmt: skip


def measured(overrides: tuple[str, ...]) -> dict:
    """What the pinned file holds for one config: its key, a digest of its params (in order), its
    warnings and description; or the one-line error it is refused with."""
    from kvpipe.jobspec import compose, make_spec

    try:
        spec = make_spec(compose(list(overrides)), list(overrides))
    except ConfigError as exc:
        return {"error": str(exc)}
    params = json.dumps(list(spec.params().items()))
    return {
        "key": spec.measurement_key(),
        "params": hashlib.sha256(params.encode()).hexdigest()[:16],
        "warnings": list(spec.warnings),
        "describe": spec.strategy.describe(),
    }


@pytest.mark.slow  # composes and validates ~80 configs: ~10 s
def test_measurement_keys_params_and_descriptions_are_as_pinned(monkeypatch):
    monkeypatch.chdir(PINNED.parents[2])  # the dataset's path is relative, as users write it
    pinned = json.loads(PINNED.read_text())
    assert sorted(pinned) == sorted(" ".join(overrides) for overrides in CONFIGS)
    for overrides in CONFIGS:
        assert measured(overrides) == pinned[" ".join(overrides)], overrides


if __name__ == "__main__":
    sys.path.insert(0, str(PINNED.parents[2]))
    PINNED.write_text(json.dumps({" ".join(o): measured(o) for o in CONFIGS}, indent=1) + "\n")
