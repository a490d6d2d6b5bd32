"""The presses kvpress defines beyond the first three (press=random|tova|observed_attention|
expected_attention|pyramidkv): what each keeps on a prefill through the cache a job builds, its
budgets, and bad settings refused in one line naming the field before the model loads. That each
keeps exactly kvpress's positions is tests/test_kvpress_parity.py's; that `plan` predicts each
one's bytes to the byte is tests/test_presses.py's, which runs every registered press."""

from __future__ import annotations

import pytest
import torch
from test_presses import JOB, assert_each_layer_keeps_its_protected_and_highest_scored, prefill_under

from kvpipe.cache.presses._attention import window_queries
from kvpipe.cache.presses.expected_attention import _mean_rotation
from kvpipe.errors import ConfigError

from conftest import spec_for

TINY = ("model=tiny_random", *JOB, "workload.prompt_tokens=40")


def kept_sets(spec, prompt_tokens: int = 40) -> list[torch.Tensor]:
    return [layer["kept"] for layer in prefill_under(spec, prompt_tokens, batch=1)]


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (("press=random", "press.seed=-1"), "press.seed"),
        (("press=expected_attention", "press.future_positions=0"), "press.future_positions"),
        (("press=expected_attention", "press.sinks=-1"), "press.sinks"),
        (("press=expected_attention", "press.epsilon=-0.1"), "press.epsilon"),
        (("press=pyramidkv", "press.beta=0"), "press.beta"),
        (("press=pyramidkv", "press.window=0"), "press.window"),
        (("press=observed_attention",), "model.attn_implementation"),
    ],
)
def test_a_bad_setting_is_one_line_naming_its_field(overrides, field):
    with pytest.raises(ConfigError) as raised:
        spec_for(*TINY, *overrides)
    assert raised.value.field == field and "\n" not in str(raised.value)


def test_observed_attention_runs_under_eager_attention_only():
    assert "eager" in str(pytest.raises(ConfigError, spec_for, *TINY, "press=observed_attention").value)
    spec = spec_for(*TINY, "press=observed_attention", "model.attn_implementation=eager")
    layers = prefill_under(spec, 40, batch=1)
    assert_each_layer_keeps_its_protected_and_highest_scored(spec.strategy.press, layers, 40)


def test_a_seeded_random_press_keeps_the_same_positions_every_run_and_its_seeds_differ():
    seeded = kept_sets(spec_for(*TINY, "press=random", "press.seed=0"))
    again = kept_sets(spec_for(*TINY, "press=random", "press.seed=0"))
    other = kept_sets(spec_for(*TINY, "press=random", "press.seed=1"))
    assert all(torch.equal(a, b) for a, b in zip(seeded, again))
    assert not all(torch.equal(a, b) for a, b in zip(seeded, other))
    # kvpress reseeds its generator at each layer: every layer keeps the same positions
    assert torch.equal(seeded[0], seeded[1])
    assert seeded[0].shape[-1] == 20  # half of 40 at the default ratio


def test_tova_keeps_the_same_positions_in_every_kv_head_and_the_last_token():
    spec = spec_for(*TINY, "press=tova", "press.ratio=0.75")
    for kept in kept_sets(spec):
        assert kept.shape[-1] == 10 and (kept == kept[:, :1]).all()
        assert kept[0, 0, -1] == 39


def test_expected_attention_keeps_its_sinks_and_its_highest_scored():
    spec = spec_for(*TINY, "press=expected_attention", "press.ratio=0.75", "press.future_positions=16")
    layers = prefill_under(spec, 40, batch=1)
    assert_each_layer_keeps_its_protected_and_highest_scored(spec.strategy.press, layers, 40)
    assert all(layer["kept"][..., :4].tolist() == [[[0, 1, 2, 3]] * 2] for layer in layers)


def test_expected_attentions_mean_rotation_over_one_position_is_that_positions_rotary_embedding():
    from kvpipe import model as models

    loaded = models.load(spec_for(*TINY).model)
    module = loaded.model.model.layers[0].self_attn
    hidden = torch.randn(1, 41, module.config.hidden_size)
    cos, sin = loaded.model.model.rotary_emb(hidden, torch.arange(41).unsqueeze(0))
    with torch.no_grad():
        rotated = window_queries(module, hidden, (cos, sin), 1)[:, :, 0]  # the query at position 40
        unrotated = window_queries(module, hidden, (torch.ones_like(cos), torch.zeros_like(sin)), 1)[:, :, 0]
        rotation = _mean_rotation(module, hidden, 40, 1)  # the one future position after 40 tokens
    assert torch.allclose(unrotated @ rotation.T, rotated, atol=1e-5)


def test_pyramidkv_budgets_fall_from_the_first_layer_and_average_the_ratios_share():
    press = spec_for(*TINY, "press=pyramidkv", "press.window=8").strategy.press
    budgets = [press.layer_kept(512, layer, 30) for layer in range(30)]
    assert budgets == sorted(budgets, reverse=True) and budgets[0] > budgets[-1] >= 8
    assert sum(budgets) == pytest.approx(30 * 256, abs=15)  # rounding per layer
    # keeping a quarter of 512 tokens, a pyramid's smallest budget would fall under a 64-token window:
    # every layer keeps the ratio's share, as SnapKV does
    flat = spec_for(*TINY, "press=pyramidkv", "press.window=64", "press.ratio=0.75").strategy.press
    assert {flat.layer_kept(512, layer, 30) for layer in range(30)} == {128}


def test_pyramidkv_layers_hold_their_own_budgets():
    spec = spec_for(*TINY, "press=pyramidkv", "press.window=4", "press.beta=2")
    layers = prefill_under(spec, 40, batch=1)
    assert [layer["held"].shape[-2] for layer in layers] == [30, 10]
    assert all(layer["kept"][..., -4:].tolist() == [[[36, 37, 38, 39]] * 2] for layer in layers)
