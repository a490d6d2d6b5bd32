"""Capacity in `kvpipe plan`: the most requests of one size in flight at once beside the weights, each
checked by hand, and the decode floor at that many."""

from __future__ import annotations

import math

from kvpipe.jobspec import spec_from
from kvpipe.predict import hardware
from kvpipe.predict.bytes_plan import make_plan
from kvpipe.predict.costs import costs_for
from kvpipe.predict.floors import split

from conftest import run_cli

LLAMA_8B = ["model=llama31_8b_instruct"]  # config in the preset: no weights, no network
WEIGHTS = 16_060_522_496  # Llama-3.1-8B in bfloat16, counted from its config
KV_PER_TOKEN = 32 * 8 * 128 * 2 * 2  # layers x KV heads x head_dim x (key, value) x 2 bytes: 128 KiB


def row(plan, label):
    return next(r for r in plan.rows if r.label == label)


def test_the_dense_cache_on_an_h100_fits_what_the_memory_left_by_the_weights_holds():
    spec = spec_from(LLAMA_8B)
    plan = make_plan(spec, hardware_name="h100_sxm", contexts=[1024], request_tokens=1024)
    dynamic = row(plan, "dynamic").capacity
    assert plan.weights.bytes == WEIGHTS and KV_PER_TOKEN == 131_072
    prompt, new = split(1024, spec.workload.max_new_tokens)
    one = costs_for(spec, "cuda", "bfloat16", 1).at(spec.strategy, prompt, new)
    transient = max(one.activation_bytes, one.dequantized_copy_bytes)  # one request's prefill
    per_request = (1024 - 1) * KV_PER_TOKEN  # the cache holds context - 1 tokens
    by_hand = math.floor((80e9 - WEIGHTS - transient) / per_request)
    assert dynamic.requests == by_hand and 470 < by_hand < 480
    assert dynamic.needs_bytes == WEIGHTS + by_hand * per_request + transient <= 80e9


def test_the_decode_floor_at_capacity_reads_the_weights_once_and_every_sequences_cache():
    spec = spec_from(LLAMA_8B)
    plan = make_plan(spec, hardware_name="h100_sxm", contexts=[1024], request_tokens=1024)
    dynamic = row(plan, "dynamic").capacity
    bandwidth = hardware.get("h100_sxm").memory_bandwidth_bytes_per_s
    per_request = (1024 - 1) * KV_PER_TOKEN
    weights_read = costs_for(spec, "cuda", "bfloat16", dynamic.requests).weights_read(dynamic.requests)
    assert weights_read < WEIGHTS  # the input embeddings: a row per sequence, not the whole table
    assert dynamic.tpot_floor_ms == (weights_read + dynamic.requests * per_request) / bandwidth * 1e3


def test_a_smaller_cache_lets_more_requests_in():
    plan = make_plan(spec_from(LLAMA_8B), hardware_name="h100_sxm", contexts=[1024], request_tokens=1024)
    # 1,407 against 476: a quantized request also needs its layer's dequantized copy while a step decodes
    assert row(plan, "quanto int4 kivi").capacity.requests > 2.5 * row(plan, "dynamic").capacity.requests


def test_no_request_fits_when_the_weights_take_the_memory():
    plan = make_plan(spec_from(LLAMA_8B), budget=16 * 10**9, contexts=[1024], request_tokens=1024)
    assert row(plan, "dynamic").capacity.requests == 0


def test_capacity_needs_a_memory_and_a_size_of_two_tokens_or_more(tmp_path):
    said = run_cli(["plan", *LLAMA_8B, "--request-tokens", "1024"], cwd=tmp_path)
    assert said.returncode == 2 and "--request-tokens=1024 is not valid: capacity needs a memory" in said.stderr
    said = run_cli(["plan", *LLAMA_8B, "--hardware", "h100_sxm", "--request-tokens", "1"], cwd=tmp_path)
    assert said.returncode == 2 and "--request-tokens=1 is not valid: expected 2 or more" in said.stderr
    said = run_cli(["plan", *LLAMA_8B, "--hardware", "h100_sxm", "--request-tokens", "1024"], cwd=tmp_path)
    assert said.returncode == 0 and "requests of 1,024" in said.stdout
