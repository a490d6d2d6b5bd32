"""kvpipe plan: the bytes it predicts are the bytes real caches and checkpoints hold."""

from __future__ import annotations

import itertools
import subprocess
import sys
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from kvpipe import cli
from kvpipe import model as models
from kvpipe.cache import accounting
from kvpipe.cache.backends import grouped, hqq
from kvpipe.job.runner import run_job
from kvpipe.model import weights
from kvpipe.model.shape import shape_from_model_config
from kvpipe.predict import bytes_plan as plan
from kvpipe.units import parse_bytes

from conftest import REPO, spec_for

JOB = ("model=tiny_random", "workload=long_context", "tracking=off", "quality=off", "workload.warmup=0")
TINY_LLAMA = REPO / "tests" / "data" / "tiny_llama"


def predicted(spec, prompt_tokens: int, new_tokens: int) -> int:
    shape = models.read_shape(spec.model)
    kv = accounting.kv_shape(shape, spec.workload.batch_size, spec.model.dtype)
    return plan.predict_kv_bytes(spec, kv, prompt_tokens, new_tokens)


def job_spec(prompt_tokens: int, new_tokens: int, *overrides: str):
    return spec_for(
        *JOB, f"workload.prompt_tokens={prompt_tokens}", f"workload.max_new_tokens={new_tokens}", *overrides
    )


# ---- dense caches: real generation jobs ---------------------------------------------------------


@pytest.mark.slow  # a real job per case
@pytest.mark.parametrize("prompt_tokens,new_tokens,batch", [(37, 5, 1), (64, 3, 1), (41, 6, 2)])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_dense_prediction_equals_measured_cache_bytes(cache, prompt_tokens, new_tokens, batch):
    spec = job_spec(prompt_tokens, new_tokens, f"cache={cache}", f"workload.batch_size={batch}")
    metrics = run_job(spec).metrics
    assert metrics["kv_cache_tokens"] == prompt_tokens + new_tokens - 1
    assert predicted(spec, prompt_tokens, new_tokens) == metrics["kv_cache_bytes"]


def test_static_prediction_is_the_whole_max_cache_len_allocation():
    spec = job_spec(30, 4, "cache=static", "cache.max_cache_len=100")
    assert predicted(spec, 30, 4) == run_job(spec).metrics["kv_cache_bytes"] == 2 * 2 * 2 * 64 * 100 * 4


# ---- quantized caches: real generation jobs, then every layout at the layer level ----------------


@pytest.mark.slow  # a real job per case
@pytest.mark.parametrize(
    "prompt_tokens,new_tokens,overrides",
    [
        (
            37,
            12,
            ("backend=quanto", "backend.nbits=4", "axis=kivi", "backend.residual_length=4", "backend.q_group_size=32"),
        ),
        (
            50,
            6,
            (
                "backend=quanto",
                "backend.nbits=2",
                "axis=per_channel",
                "backend.residual_length=8",
                "workload.batch_size=2",
            ),
        ),
        (33, 10, ("backend=hqq", "backend.nbits=4", "axis=per_token", "backend.residual_length=0")),
        (
            41,
            9,
            ("backend=hqq", "backend.nbits=2", "axis=kivi", "backend.residual_length=3", "backend.q_group_size=16"),
        ),
        (29, 7, ("backend=hqq", "backend.nbits=3", "axis=per_channel", "backend.residual_length=128")),
        (45, 5, ("backend=fp8",)),
    ],
    ids=lambda value: value if isinstance(value, int) else ",".join(value),
)
def test_quantized_prediction_equals_measured_cache_bytes_of_a_real_job(prompt_tokens, new_tokens, overrides):
    spec = job_spec(prompt_tokens, new_tokens, "cache=quantized", *overrides)
    assert predicted(spec, prompt_tokens, new_tokens) == run_job(spec).metrics["kv_cache_bytes"]


def drive(spec, prompt_tokens: int, new_tokens: int, dtype: torch.dtype):
    """Feed a kvpipe-built cache as generate() does: the prompt, then one token per step but the last."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(**models.random_config_dict(spec.model))
    loaded = SimpleNamespace(
        model=SimpleNamespace(config=config, dtype=dtype),
        shape=shape_from_model_config(config),
        dtype=str(dtype).removeprefix("torch."),
        device="cpu",
    )
    cache = spec.strategy.setup(loaded, prompt_tokens).make_cache()
    shape = models.read_shape(spec.model)
    for tokens in [prompt_tokens] + [1] * (new_tokens - 1):
        for layer in range(shape.num_layers):
            keys = torch.randn(spec.workload.batch_size, shape.num_kv_heads, tokens, shape.head_dim, dtype=dtype)
            cache.update(keys, torch.randn_like(keys), layer)
    return cache


BITS = [("quanto", 4), ("quanto", 2), ("hqq", 4), ("hqq", 2), ("hqq", 3)]
# (prompt, new, residual_length): no decode step; two flushes and a residual left over; a flush on
# every step (residual_length 0 and 1 alike); a single-token prompt
SCHEDULES = [(1, 1, 128), (37, 12, 4), (64, 4, 0), (1, 9, 5)]
# (dtype, batch, kv_heads, head_dim, group): float32 and bfloat16 scales, batch rows, odd head counts, and
# one group per token row (an odd row count for quanto's per-token packing, rounded up to whole bytes)
SHAPES = [("float32", 1, 2, 64, 64), ("bfloat16", 2, 3, 32, 16), ("float32", 1, 1, 64, 64)]


@pytest.fixture(scope="module")
def base_specs():
    return {
        dims: spec_for(
            "model=tiny_random",
            "cache=quantized",
            f"model.dtype={dims[0]}",
            f"workload.batch_size={dims[1]}",
            f"model.num_key_value_heads={dims[2]}",
            f"model.num_attention_heads={dims[2] * 2}",
            f"model.hidden_size={dims[2] * 32}",
            f"model.head_dim={dims[3]}",
        )
        for dims in SHAPES
    }


@pytest.mark.slow  # fills a quantized cache per case
@pytest.mark.parametrize("backend,nbits", BITS)
@pytest.mark.parametrize("layout", ["per_token", "per_channel", "kivi"])
def test_quantized_prediction_equals_cache_bytes_for_every_layout_and_schedule(base_specs, backend, nbits, layout):
    for (prompt, new, residual), dims in zip(SCHEDULES, itertools.cycle(SHAPES)):
        base = base_specs[dims]
        spec = replace(
            base,
            backend=replace(base.backend, name=backend, nbits=nbits, q_group_size=dims[4], residual_length=residual),
            axis=replace(base.axis, layout=layout),
        )
        cache = drive(spec, prompt, new, getattr(torch, dims[0]))
        assert predicted(spec, prompt, new) == accounting.kv_cache_bytes(cache), (prompt, new, residual, dims)


@pytest.mark.parametrize("nbits", [1, 8])
def test_hqq_one_and_eight_bit_predictions_equal_cache_bytes(base_specs, nbits):
    base = base_specs[SHAPES[1]]
    spec = replace(base, backend=replace(base.backend, name="hqq", nbits=nbits, q_group_size=16, residual_length=4))
    assert predicted(spec, 37, 12) == accounting.kv_cache_bytes(drive(spec, 37, 12, torch.bfloat16))


def test_flush_schedule_follows_quantized_layer_update():
    # residual_length=4: steps 1-3 accumulate, step 4 re-quantizes everything, 5-7 accumulate again
    assert [grouped.flush_schedule(10, new, 4) for new in (1, 2, 4, 5, 8)] == [
        (10, 0),
        (10, 1),
        (10, 3),
        (14, 0),
        (14, 3),
    ]
    assert grouped.flush_schedule(10, 6, 0) == grouped.flush_schedule(10, 6, 1) == (15, 0)


def test_hqq_token_padding_matches_quant_layers():
    from kvpipe.cache.backends import _layers

    assert hqq.HQQ.token_multiple == _layers.HQQ_TOKEN_MULTIPLE


# ---- weights, sizes, the largest context --------------------------------------------------------


def test_weights_counted_from_a_random_config_equal_the_built_models_parameters():
    spec = spec_for("model=tiny_random")
    parameters = models.load(spec.model).model.parameters()
    assert weights.weights(spec.model, "float32").bytes == sum(p.numel() * p.element_size() for p in parameters)


def test_llama_estimate_counts_a_tied_config_as_transformers_builds_it():
    import json

    from transformers import AutoConfig, AutoModelForCausalLM

    config = json.loads((TINY_LLAMA / "config.json").read_text())
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY_LLAMA))
    assert weights.llama_parameters(config) == sum(p.numel() for p in model.parameters())


def test_safetensors_headers_give_bytes_cast_to_the_target_dtype(tmp_path):
    from safetensors.torch import save_file

    save_file(
        {"w": torch.zeros(3, 5, dtype=torch.bfloat16), "ids": torch.zeros(7, dtype=torch.int64)},
        str(tmp_path / "model.safetensors"),
    )
    files = weights.safetensors_files(tmp_path)
    assert weights.safetensors_bytes(files, 4) == 15 * 4 + 7 * 8  # floats cast, integers kept
    assert weights.safetensors_bytes(files, 2) == 15 * 2 + 7 * 8


@pytest.mark.parametrize(
    "text,expected",
    [("24GiB", 24 * 2**30), ("512MiB", 512 * 2**20), ("8GB", 8 * 10**9), ("1e9", 10**9), ("1.5 KiB", 1536)],
)
def test_sizes_parse_with_binary_and_decimal_units(text, expected):
    assert parse_bytes(text) == expected


def test_largest_context_is_exact_at_the_boundary_and_capped_at_max_positions():
    kv = accounting.KvShape(windows=(None, None), kv_heads=2, head_dim=64, batch_size=1, dtype_bytes=4)
    at = lambda context: accounting.dense_bytes(kv, context - 1)  # noqa: E731
    assert plan.largest_context(at, at(1000), 4096) == 1000
    assert plan.largest_context(at, at(1000) - 1, 4096) == 999
    assert plan.largest_context(at, 10**12, 4096) == 4096
    assert plan.largest_context(at, 0, 4096) == 0


# ---- the command line ---------------------------------------------------------------------------


def row(out: str, label: str) -> list[str]:
    line = next(line for line in out.splitlines() if line.startswith(f"│ {label} "))
    return [cell.strip() for cell in line.strip("│").split("│")]


def test_plan_prints_every_strategy_and_the_largest_fitting_context(capsys):
    # tiny_llama is config-only: 12,879,104 estimated weight bytes (float32); its dense cache costs
    # 2 x 2 layers x 2 KV heads x 16 x 4 bytes = 512 bytes a token, so the budget leaves room for
    # 999 held tokens: a context of 1,000 for dynamic, 999 for static (which allocates the whole context).
    budget = 12_879_104 + 999 * 512
    code = cli.subcommand(
        [
            "plan",
            "model=hf",
            f"model.name_or_path={TINY_LLAMA}",
            "backend.q_group_size=16",
            "--memory-budget",
            str(budget),
            "--context",
            "100,1000",
            "--device",
            "cpu",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "ESTIMATED" in out and "12,879,104 bytes" in out
    assert row(out, "dynamic") == ["dynamic", "512", "49.5 KiB", "499.5 KiB", "1,000"]
    assert row(out, "static")[-1] == "999"
    for label in ("offloaded_static", "quanto int4 kivi", "quanto int2 kivi", "hqq int4 kivi", "hqq int2 kivi"):
        assert row(out, label)[-1] != "none"
    assert row(out, "fp8")[1] == "128"


def test_plan_says_when_the_budget_is_smaller_than_the_weights(capsys):
    assert cli.subcommand(["plan", "model=hf", f"model.name_or_path={TINY_LLAMA}", "--memory-budget", "1MiB"]) == 0
    out = capsys.readouterr().out
    assert "less than the weights alone: no context fits" in out
    assert "none" in out


def test_bad_size_is_one_line_and_a_nonzero_exit(capsys):
    assert cli.subcommand(["plan", "model=tiny_random", "--memory-budget", "lots"]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0
    assert "--memory-budget='lots'" in err and "8GiB" in err


@pytest.mark.slow  # starts kvpipe processes
def test_plan_runs_from_the_command_line_in_any_directory(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvpipe",
            "plan",
            "model=hf",
            f"model.name_or_path={TINY_LLAMA}",
            "--memory-budget",
            "8GB",
            "--device",
            "cuda",
        ],
        cwd=tmp_path,
        text=True,
        capture_output=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "bfloat16" in result.stdout and "fits up to" in result.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "kvpipe", "plan", "--memory-budget", "12 parsecs"],
        cwd=tmp_path,
        text=True,
        capture_output=True,
        timeout=120,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


# ---- the context-scaling preset -----------------------------------------------------------------


def test_context_scaling_preset_composes_and_every_point_fits_the_embedded_model():
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from kvpipe.jobspec import register_schemas

    register_schemas()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module="kvpipe.conf", version_base="1.3"):
            cfg = compose(config_name="config", overrides=["+experiment=context_scaling"], return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()
    params = cfg.hydra.sweeper.params
    assert params["cache"] == "dynamic,static,quantized"
    longest = max(int(tokens) for tokens in str(params["workload.prompt_tokens"]).split(","))
    spec = spec_for("+experiment=context_scaling", f"workload.prompt_tokens={longest}")
    assert spec.workload.kind == "long_context" and not spec.quality.enabled
    assert longest + spec.workload.max_new_tokens <= 8192  # the embedded model's positions


# ---- the embedded model -------------------------------------------------------------------------


@pytest.mark.slow  # the embedded model: three jobs per context length
@pytest.mark.parametrize("prompt_tokens", [256, 512])  # both past the residual (128); 1,024 took 20 s more
def test_predictions_equal_measured_bytes_of_context_scaling_jobs_on_the_embedded_model(prompt_tokens, embedded_model):
    # The context_scaling preset's own jobs (its workload, new tokens, strategies), at two of its lengths
    common = (
        "+experiment=context_scaling",
        "model=smollm2_135m",
        f"workload.prompt_tokens={prompt_tokens}",
        "tracking=off",
        "workload.warmup=0",  # bytes do not depend on how often a call is timed
        "workload.repeats=1",
    )
    for cache in (("cache=dynamic",), ("cache=static",), ("cache=quantized", "axis=kivi", "backend.nbits=4")):
        spec = spec_for(*common, *cache)
        new_tokens = spec.workload.max_new_tokens
        metrics = run_job(spec).metrics
        kv = accounting.kv_shape(models.read_shape(spec.model), 1, models.load(spec.model).dtype)
        assert plan.predict_kv_bytes(spec, kv, prompt_tokens, new_tokens) == metrics["kv_cache_bytes"], cache
    # weights from the safetensors headers alone = the loaded parameters (buffers such as RoPE's are not weights)
    loaded = models.load(spec.model)
    parameters = {p.data_ptr(): p for p in loaded.model.parameters()}.values()
    assert weights.weights(spec.model, loaded.dtype).bytes == sum(p.numel() * p.element_size() for p in parameters)
