"""The measurement core on inputs whose answers are known: a synthetic token stream, a known
allocation, hand-counted bytes, hand-made distributions."""

from __future__ import annotations

import math
import statistics
import time
from types import SimpleNamespace

import pytest
import torch

from kvpipe.cache import get
from kvpipe.cache.accounting import kv_shape
from kvpipe.measure.clock import Timing, TokenClock
from kvpipe.measure.memory import PeakMemory, release_freed_memory
from kvpipe.measure.metrics import repeat_noise, robust_cv, weights_read_per_step
from kvpipe.measure.quality import first_divergence, window_scores
from kvpipe.measure.roofline import roofline_fraction
from kvpipe.model import read_shape

from conftest import spec_for

MIB = 2**20


def test_token_clock_and_timing_follow_a_synthetic_stream_with_known_sleeps():
    """Each figure is the clock's own reading: it lies between perf_counter readings taken just before
    and just after the event it times, and no sleep ends early. How long past its sleep a busy machine
    wakes the stream is the machine's business, not a verdict on the clock."""
    clock = TokenClock(sync_cuda=False)
    began = (time.perf_counter(), clock.begin(), time.perf_counter())
    clock.put("the prompt")  # generate() first puts the prompt: not a token
    time.sleep(0.05)
    tokens = [(time.perf_counter(), clock.put("token 1"), time.perf_counter())]
    for _ in range(3):
        time.sleep(0.02)
        tokens.append((time.perf_counter(), clock.put("token"), time.perf_counter()))
    ended = (time.perf_counter(), clock.end(), time.perf_counter())
    timing = Timing.from_clock(clock)

    def between(first, then) -> tuple[float, float]:  # the shortest and longest span the clock could read, ms
        return (then[0] - first[2]) * 1e3, (then[2] - first[0]) * 1e3

    assert timing.steps == 4
    shortest, longest = between(began, tokens[0])
    assert 50 <= shortest <= timing.ttft_ms <= longest
    assert len(timing.itl_ms) == 3
    for gap, (first, then) in zip(timing.itl_ms, zip(tokens, tokens[1:])):
        shortest, longest = between(first, then)
        assert 20 <= shortest <= gap <= longest
    shortest, longest = between(began, ended)
    assert shortest <= timing.e2e_ms <= longest
    assert timing.tpot_ms == pytest.approx(sum(timing.itl_ms) / 3)
    assert timing.e2e_ms >= timing.ttft_ms + sum(timing.itl_ms)


def test_peak_memory_on_cpu_covers_a_known_allocation_and_counts_what_was_there_before():
    release_freed_memory("cpu")
    with PeakMemory("cpu") as peak:
        block = torch.ones(64 * MIB // 4)  # 64 MiB, every page written
        del block
    assert peak.peak_over_baseline_bytes >= 0.95 * 64 * MIB
    assert peak.peak_bytes >= peak.baseline_bytes + 0.95 * 64 * MIB  # absolute: the process's whole peak
    release_freed_memory("cpu")
    with PeakMemory("cpu") as quiet:
        pass
    assert quiet.peak_over_baseline_bytes < 16 * MIB  # the high-water mark was reset: no earlier peak


def test_roofline_fraction_is_bytes_per_step_times_steps_per_second_over_bandwidth():
    assert roofline_fraction(bytes_per_step=2_000, steps_per_s=10, bandwidth_bytes_per_s=100_000) == 0.2


def test_untied_input_embeddings_count_one_row_per_sequence_and_tied_ones_in_full():
    untied = SimpleNamespace(
        weights_bytes=1_000, input_embedding_bytes=400, embedding_row_bytes=4, embeddings_tied=False
    )
    assert weights_read_per_step(untied, batch_size=2) == 1_000 - 400 + 2 * 4
    tied = SimpleNamespace(**{**untied.__dict__, "embeddings_tied": True})
    assert weights_read_per_step(tied, batch_size=2) == 1_000  # the output head reads the matrix anyway


def test_decode_traffic_counts_what_each_strategy_moves():
    dynamic = spec_for("model=tiny_random").strategy
    quantized = spec_for("model=tiny_random", "cache=quantized").strategy
    offloaded = spec_for("model=tiny_random", "cache=offloaded").strategy
    kv = kv_shape(read_shape(spec_for("model=tiny_random").model), 1, "float32")  # 2 layers, 1,024 B a token
    assert dynamic.decode_kv_traffic_bytes(kv, 100, prompt_tokens=40, new_tokens=11, device="cpu") == 100
    # packed read + dequantized copy written + that copy read by attention: with the default
    # residual_length=128, all 40 + 10 cached tokens are the prompt's quantized ones or the residual
    dequantized = 2 * 50 * kv.token_bytes()
    assert (
        quantized.decode_kv_traffic_bytes(kv, 30, prompt_tokens=40, new_tokens=11, device="cpu") == 30 + 2 * dequantized
    )
    assert offloaded.decode_kv_traffic_bytes(kv, 100, prompt_tokens=40, new_tokens=11, device="cuda") is None
    assert "interconnect" in offloaded.traffic_unknown_reason("cuda")
    assert get("offloaded").offloading and not get("dynamic").offloading


def test_teacher_forced_scores_on_a_hand_made_case():
    reference = torch.log_softmax(torch.tensor([[3.0, 0, 0], [0, 3.0, 0], [0, 0, 3.0], [3.0, 0, 0]]), dim=-1)
    ours = reference.clone()
    ours[3] = torch.log_softmax(torch.tensor([0, 3.0, 0]), dim=-1)  # the last position's top-1 differs
    targets = torch.tensor([0, 1, 2, 0])
    scores = window_scores(ours, reference, targets)
    assert scores["token_agreement"] == 0.75
    assert scores["kl_vs_reference"] > 0
    same = window_scores(reference, reference, targets)
    assert same["token_agreement"] == 1.0 and same["kl_vs_reference"] == pytest.approx(0, abs=1e-7)
    nll = -reference.gather(1, targets[:, None]).mean().item()
    assert same["ppl"] == pytest.approx(math.exp(nll))


def test_first_divergence_is_the_earliest_step_any_sequence_leaves_the_reference():
    reference = [torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])]
    assert first_divergence([reference[0].clone()], reference) == -1
    assert first_divergence([torch.tensor([[1, 2, 3, 9], [5, 6, 0, 8]])], reference) == 2


def test_noise_is_a_robust_typical_spread_between_and_within_calls():
    # two prompts of different lengths, three repeats each: [p0, p1, p0, p1, p0, p1]
    shapes = [(1, 40), (1, 90)] * 3
    steady = {"ttft_ms": [10, 100, 10, 100, 10, 100], "tpot_ms": [5, 50, 5, 50, 5, 50]}
    assert repeat_noise(steady, shapes) == 0  # the prompts differ, but no repeat does
    # one slow call of one prompt (a ~120 ms TTFT reading 110, 115, 160): not a noisy run
    one_slow = {"ttft_ms": [110, 100, 115, 100, 160, 100], "tpot_ms": [5, 50, 5, 50, 5, 50]}
    assert repeat_noise(one_slow, shapes) < 0.10
    # every repeat scattered: noisy
    scattered = {"ttft_ms": [80, 100, 120, 130, 100, 70], "tpot_ms": [4, 40, 5, 55, 6, 45]}
    assert repeat_noise(scattered, shapes) > 0.10
    assert math.isnan(repeat_noise({"ttft_ms": [1, 2], "tpot_ms": [1, 2]}, shapes[:2]))  # one call per shape: unknown
    # passkey: one repeat, but two prompts of each length; they vary only by noise
    lengths = [(1, 500), (1, 500), (1, 1000), (1, 1000)]
    one_repeat = {"ttft_ms": [100, 100, 200, 200], "tpot_ms": [10, 12, 20, 20]}
    assert repeat_noise(one_repeat, lengths) == pytest.approx(statistics.median([0, 1.4826 / 11, 0, 0]))
    # within calls: per-token gaps that agree, and gaps that jump between two speeds
    even, jumpy = [[45, 46, 44, 45, 47]] * 6, [[45, 90, 44, 91, 45, 92]] * 6
    assert repeat_noise(steady, shapes, even) == pytest.approx(1.4826 * 1 / 45)
    assert repeat_noise(steady, shapes, jumpy) > 0.10
    assert robust_cv([10, 10, 10, 1000]) == 0  # one outlier does not carry it


def test_the_bandwidth_probe_outgrows_every_last_level_cache(tmp_path, monkeypatch):
    """Two L3s of 32 MiB, each shared by two cores (each with its own L2), count 64 MiB once each;
    the probe's buffers are twice that. Without sysfs, 256 MiB as before."""
    from kvpipe.measure import roofline

    for cpu in range(4):
        for index, (level, size, shared) in enumerate(
            [(2, "1024K", str(cpu)), (3, "32768K", "0-1" if cpu < 2 else "2-3")]
        ):
            folder = tmp_path / f"cpu{cpu}" / "cache" / f"index{index}"
            folder.mkdir(parents=True)
            for name, value in (("level", level), ("size", size), ("shared_cpu_list", shared)):
                (folder / name).write_text(f"{value}\n")
    assert roofline.last_level_cache_bytes(tmp_path) == 64 * 2**20
    assert roofline.last_level_cache_bytes(tmp_path / "nothing") == 0
    monkeypatch.setattr(roofline, "last_level_cache_bytes", lambda: 64 * 2**20)
    assert roofline.probe_bytes("cpu") == 128 * 2**20
    assert roofline.probe_bytes("cuda") == 256 * 2**20
    monkeypatch.setattr(roofline, "last_level_cache_bytes", lambda: 0)
    assert roofline.probe_bytes("cpu") == 256 * 2**20
    monkeypatch.setattr(roofline, "last_level_cache_bytes", lambda: 4 * 2**20)
    assert roofline.probe_bytes("cpu") == 64 * 2**20


def test_a_timings_interval_holds_its_mean_narrows_with_more_calls_and_repeats_from_the_seed():
    from kvpipe.measure.uncertainty import bootstrap_interval

    few = [50.0, 52.0, 49.0, 55.0, 51.0]
    low, high = bootstrap_interval(few)
    assert low < sum(few) / len(few) < high and min(few) <= low and high <= max(few)
    many_low, many_high = bootstrap_interval(few * 20)
    assert many_high - many_low < (high - low) / 2  # 20x the calls: an interval about sqrt(20) narrower
    assert bootstrap_interval(few) == (low, high)  # from the seed: the same calls, the same interval
    assert all(v != v for v in bootstrap_interval([51.0]))  # one call: no interval (NaN)


def test_a_mean_of_a_few_rounds_gets_an_interval_that_holds_it_as_often_as_it_says():
    import numpy as np

    from kvpipe.measure.uncertainty import BOOTSTRAP_FROM, bootstrap_interval, mean_interval

    draw = np.random.default_rng(5)
    for n in (3, 6):
        held = sum(low <= 10 <= high for low, high in (mean_interval(list(draw.normal(10, 1, n))) for _ in range(400)))
        assert 0.92 <= held / 400 <= 0.98  # Student's t: a percentile bootstrap holds it 74% (3) to 86% (6) of the time
    many = list(draw.normal(10, 1, BOOTSTRAP_FROM))
    assert mean_interval(many) == bootstrap_interval(many)  # many values: the bootstrap, which assumes no shape
    assert all(v != v for v in mean_interval([51.0]))
