"""Quality against the full-precision reference: teacher-forced agreement, KL and perplexity on the
workload's own texts, through the path the run decodes with."""

from __future__ import annotations

import pytest
import torch

from kvpipe import model
from kvpipe.job.runner import run_job
from kvpipe.measure import quality

from conftest import spec_for

TINY = (
    "model=tiny_random",
    "workload=long_context",
    "workload.prompt_tokens=41",
    "workload.max_new_tokens=8",
    "workload.warmup=0",
    "tracking=off",
    "quality=on",
    "quality.windows=2",
    "quality.scored_tokens=32",
)


def test_kl_is_positive_for_a_different_distribution():
    reference = torch.log_softmax(torch.randn(4, 9, generator=torch.Generator().manual_seed(1)), dim=-1)
    other = torch.log_softmax(torch.randn(4, 9, generator=torch.Generator().manual_seed(2)), dim=-1)
    assert quality.window_scores(other, reference, torch.zeros(4, dtype=torch.long))["kl_vs_reference"] > 0.01


def test_long_context_quality_scores_windows_of_the_workloads_own_text_at_its_prompt_length():
    spec = spec_for(*TINY)
    tokenizer = model.load_tokenizer(spec.model)
    windows = spec.bound_workload.windows(tokenizer, 3, 32)
    assert (
        len(windows) == 3
        and {len(w.prefix) for w in windows} == {41}
        and {len(w.continuation) for w in windows} == {32}
    )
    assert len({tuple(w.prefix) for w in windows}) == 3  # three different texts
    first_prompt = spec.bound_workload.batches(tokenizer, "cpu")[0].input_ids[0].tolist()
    assert windows[0].prefix == first_prompt  # the workload's own prompt


@pytest.mark.slow  # a real job with its quality pass
def test_chat_quality_scores_the_workloads_prompts_continued_by_the_reference():
    spec = spec_for("model=tiny_random", "tracking=off", "quality.windows=3", "quality.scored_tokens=8")
    windows = spec.bound_workload.windows(model.load_tokenizer(spec.model), 3, 8)
    assert len(windows) == 3 and all(w.continuation is None for w in windows)
    metrics = run_job(spec_for("model=tiny_random", "tracking=off", "workload.warmup=0", "workload.repeats=1",
                               "workload.max_new_tokens=3", "quality.windows=3", "quality.scored_tokens=8")).metrics  # fmt: skip
    assert metrics["quality_windows"] == 3 and metrics["quality_scored_tokens"] == 8


def test_by_default_more_tokens_are_scored_than_a_quantized_cache_keeps_unquantized():
    spec = spec_for("cache=quantized", "backend.residual_length=200")
    assert quality.scored_tokens(spec) > 200
    assert quality.scored_tokens(spec_for()) > spec_for().backend.residual_length
    assert quality.scored_tokens(spec_for("quality.scored_tokens=10")) == 10


def test_a_compiled_cache_is_scored_through_its_compiled_decode_call(monkeypatch):
    from transformers import CompileConfig

    spec = spec_for(*TINY, "cache=static")
    loaded = model.load(spec.model)
    setup = spec.strategy.setup(loaded, 41)
    setup.generate_kwargs = {"compile_config": CompileConfig()}
    steps = []

    def compiled_call(config):
        assert config is setup.generate_kwargs["compile_config"]
        return lambda **kwargs: steps.append(kwargs["input_ids"].shape[0]) or loaded.model(**kwargs)

    monkeypatch.setattr(loaded.model, "get_compiled_call", compiled_call)
    batches = spec.bound_workload.batches(loaded.tokenizer, "cpu")
    metrics = quality.measure(loaded, spec, spec.bound_workload, batches, [torch.zeros(1, 8, dtype=torch.long)], setup)
    # every single-token step of both windows (one prefix length: stepped together, unpadded); prefill is
    # eager, as in generate
    assert steps == [2] * (32 - 1)
    assert metrics["kl_vs_reference"] < 1e-6


@pytest.mark.slow  # real jobs with their quality pass
@pytest.mark.parametrize("strategy", ["dynamic", "static", "offloaded", "offloaded_static"])
def test_lossless_strategies_agree_fully_with_kl_near_zero(strategy):
    metrics = run_job(spec_for(*TINY, f"cache={strategy}")).metrics
    assert metrics["token_agreement"] == 1.0
    assert metrics["first_divergence"] == -1
    assert metrics["kl_vs_reference"] < 1e-6


def test_int2_quantized_cache_loses_quality_on_tiny_random():
    metrics = run_job(
        spec_for(
            *TINY,
            "cache=quantized",
            "backend.nbits=2",
            "backend.q_group_size=32",
            "backend.residual_length=0",
            "axis=per_token",
        )
    ).metrics
    assert metrics["kl_vs_reference"] > 1e-4


def test_references_are_made_once_per_model_and_workload(monkeypatch):
    run_job(spec_for(*TINY))  # makes (or reuses) the references
    made = []
    original = quality.teacher_forced_rows
    monkeypatch.setattr(quality, "teacher_forced_rows", lambda *a, **k: made.append(len(a[2])) or original(*a, **k))
    run_job(spec_for(*TINY, "cache=static"))
    assert made == [2]  # the job's own pass over its 2 windows, together; the references came from the process cache


# A short prompt and quality window (the default is 512 tokens, 64 scored): on the embedded model int2's KL is
# still tens of times int4's (~0.25 vs ~0.007 nats over these 16 tokens), and its perplexity clearly higher.
EMBEDDED = (
    "workload.max_new_tokens=4",
    "workload.warmup=0",
    "workload.repeats=1",  # the quality pass is what this compares, not timings
    "tracking=off",
    "quality=on",
    "quality.windows=1",
    "quality.scored_tokens=16",
    "workload.prompts=[Explain what a KV cache is in two sentences.]",
)


@pytest.mark.slow  # the embedded model, quantized through quanto
def test_quanto_int2_is_measurably_worse_than_int4_on_the_embedded_model(embedded_model):
    int4 = run_job(spec_for(*EMBEDDED, "cache=quantized", "backend=quanto", "backend.nbits=4")).metrics
    int2 = run_job(spec_for(*EMBEDDED, "cache=quantized", "backend=quanto", "backend.nbits=2")).metrics
    assert int2["kl_vs_reference"] > 2 * int4["kl_vs_reference"]
    assert int2["ppl"] > int4["ppl"]


def test_a_reference_is_never_shared_by_two_workload_settings():
    """Once, two passkey lengths in one process were both scored on the first one's windows (the same
    perplexity, 25937.386585226046, twice): each setting gets its own reference."""
    scored = ("quality=on", "quality.windows=1", "quality.scored_tokens=8")
    passkey = (*TINY, "workload=passkey", "workload.trials=1", "workload.depths=[0.5]", *scored)
    short, long = (run_job(spec_for(*passkey, f"workload.context_tokens={n}")) for n in (100, 300))
    assert short.metrics["ppl"] != long.metrics["ppl"]
    assert short.metrics["quality_windows"] == long.metrics["quality_windows"] == 1


def test_the_reference_key_is_the_workloads_defining_fields_plus_model_dtype_and_quality():
    from types import SimpleNamespace

    loaded = SimpleNamespace(dtype="float32")
    key = lambda *extra: quality.reference_key(  # noqa: E731
        loaded, s := spec_for(*TINY, "workload=chat", *extra), s.bound_workload, "windows"
    )
    base = key()
    assert key("workload.repeats=7") == base  # how often calls are timed: not what is scored
    assert key("workload.max_new_tokens=9") == base  # the job's own generation: not its windows
    assert key("workload.prompts=[Hi.]") != base
    assert key("quality.windows=3") != base and key("model.seed=1") != base


# ---- windows scored together equal windows scored one at a time -----------------------------------

BATCHING = {
    "dynamic": ("cache=dynamic",),
    "static": ("cache=static",),
    "quanto int4 per_token": ("cache=quantized", "backend=quanto", "axis=per_token", "backend.residual_length=8"),
    "hqq int2 kivi": (
        "cache=quantized",
        "backend=hqq",
        "backend.nbits=2",
        "axis=kivi",
        "backend.residual_length=8",
        "backend.q_group_size=32",
    ),  # fmt: skip
    "quanto int2 kivi": (
        "cache=quantized",
        "backend=quanto",
        "backend.nbits=2",
        "axis=kivi",
        "backend.residual_length=8",
        "backend.q_group_size=32",
    ),  # fmt: skip
    "fp8": ("cache=quantized", "backend=fp8"),
}


@pytest.mark.slow  # scores each cache twice, batched and apart
@pytest.mark.parametrize("workload", ["chat", "long_context"])  # prompts of several lengths, and of one
@pytest.mark.parametrize("cache", sorted(BATCHING))
def test_windows_scored_together_score_as_windows_scored_one_at_a_time(cache, workload):
    spec = spec_for("model=tiny_random", f"workload={workload}", "workload.prompt_tokens=40", "quality.windows=3",
                    "quality.scored_tokens=24", *BATCHING[cache])  # fmt: skip
    loaded = model.load(spec.model)
    setup = spec.strategy.setup(loaded, 200)
    windows = quality._reference_windows(loaded, spec, spec.bound_workload)
    batching = spec.strategy.quality_batching()
    together = quality.scored_rows(loaded, setup.make_cache, windows, batching)
    apart = [
        quality.teacher_forced(loaded, setup.make_cache, prefix, continuation) for prefix, continuation, _ in windows
    ]
    for ours, alone in zip(together, apart):
        assert torch.allclose(ours, alone, atol=1e-4), (cache, workload, batching)
    groups = quality.batches_of(windows, batching)
    if workload == "long_context" and batching != "apart":
        assert groups == [[0, 1, 2]]  # one prefix length: one batch
    if batching == "equal_length":  # per-channel groups span tokens: padding would join them
        assert all(len({len(windows[i][0]) for i in group}) == 1 for group in groups)
    # fp8's one scale per tensor would span the batch; hqq's optimiser stops on the whole tensor's error
    assert (batching == "apart") == (cache in ("fp8", "hqq int2 kivi"))


def test_a_compiled_static_cache_scores_only_unpadded_windows_together():
    assert spec_for("cache=static", "cache.compile=true").strategy.quality_batching(compiled=True) == "equal_length"
    assert spec_for("cache=static").strategy.quality_batching() == "padded"


@pytest.mark.slow  # real jobs with their quality pass
def test_a_plain_dynamic_cache_scores_exactly_as_the_reference_so_it_is_not_scored_twice(monkeypatch):
    spec = spec_for("model=tiny_random", "workload=chat", "quality.windows=3", "quality.scored_tokens=24")
    loaded = model.load(spec.model)
    setup = spec.strategy.setup(loaded, 200)
    assert setup.is_reference and not spec_for("cache=static").strategy.setup(loaded, 200).is_reference
    windows = quality._reference_windows(loaded, spec, spec.bound_workload)
    scored = quality.scored_rows(loaded, setup.make_cache, windows, spec.strategy.quality_batching())
    assert all(torch.equal(ours, reference) for ours, (_, _, reference) in zip(scored, windows))  # bit for bit
    calls = []
    monkeypatch.setattr(quality, "scored_rows", lambda *a, **k: calls.append(1))
    batches = spec.bound_workload.batches(loaded.tokenizer, "cpu")
    generated = quality.reference_tokens(loaded, spec, spec.bound_workload, batches)
    metrics = quality.measure(loaded, spec, spec.bound_workload, batches, generated, setup)
    assert calls == [] and metrics["kl_vs_reference"] == 0 and metrics["token_agreement"] == 1
