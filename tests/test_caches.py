"""Every cache strategy from config: it runs, it is validated, and its bytes are exact."""

from __future__ import annotations

import pytest
import torch

from kvpipe import model as models
from kvpipe.cache import accounting, backends
from kvpipe.cache.backends import grouped
from kvpipe.config import ModelConfig
from kvpipe.errors import ConfigError
from kvpipe.job.runner import run_job
from kvpipe.orchestrate.pipeline import run_pipeline

from conftest import spec_for

TINY = (
    "model=tiny_random",
    "workload=long_context",
    "workload.max_new_tokens=5",
    "workload.warmup=0",
    "tracking=off",
    "backend.q_group_size=16",
    "backend.residual_length=4",
    "quality.windows=2",
    "quality.scored_tokens=16",
)

SHIPPED = (
    [("cache=dynamic",), ("cache=static",), ("cache=offloaded",), ("cache=offloaded_static",)]
    + [
        ("cache=quantized", f"backend={b}", f"backend.nbits={n}", f"axis={a}")
        for b, n in (("quanto", 4), ("quanto", 2), ("hqq", 4), ("hqq", 2), ("hqq", 3))
        for a in ("per_token", "per_channel", "kivi")
    ]
    + [("cache=quantized", "backend=fp8")]
)


@pytest.mark.slow  # a real job for each of forty combinations
@pytest.mark.parametrize("prompt_tokens", [37, 40])
@pytest.mark.parametrize("combo", SHIPPED, ids=lambda c: ",".join(c))
def test_every_shipped_combination_runs_on_tiny_random(combo, prompt_tokens):
    result = run_job(spec_for(*TINY, f"workload.prompt_tokens={prompt_tokens}", *combo))
    assert result.metrics["new_tokens"] == 5
    assert result.metrics["kv_cache_tokens"] == prompt_tokens + 5 - 1
    assert result.metrics["kv_cache_bytes"] > 0


def dense_expected(shape, tokens, batch, dtype_bytes):
    return 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * tokens * batch * dtype_bytes


SHAPES = {
    "multi-head": dict(num_attention_heads=4, num_key_value_heads=4, hidden_size=64),
    "grouped-query": dict(num_attention_heads=8, num_key_value_heads=2, hidden_size=64),
    "odd heads": dict(num_attention_heads=9, num_key_value_heads=3, hidden_size=72),
    "3 layers, head_dim 32": dict(num_attention_heads=2, num_key_value_heads=1, hidden_size=64, num_hidden_layers=3),
}


@pytest.mark.slow  # a real job per shape
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("name", sorted(SHAPES))
@pytest.mark.parametrize("dtype,dtype_bytes", [("float32", 4), ("bfloat16", 2)])
def test_dense_kv_bytes_are_exactly_the_formula(name, batch, dtype, dtype_bytes):
    model = ModelConfig(name="tiny_random", source="random", dtype=dtype, **SHAPES[name])
    loaded = models.load(model)
    ids = torch.randint(0, 1000, (batch, 11))
    from transformers import DynamicCache, StaticCache

    dynamic = DynamicCache(config=loaded.model.config)
    loaded.model.generate(
        ids, attention_mask=torch.ones_like(ids), cache=dynamic, max_new_tokens=4, min_new_tokens=4, do_sample=False
    )
    assert accounting.kv_cache_bytes(dynamic) == dense_expected(loaded.shape, 11 + 3, batch, dtype_bytes)
    static = StaticCache(config=loaded.model.config, max_cache_len=40)
    loaded.model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        cache=static,
        max_new_tokens=4,
        min_new_tokens=4,
        do_sample=False,
        disable_compile=True,
    )
    assert accounting.kv_cache_bytes(static) == dense_expected(loaded.shape, 40, batch, dtype_bytes)  # whole allocation
    assert accounting.dense_fp16_bytes(loaded.shape, 11, 4, batch) == dense_expected(loaded.shape, 14, batch, 2)


def test_quantized_bytes_count_packed_data_scales_and_residual():
    spec = spec_for(*TINY, "workload.prompt_tokens=64", "cache=quantized", "backend=quanto", "axis=per_token")
    metrics = run_job(spec).metrics
    # int4 packs two values a byte: the quantized part alone is 1/4 of fp16 (plus scales); the residual is fp32
    assert metrics["kv_compression"] > 1.5
    dense = run_job(spec_for(*TINY, "workload.prompt_tokens=64")).metrics
    assert metrics["kv_cache_bytes"] < dense["kv_cache_bytes"] / 3


def test_int2_holds_fewer_bytes_than_int4():
    int4 = run_job(spec_for(*TINY, "workload.prompt_tokens=64", "cache=quantized", "backend.nbits=4"))
    int2 = run_job(spec_for(*TINY, "workload.prompt_tokens=64", "cache=quantized", "backend.nbits=2"))
    assert int2.metrics["kv_cache_bytes"] < int4.metrics["kv_cache_bytes"]


@pytest.mark.slow  # real jobs
def test_offloaded_without_cuda_runs_with_offloading_off_and_records_both(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("on CUDA the offloaded cache really offloads")
    result = run_pipeline(spec_for(*TINY, "cache=offloaded_static"), tmp_path, tmp_path, print_table=False)
    assert result.tags["cache.requested"] == "offloaded_static"
    assert result.tags["cache.effective"] == "static"
    assert any("offloading off" in note for note in result.notes)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("strategy", ["offloaded", "offloaded_static"])
def test_offloaded_on_cuda_offloads_and_matches_dynamic(strategy):
    base = (*TINY, "model.device=cuda", "workload.prompt_tokens=64")
    offloaded = run_job(spec_for(*base, f"cache={strategy}"))
    dynamic = run_job(spec_for(*base))
    assert offloaded.tags["cache.effective"] == strategy
    assert [t["completion"] for t in offloaded.texts] == [t["completion"] for t in dynamic.texts]


# ---- validation --------------------------------------------------------------------------


@pytest.mark.slow  # loads a model per case
@pytest.mark.parametrize(
    "overrides,field",
    [
        (("cache=quantized", "backend=quanto", "backend.nbits=3"), "backend.nbits (backend=quanto)"),
        (("cache=quantized", "backend=hqq", "backend.nbits=5"), "backend.nbits (backend=hqq)"),
        (("cache=quantized", "backend=quanto", "axis.key=1"), "axis.key (backend=quanto)"),
        (("cache=quantized", "backend=hqq", "axis.value=-1"), "axis.value (backend=hqq)"),
        (("cache=quantized", "backend.q_group_size=0"), "backend.q_group_size"),
        (("cache=dynamic", "cache.compile=true"), "cache.compile"),
    ],
)
def test_invalid_backend_settings_name_the_field_and_valid_choices(overrides, field):
    with pytest.raises(ConfigError) as caught:
        spec_for(*overrides)
    assert str(caught.value).startswith(field)
    assert "expected" in str(caught.value)


def test_group_size_must_divide_head_dim():
    spec = spec_for(*TINY, "cache=quantized", "backend.q_group_size=48")
    with pytest.raises(ConfigError, match=r"backend.q_group_size=48 .*head_dim=64.*16, 32, 64"):
        spec.strategy.check_for_model(models.read_shape(spec.model), 40)


def test_static_max_cache_len_must_hold_prompt_and_new_tokens():
    spec = spec_for(*TINY, "workload.prompt_tokens=40", "cache=static", "cache.max_cache_len=44")
    with pytest.raises(ConfigError, match=r"cache.max_cache_len=44 .*40 \+ 5 = 45"):
        run_job(spec)


def test_backend_settings_with_a_dense_cache_warn():
    from kvpipe.jobspec import make_spec

    from conftest import compose_config

    spec = make_spec(compose_config(["backend=hqq"]), overrides=["backend=hqq"])
    assert any("ignore" in w for w in spec.warnings)


def test_fp8_is_detected_at_run_time(monkeypatch):
    import transformers.cache_utils as cache_utils

    from kvpipe.errors import KvpipeError

    monkeypatch.delattr(cache_utils, "Fp8QuantizedLayer")
    with pytest.raises(KvpipeError, match="backend=fp8 needs"):
        run_job(spec_for(*TINY, "cache=quantized", "backend=fp8"))


# ---- correctness: lossless strategies give dynamic's tokens --------------------------------


def completions(*overrides):
    return [t["completion"] for t in run_job(spec_for(*overrides)).texts]


@pytest.mark.slow  # four real jobs
def test_static_and_offloaded_match_dynamic_tokens_on_tiny_random():
    reference = completions(*TINY, "workload.prompt_tokens=37")
    for strategy in ("static", "offloaded", "offloaded_static"):
        assert completions(*TINY, "workload.prompt_tokens=37", f"cache={strategy}") == reference, strategy


# The four chat prompts as one left-padded batch: one generate call per strategy (compiling once), not four;
# timed once, since tokens are what this compares.
EMBEDDED = ("workload.max_new_tokens=12", "workload.batch_size=4", "workload.warmup=0", "workload.repeats=1")
EMBEDDED += ("tracking=off", "quality=off")


@pytest.mark.slow  # the embedded model: five jobs of twelve tokens, one of them compiled
def test_static_offloaded_and_compiled_static_match_dynamic_tokens_on_the_embedded_model(embedded_model):
    reference = completions(*EMBEDDED)
    for overrides in (
        ("cache=static",),
        ("cache=offloaded",),
        ("cache=offloaded_static",),
        ("cache=static", "cache.compile=true"),
    ):
        assert completions(*EMBEDDED, *overrides) == reference, overrides


def test_a_backend_failure_names_the_combination_and_shape(monkeypatch):
    from kvpipe.cache.backends._layers import QuantoKVLayer
    from kvpipe.errors import KvpipeError

    def broken(self, tensor, axis):
        raise ValueError("Group size (64) must be a divisor of (111)")

    # the backend's one-off warm-up quantizes too: done first, as any earlier quanto job in the process does
    backends.get("quanto").warm("cpu", torch.float32)
    monkeypatch.setattr(QuantoKVLayer, "_quantize", broken)
    with pytest.raises(
        KvpipeError,
        match=r"backend=quanto backend.nbits=4 axis=kivi .* batch 1 x 37 prompt tokens: "
        r"ValueError: Group size",
    ):
        run_job(spec_for(*TINY, "workload.prompt_tokens=37", "cache=quantized", "backend=quanto"))


def test_a_backend_that_cannot_start_says_so_in_one_line(monkeypatch):
    from kvpipe.cache.backends._layers import QuantoKVLayer
    from kvpipe.errors import KvpipeError

    def no_compiler(self, *args, **kwargs):
        raise OSError("Error building extension 'quanto_cuda': nvcc not found")

    monkeypatch.setattr(QuantoKVLayer, "update", no_compiler)
    grouped._warm.cache_clear()
    try:
        with pytest.raises(KvpipeError, match=r"backend=quanto cannot run on cpu: OSError: .*nvcc.*try backend=hqq"):
            run_job(spec_for(*TINY, "workload.prompt_tokens=40", "cache=quantized", "backend=quanto"))
    finally:
        grouped._warm.cache_clear()
