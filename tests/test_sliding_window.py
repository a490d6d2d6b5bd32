"""Models with sliding-window layers: the shape per layer, predictions equal to what real caches
hold (below, at and above the window, and with a one-token output), quantized caches where
transformers refuses them, and the offloading choice transformers offers for such models."""

from __future__ import annotations

import math

import pytest
import torch

from kvpipe import cli
from kvpipe import model as models
from kvpipe.cache import accounting
from kvpipe.errors import ConfigError
from kvpipe.job.runner import run_job
from kvpipe.model.shape import Layer, shape_from_config
from kvpipe.predict import bytes_plan as plan

from conftest import spec_for

WINDOW = 16  # conf/model/tiny_sliding.yaml
GEMMA = ("model=tiny_sliding",)  # two sliding layers and one full, as Gemma 3 mixes them
MISTRAL = ("model=tiny_random", f"model.sliding_window={WINDOW}")  # every layer slides
JOB = ("workload=long_context", "tracking=off", "quality=off", "workload.warmup=0", "workload.repeats=1")
# (prompt, new tokens): below the window; at it, with a one-token output (the prefill's view) and with
# several; above it, likewise. The cache holds prompt + new - 1 tokens.
REGIMES = [(6, 4), (16, 1), (16, 4), (40, 1), (40, 6)]
CACHES = {
    "dynamic": ("cache=dynamic",),
    "static": ("cache=static",),
    "offloaded": ("cache=offloaded",),
    "offloaded_static": ("cache=offloaded_static", "cache.offload_only_non_sliding=false"),
    "quanto full layers": ("cache=quantized", "backend=quanto", "backend.residual_length=3", "backend.q_group_size=32"),
    "hqq all layers": (
        "cache=quantized",
        "cache.quantize_sliding=true",
        "backend=hqq",
        "backend.nbits=2",
        "backend.residual_length=2",
        "backend.q_group_size=32",
    ),
    "quanto all layers kivi": (
        "cache=quantized",
        "cache.quantize_sliding=true",
        "backend=quanto",
        "axis=kivi",
        "backend.residual_length=5",
        "backend.q_group_size=16",
    ),  # fmt: skip
    "fp8 full layers": ("cache=quantized", "backend=fp8"),
}


def predicted(spec, prompt_tokens: int, new_tokens: int) -> int:
    kv = accounting.kv_shape(models.read_shape(spec.model), spec.workload.batch_size, spec.model.dtype)
    return plan.predict_kv_bytes(spec, kv, prompt_tokens, new_tokens)


# ---- the shape, per layer -----------------------------------------------------------------------


@pytest.mark.slow  # builds and loads three models
def test_the_shape_records_each_layers_type_and_window_as_the_loaded_model_builds_its_cache():
    for model in (GEMMA, MISTRAL):
        spec = spec_for(*model)
        described = models.read_shape(spec.model)  # from the config alone
        loaded = models.load(spec.model)
        assert described == loaded.shape
        from transformers import DynamicCache

        built = DynamicCache(config=loaded.model.config).layers
        assert [layer.slides for layer in described.layers] == [layer.is_sliding for layer in built]
    gemma = models.read_shape(spec_for(*GEMMA).model)
    assert gemma.layers == (Layer("sliding_attention", WINDOW),) * 2 + (Layer("full_attention"),)
    assert gemma.layer_summary() == "2 sliding_attention (window 16) + 1 full_attention"
    assert models.read_shape(spec_for(*MISTRAL).model).full_layers == 0


@pytest.mark.parametrize(
    "config,expected",
    [
        # Qwen 2: the config class fills in which layers slide from max_window_layers
        (dict(model_type="qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=1),
         [Layer(), Layer("sliding_attention", 8), Layer("sliding_attention", 8)]),
        (dict(model_type="qwen2", use_sliding_window=False, sliding_window=8), [Layer()] * 3),
        # Llama 4: chunked attention caches as a window of attention_chunk_size
        (dict(model_type="llama4_text", attention_chunk_size=8), [Layer("chunked_attention", 8)] * 3),
        # no model_type: the fields read as transformers' cache reads them; moe layers hold no KV
        (dict(layer_types=["sliding_attention", "moe", "full_attention"], sliding_window=4),
         [Layer("sliding_attention", 4), Layer("dummy"), Layer()]),
    ],
    ids=["qwen2 windows", "qwen2 without", "llama4 chunked", "no model_type"],
)  # fmt: skip
def test_layer_types_come_from_transformers_own_reading_of_the_config(config, expected):
    base = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    assert list(shape_from_config({**base, **config}).layers) == expected


def test_layers_without_kv_are_left_out_and_unknown_types_are_one_line():
    base = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    shape = shape_from_config(
        {**base, "layer_types": ["sliding_attention", "moe", "full_attention"], "sliding_window": 4}
    )
    assert accounting.kv_shape(shape, 1, "float32").windows == (4, None)
    linear = shape_from_config({**base, "layer_types": ["linear_attention", "full_attention", "full_attention"]})
    with pytest.raises(accounting.UnpredictableLayers, match="linear_attention layers; kvpipe predicts"):
        accounting.kv_shape(linear, 1, "float32")


# ---- prediction = measurement, to the byte --------------------------------------------------------


@pytest.mark.slow  # a real job per strategy, for each of ten model shapes
@pytest.mark.parametrize("prompt_tokens,new_tokens", REGIMES)
@pytest.mark.parametrize("model", [GEMMA, MISTRAL], ids=["gemma3-style", "mistral-style"])
def test_every_strategys_prediction_equals_the_bytes_a_real_job_holds(model, prompt_tokens, new_tokens):
    for name, cache in CACHES.items():
        spec = spec_for(*model, *JOB, f"workload.prompt_tokens={prompt_tokens}",
                        f"workload.max_new_tokens={new_tokens}", *cache)  # fmt: skip
        metrics = run_job(spec).metrics
        assert metrics["kv_cache_tokens"] == prompt_tokens + new_tokens - 1, name
        assert predicted(spec, prompt_tokens, new_tokens) == metrics["kv_cache_bytes"], name


def test_a_sliding_layer_counts_its_window_not_the_context():
    # window 16, 2 KV heads x 64, float32: 1,024 bytes a token a layer. 40 + 5 cached tokens:
    # the full layer holds 45, each sliding layer 16 (15 kept and the new one they were cut from).
    spec = spec_for(*GEMMA, *JOB, "workload.prompt_tokens=40", "workload.max_new_tokens=6")
    metrics = run_job(spec).metrics
    assert metrics["kv_cache_bytes"] == (45 + 2 * 16) * 1024
    # the fp16 reference is the same DynamicCache in 16 bits: a float32 cache is exactly half as compact
    assert metrics["kv_cache_bytes_fp16"] == (45 + 2 * 16) * 512
    assert metrics["kv_compression"] == 0.5
    assert metrics["kv_read_bytes_per_step"] == metrics["kv_cache_bytes"]  # a dense cache is read once a step


def test_a_one_token_output_pins_the_whole_prompt_in_sliding_layers():
    spec = spec_for(*MISTRAL, *JOB, "workload.prompt_tokens=40", "workload.max_new_tokens=1")
    assert run_job(spec).metrics["kv_cache_bytes"] == 2 * 40 * 1024  # both layers: the prefill's 40 tokens
    assert accounting.dynamic_layer_tokens(WINDOW, 40, 1) == 40
    assert accounting.dynamic_layer_tokens(WINDOW, 40, 2) == WINDOW


# ---- quantized caches on sliding-window models ---------------------------------------------------


def test_quantized_full_layers_only_by_default_and_every_layer_on_request():
    common = (*GEMMA, *JOB, "workload.prompt_tokens=40", "workload.max_new_tokens=8", "cache=quantized",
              "backend=hqq", "backend.q_group_size=32", "backend.residual_length=4")  # fmt: skip
    full_only, every = run_job(spec_for(*common)), run_job(spec_for(*common, "cache.quantize_sliding=true"))
    assert full_only.params["cache.quantized_layers"] == "1 of 3 (full_attention)"
    assert every.params["cache.quantized_layers"] == "3 of 3 (all)"
    assert full_only.params["model.cache_layers"] == "2 sliding_attention (window 16) + 1 full_attention"
    dense = run_job(spec_for(*common[:-4])).metrics["kv_cache_bytes"]
    assert every.metrics["kv_cache_bytes"] < full_only.metrics["kv_cache_bytes"] < dense


@pytest.mark.slow  # real jobs with their quality pass
def test_quantized_sliding_cache_is_scored_by_quality_like_any_quantized_cache():
    spec = spec_for(*GEMMA, "workload=long_context", "tracking=off", "workload.warmup=0", "workload.repeats=1",
                    "workload.prompt_tokens=40", "workload.max_new_tokens=8", "cache=quantized",
                    "cache.quantize_sliding=true", "backend=hqq", "backend.nbits=2", "backend.q_group_size=32",
                    "backend.residual_length=4")  # fmt: skip
    metrics = run_job(spec).metrics
    assert math.isfinite(metrics["kl_vs_reference"]) and metrics["kl_vs_reference"] > 0  # 2 bits lose something


@pytest.mark.parametrize("backend", ["quanto", "hqq"])
def test_a_quantized_sliding_layer_shows_attention_what_a_dense_sliding_layer_does(backend):
    """Same visible length and mask sizes at every step, and the same values up to rounding (half a
    step of a group's range, which for these normal values stays under 4 / (2**nbits - 1))."""
    from transformers.cache_utils import DynamicSlidingWindowLayer

    from kvpipe.cache import backends

    cls = backends.get(backend)
    nbits = max(cls.nbits_choices)
    options = dict(nbits=nbits, axis_key=0, axis_value=0, q_group_size=16, residual_length=3)
    quantized, dense = cls.sliding_layer_class()(sliding_window=6, **options), DynamicSlidingWindowLayer(6)
    torch.manual_seed(0)
    for tokens in [9] + [1] * 8:
        keys = torch.randn(1, 2, tokens, 16)
        got, want = quantized.update(keys, keys.clone())[0], dense.update(keys, keys.clone())[0]
        assert got.shape == want.shape
        assert quantized.get_mask_sizes(1) == dense.get_mask_sizes(1)
        assert torch.allclose(got, want, atol=4 / (2**nbits - 1))


def test_quantize_sliding_where_the_backend_keeps_no_window_is_one_line():
    with pytest.raises(ConfigError, match=r"cache.quantize_sliding=True .*backend=fp8 .*backend=quanto or backend=hqq"):
        spec_for(*GEMMA, "cache=quantized", "backend=fp8", "cache.quantize_sliding=true")
    assert "cache.quantize_sliding is ignored by cache=dynamic" in spec_for("cache.quantize_sliding=true").warnings


# ---- offloading only the full-attention layers ---------------------------------------------------


@pytest.mark.slow  # real offloaded jobs
def test_offload_only_non_sliding_takes_transformers_defaults_and_is_recorded():
    assert spec_for("cache=offloaded").params()["cache.offload_only_non_sliding"] == "false"
    assert spec_for("cache=offloaded_static").params()["cache.offload_only_non_sliding"] == "true"
    assert spec_for("cache=offloaded_static").strategy.offloading_kwargs() == {
        "offloading": True,
        "offload_only_non_sliding": True,
    }
    assert "cache.offload_only_non_sliding" not in spec_for("cache=static").params()
    # at transformers' default the measurement is the one recorded before the setting existed
    assert spec_for("cache=offloaded", "cache.offload_only_non_sliding=false").measurement_key() == (
        spec_for("cache=offloaded").measurement_key()
    )
    assert spec_for("cache=offloaded", "cache.offload_only_non_sliding=true").measurement_key() != (
        spec_for("cache=offloaded").measurement_key()
    )


def test_plan_counts_what_stays_on_the_device_when_offloading():
    shape = models.read_shape(spec_for(*GEMMA).model)
    kv = accounting.kv_shape(shape, 1, "float32")
    only_full = spec_for(*GEMMA, "cache=offloaded", "cache.offload_only_non_sliding=true").strategy
    every = spec_for(*GEMMA, "cache=offloaded").strategy
    # the sliding layers stay, and the full one (in use) with the next offloaded one: here the same one
    assert only_full.device_kv_shape(kv, "cuda").windows == (WINDOW, WINDOW, None)
    assert every.device_kv_shape(kv, "cuda").windows == (None, WINDOW)  # the two largest of all three
    assert every.device_kv_shape(kv, "cpu") == kv


def test_offloading_nothing_is_refused_before_the_model_loads():
    spec = spec_for(*MISTRAL, "cache=offloaded_static")  # every layer slides; transformers' default keeps them all
    with pytest.raises(
        ConfigError, match=r"cache.offload_only_non_sliding=True is not valid: every layer of this model slides"
    ):
        spec.strategy.check_for_model(models.read_shape(spec.model), 40)
    spec_for(*MISTRAL, "cache=offloaded_static", "cache.offload_only_non_sliding=false").strategy.check_for_model(
        models.read_shape(spec.model), 40
    )


# ---- kvpipe plan -----------------------------------------------------------------------------------


def row(out: str, label: str) -> list[str]:
    line = next(line for line in out.splitlines() if line.startswith(f"│ {label} "))
    return [cell.strip() for cell in line.strip("│").split("│")]


def test_plan_says_what_grows_what_the_windows_cost_and_the_true_largest_context(capsys):
    # tiny_sliding, float32: a token costs 1,024 bytes a layer; past the windows only the full layer
    # grows, and the two windows cost 2 x 16 x 1,024 = 32 KiB. The budget leaves 1,000 tokens of the
    # full layer beside the windows: a context of 1,000 + 1 tokens (32 new, the last never cached).
    weight = plan.weights(spec_for(*GEMMA).model, "float32").bytes
    budget = weight + 2 * WINDOW * 1024 + 1000 * 1024
    code = cli.subcommand(["plan", *GEMMA, "--memory-budget", str(budget), "--context", "100,1000", "--device", "cpu"])
    out = capsys.readouterr().out
    assert code == 0
    assert "layers: 2 sliding_attention (window 16) + 1 full_attention" in out
    assert row(out, "dynamic")[:5] == ["dynamic", "1,024", "32.0 KiB", "131.0 KiB", "1.0 MiB"]
    assert row(out, "dynamic")[-1] == "1,001"
    assert row(out, "quanto int4 kivi +sliding")[-1] != "none"
    assert "QuantizedCache refuses sliding-window layers; kvpipe quantizes the full-attention layers" in out


def test_measurement_keys_of_runs_recorded_before_these_settings_are_unchanged():
    # keys the code computed before layer types, quantize_sliding, offload_only_non_sliding and model=hf
    # names existed: resume=true still finds those runs
    before = {
        ("cache=offloaded",): "0987171cb0b01a8c",
        ("cache=offloaded_static",): "4fa2fe1d137d14c6",
        ("cache=quantized",): "2d85a815ac07e63c",
        ("model=tiny_random", "model.sliding_window=8"): "11b8d31f0a92981d",
        ("model=hf", "model.name_or_path=tests/data/tiny_llama"): "00f8e53541f9ae8d",
    }
    for overrides, key in before.items():
        assert spec_for(*overrides).measurement_key() == key, overrides


@pytest.mark.parametrize(
    "overrides,field",
    [
        (("model.layer_types=[sliding_attention,full_attention,full_attention]",), "model.layer_types"),
        (("model.layer_types=[sliding_attention,global]",), "model.layer_types[1]"),
        (("model.layer_types=[sliding_attention,full_attention]", "model.sliding_window=null"), "model.sliding_window"),
    ],
    ids=["count", "unknown type", "no window"],
)
def test_a_random_models_layer_types_are_checked_in_one_line(overrides, field):
    with pytest.raises(ConfigError) as raised:
        spec_for("model=tiny_random", "model.sliding_window=8", *overrides)
    message = str(raised.value)
    assert message.startswith(field) and "expected" in message and "\n" not in message


def test_plan_on_gemma_3s_shape_predicts_what_the_issue_measured(tmp_path, capsys):
    # Gemma 3 270M's shape (config.json alone): 18 layers, 15 sliding with window 512 and 3 full, 1 KV
    # head x 256. A real run at a 1,216-token context held 23,193,600 bytes (float32): 3 full layers x
    # 1,215 tokens + 15 windows x 512 tokens, 2,048 bytes each; a dense count said 44,789,760.
    import json

    pattern = ["sliding_attention"] * 5 + ["full_attention"]
    config = dict(model_type="gemma3_text", hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                  num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=512,
                  max_position_embeddings=32768, vocab_size=262144, layer_types=pattern * 3)  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = spec_for("model=hf", f"model.name_or_path={tmp_path}", "model.dtype=float32")
    assert predicted(spec, 1216 - 32, 32) == 23_193_600
    code = cli.subcommand(["plan", "model=hf", f"model.name_or_path={tmp_path}", "--context", "1216",
                           "--memory-budget", "1.5GiB", "--device", "cuda"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert row(out, "dynamic")[1:3] == ["3,072", "7.5 MiB"]  # bfloat16: 3 full layers grow, 15 windows are fixed
    assert row(out, "dynamic")[-1] == "32,768 (model max)"
