"""cache=paged: transformers' continuous batching as a strategy. Its greedy outputs are generate()'s,
request by request; the pool it allocates is the bytes kvpipe predicts, exactly; each bad setting is
one line naming its field; it runs only under a load; and `kvpipe plan` shows its row."""

from __future__ import annotations

import math

import pytest

from kvpipe import cache, cli
from kvpipe.cache.accounting import kv_shape
from kvpipe.cache.paged import Paged
from kvpipe.cache.paged_pool import PoolLayout
from kvpipe.errors import ConfigError
from kvpipe.model import load, read_shape
from kvpipe.model.shape import Layer, ModelShape

from conftest import TINY, spec_for

PAGED = (*TINY, "cache=paged", "load=offline")
PROMPTS = (3, 17, 40, 70)  # tokens: within one page, across pages, a prompt longer than the sliding window
NEW_TOKENS = 6


def paged_spec(*overrides: str):
    return spec_for(*PAGED, *overrides)


def prompts(vocab: int = 49152) -> list[list[int]]:
    import torch

    generator = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in PROMPTS]


def serve(strategy: Paged, loaded, requests: list[list[int]]):
    """Every request through a started manager: {request_id: output}, the most bytes held at once
    (read by the manager's own thread before each release, not polled), and the pool's bytes."""
    manager = strategy.start_manager(loaded, max(map(len, requests)), NEW_TOKENS, len(requests))
    try:
        pool = strategy.pool_bytes(manager)
        for number, request in enumerate(requests):
            manager.add_request(request, request_id=f"r{number}", max_new_tokens=NEW_TOKENS, record_timestamps=True)
        results = {}
        while len(results) < len(requests):
            result = manager.get_result(timeout=60)  # a guard against a hang: every answer comes well before
            assert result is not None and result.error is None, result
            results[result.request_id] = result
        assert strategy.blocks_in_use(manager) == strategy.held_bytes(manager) == 0  # all finished: none held
        _, peak = strategy.peak_held(manager)
    finally:
        strategy.stop_manager(manager)
    return results, peak, pool


def generated(loaded, request: list[int]) -> list[int]:
    """generate()'s greedy tokens for one request, with a DynamicCache and no EOS: exactly NEW_TOKENS."""
    import torch
    from transformers import DynamicCache

    with torch.inference_mode():
        output = loaded.model.generate(
            input_ids=torch.tensor([request]),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            eos_token_id=-1,
            pad_token_id=loaded.tokenizer.pad_token_id,
            cache=DynamicCache(config=loaded.model.config),
        )
    return output[0, len(request) :].tolist()


@pytest.mark.parametrize(
    "overrides",
    [
        ("model=tiny_random", "cache.block_size=16"),
        ("model=tiny_random", "model.attn_implementation=eager", "cache.max_batch_tokens=16"),  # chunked prefills
        ("model=tiny_sliding", "cache.block_size=8", "cache.allow_block_sharing=false"),
    ],
)
def test_greedy_outputs_equal_generate_request_by_request_and_the_model_is_left_as_it_was(overrides):
    spec = paged_spec(*overrides)
    loaded = load(spec.model)
    attention = loaded.model.config._attn_implementation
    requests = prompts()
    results, peak, _ = serve(spec.strategy, loaded, requests)
    assert loaded.model.config._attn_implementation == attention  # eager ran as paged|eager, and is back
    for number, request in enumerate(requests):
        assert list(results[f"r{number}"].generated_tokens) == generated(loaded, request), number
    # at its last step the longest request held every page plan counts for it, however fast it ran; all of
    # them at once hold at most the sum of their own
    kv = kv_shape(loaded.shape, 1, loaded.dtype)
    each = [spec.strategy.predict_kv_bytes(kv, tokens, NEW_TOKENS) for tokens in PROMPTS]
    assert max(each) <= peak <= sum(each)


@pytest.mark.parametrize("model", ["tiny_random", "tiny_sliding"])
@pytest.mark.parametrize("num_blocks", [3, 10])
def test_the_pool_a_started_manager_holds_is_the_predicted_bytes(model, num_blocks):
    spec = paged_spec(f"model={model}", "cache.block_size=16", f"cache.num_blocks={num_blocks}")
    loaded = load(spec.model)
    strategy = spec.strategy
    manager = strategy.start_manager(loaded, 20, NEW_TOKENS, 1)
    try:
        measured, block = strategy.pool_bytes(manager), strategy.block_bytes(manager)
    finally:
        strategy.stop_manager(manager)
    kv = kv_shape(loaded.shape, 1, loaded.dtype)
    assert measured == strategy.predict_kv_bytes(kv, 20, NEW_TOKENS) == strategy.predict_kv_bytes(kv, 500, 1)
    assert block == PoolLayout.of(kv, 16).block_bytes == loaded.shape.num_layers * 2 * 2 * 64 * 4 * 16


def test_blocks_in_use_counts_the_pages_a_request_in_flight_holds():
    spec = paged_spec("model=tiny_random", "cache.block_size=16", "cache.num_blocks=20")
    loaded = load(spec.model)
    strategy = spec.strategy
    manager = strategy.start_manager(loaded, 40, 30, 1)
    try:
        manager.add_request(prompts()[2], request_id="long", max_new_tokens=30, streaming=True)
        assert manager.get_result(timeout=30) is not None  # its first token: prefilled, decoding
        with manager.pause():
            held = strategy.blocks_in_use(manager)
            assert held * strategy.block_bytes(manager) == strategy.held_bytes(manager)
    finally:
        strategy.stop_manager(manager, hard=True)
    assert math.ceil(40 / 16) <= held <= math.ceil((40 + 30 - 1) / 16)


def test_without_num_blocks_a_prediction_is_the_pages_one_request_holds():
    spec = paged_spec("model=tiny_sliding", "cache.block_size=8")
    kv = kv_shape(read_shape(spec.model), 2, "float32")  # window 16: two sliding layers, one full
    page = 8 * 2 * 2 * 64 * 4 * 2  # eight tokens of one layer's keys and values, for a batch of two
    # 40 + 6 - 1 = 45 cached tokens: 6 pages of the full layer, 2 pages (the window) of each sliding one
    assert spec.strategy.predict_kv_bytes(kv, 40, 6) == (6 + 2 * 2) * page
    assert spec.strategy.window_bytes(kv) == 2 * 2 * page
    assert spec.strategy.bytes_per_token(kv) == kv.token_bytes()  # one full-attention layer grows
    # a decode step gathers each layer's attended tokens (45, and 16 for each sliding layer), copies and reads them
    assert spec.strategy.decode_kv_traffic_bytes(kv, 0, 40, 6, "cpu") == 3 * (45 + 16 + 16) * kv.token_bytes()


@pytest.mark.parametrize(
    "setting, message",
    [
        ("cache.block_size=0", "cache.block_size=0 is not valid: expected a power of two, at least 4"),
        ("cache.block_size=24", "cache.block_size=24 is not valid: expected a power of two, at least 4"),
        ("cache.num_blocks=0", "cache.num_blocks=0 is not valid: expected a positive integer"),
        ("cache.max_memory_percent=1.5", "cache.max_memory_percent=1.5 is not valid: expected a share in (0, 1]"),
        ("cache.max_batch_tokens=0", "cache.max_batch_tokens=0 is not valid: expected a positive integer"),
    ],
)
def test_each_bad_setting_is_one_line_naming_its_field(setting, message):
    with pytest.raises(ConfigError) as refused:
        paged_spec(setting)
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_a_pool_too_small_for_one_request_names_the_blocks_it_needs():
    shape = read_shape(paged_spec("model=tiny_random").model)
    # 70 + 6 - 1 = 75 cached tokens: 5 pages of 16
    with pytest.raises(ConfigError) as refused:
        paged_spec("cache.block_size=16", "cache.num_blocks=4").strategy.check_for_model(shape, 70)
    assert str(refused.value) == (
        "cache.num_blocks=4 is not valid: one request of the longest prompt + workload.max_new_tokens = 70 + 6 "
        "tokens needs 5 blocks of 16 tokens; expected at least 5"
    )
    paged_spec("cache.block_size=16", "cache.num_blocks=5").strategy.check_for_model(shape, 70)
    # sliding layers hold their window at most: 5 full pages, 2 sliding pages (window 16) for each of two layers
    sliding = read_shape(paged_spec("model=tiny_sliding").model)
    with pytest.raises(ConfigError, match=r"^cache.num_blocks=2 .*needs 3 blocks of 16 tokens"):
        paged_spec("model=tiny_sliding", "cache.block_size=16", "cache.num_blocks=2").strategy.check_for_model(
            sliding, 70
        )
    paged_spec("model=tiny_sliding", "cache.block_size=16", "cache.num_blocks=3").strategy.check_for_model(sliding, 70)


def test_layers_the_paged_cache_has_no_allocator_for_are_refused():
    shape = ModelShape(2, 4, 2, 64, 4096, layers=(Layer("chunked_attention", 8), Layer()))
    with pytest.raises(ConfigError, match=r"^cache.strategy='paged' .*chunked_attention layers"):
        paged_spec().strategy.check_for_model(shape, 10)


def test_attention_it_can_page():
    assert Paged.attention_refusal("sdpa") is None and Paged.attention_refusal("eager") is None
    assert "expected model.attn_implementation=sdpa or eager" in Paged.attention_refusal("flex_attention")


def test_without_a_load_it_refuses_in_one_line():
    with pytest.raises(ConfigError) as refused:
        paged_spec().strategy.build(None, 10)
    assert str(refused.value) == (
        "cache.strategy='paged' is not valid: cache=paged serves many requests at once by continuous batching; "
        "choose how they arrive: load=offline, load=concurrency or load=rate"
    )
    with pytest.raises(ConfigError, match=r"^cache.strategy='paged' .*choose how they arrive"):
        spec_for(*TINY, "cache=paged")


def test_it_is_registered_after_the_others_and_plan_shows_its_row(capsys):
    assert cache.get("paged") is Paged and cache.names()[-1] == "paged"
    assert Paged.family == "paged" in cache.FAMILIES and Paged.continuous and Paged.lossless
    assert not any(strategy.continuous for strategy in cache.registered() if strategy is not Paged)
    assert Paged.search_points(64, (), ()) == []  # advise searches one-batch jobs
    assert cli.subcommand(["plan", "model=tiny_random", "--context", "100", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    rows = [line.split("│")[1].strip() for line in out.splitlines() if line.count("│") > 2]
    strategies = [row for row in rows if " + " not in row]  # the eviction presses' rows follow every strategy's
    assert strategies[-1] == "paged" and "dynamic" in rows
    assert "paged counts the pages one request holds" in out
