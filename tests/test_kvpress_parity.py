"""kvpipe's presses keep exactly the prompt positions NVIDIA's kvpress keeps: every press x ratio,
every layer and KV head of the embedded model, on two recorded passkey prompts. kvpress cannot be a
dependency (it pins an older transformers), so what it keeps was recorded once, in its own venv, by
benchmarks/kvpress_reference/record.py (its command and versions are in the data file and that
folder's README); this test runs kvpipe's own presses, through the cache a job builds, on the same
token ids."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from kvpipe import model as models

from conftest import spec_for

DATA = Path(__file__).parent / "data" / "kvpress_reference.npz"
EAGER = "model.attn_implementation=eager"
# what kvpress recorded -> the same press in kvpipe (the model loads once per attention implementation)
KVPIPE_PRESS = {
    "knorm": ("press=knorm",),
    "snapkv_window64": ("press=snapkv", "press.window=64"),
    "snapkv_window8": ("press=snapkv", "press.window=8"),
    "streaming": ("press=streaming", "press.sinks=4"),
    "random_seed0": ("press=random", "press.seed=0"),
    "tova": ("press=tova",),
    "expected_attention": ("press=expected_attention",),
    "pyramidkv_window8": ("press=pyramidkv", "press.window=8"),
    "snapkv_window64_eager": ("press=snapkv", "press.window=64", EAGER),
    "tova_eager": ("press=tova", EAGER),
    "observed_attention": ("press=observed_attention", EAGER),
}


@pytest.fixture(scope="module")
def reference():
    with np.load(DATA) as data:
        return {name: data[name] for name in data.files}


@pytest.fixture(scope="module")
def kvpipe_kept(reference) -> dict[tuple[str, int], dict[float, list[torch.Tensor]]]:
    """What each press keeps, by (recorded name, prompt): one prefill per prompt and attention
    implementation, every press scoring what the cache's own hook hands it there."""
    kept = {}
    for attention in ((), (EAGER,)):
        names = [name for name, overrides in KVPIPE_PRESS.items() if (EAGER in overrides) == bool(attention)]
        for index, ids in enumerate(reference["prompts"].tolist()):
            kept.update(prefill_kept(attention, names, ids, reference["ratios"], index))
    return kept


def prefill_kept(attention: tuple[str, ...], names: list[str], ids: list[int], ratios, index: int) -> dict:
    """A prefill of `ids` through the pressed cache a job builds; at each full-attention layer, each
    named press chooses, at each ratio, from the module inputs the cache's hook received: the
    [kv_heads, tokens] kept mask of each layer, by (name, index) and ratio."""
    carrier = spec_for("press=knorm", *attention, "tracking=off")
    presses = {name: spec_for(*KVPIPE_PRESS[name], "tracking=off").strategy.press for name in names}
    loaded, kept = models.load(carrier.model), {(name, index): {ratio: [] for ratio in ratios} for name in names}
    cache = carrier.strategy.setup(loaded, len(ids)).make_cache()
    carrier_keep = carrier.strategy.press.keep

    def keeping_for_every_press(module, hidden_states, keys, *rest):
        for name, press in presses.items():
            settings = press.settings
            for ratio in ratios:
                press.settings = dataclasses.replace(settings, ratio=float(ratio))
                chosen = press.keep(module, hidden_states, keys, *rest)[0]
                mask = torch.zeros(keys.shape[1:3], dtype=torch.bool).scatter(-1, chosen, True)
                kept[name, index][ratio].append(mask)
            press.settings = settings
        return carrier_keep(module, hidden_states, keys, *rest)

    carrier.strategy.press.keep = keeping_for_every_press
    with torch.inference_mode():
        loaded.model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True)
    return kept


def assert_same_kept(recorded: np.ndarray, layers: list[torch.Tensor], what: str) -> None:
    """Each layer and head keeps what was recorded ([layers, kv_heads, packed tokens]); the message
    names the first that does not."""
    assert len(layers) == recorded.shape[0], f"{what}: {len(layers)} layers pressed, {recorded.shape[0]} recorded"
    for layer, mask in enumerate(layers):
        expected = np.unpackbits(recorded[layer], axis=-1, count=mask.shape[-1]).astype(bool)
        for head, (ours, theirs) in enumerate(zip(mask.numpy(), expected)):
            missing, extra = np.flatnonzero(theirs & ~ours), np.flatnonzero(ours & ~theirs)
            assert not (missing.size or extra.size), (
                f"{what} layer {layer} head {head}: kvpress keeps {theirs.sum()} positions, kvpipe {ours.sum()}; "
                f"kvpipe drops {missing[:8].tolist()} and keeps {extra[:8].tolist()} instead"
            )


def test_the_recording_says_how_it_was_made(reference):
    meta = json.loads(str(reference["meta"]))
    assert meta["command"].startswith("python record.py --model ")
    assert set(meta["versions"]) >= {"kvpress", "transformers", "torch"}
    assert set(meta["presses"]) == set(KVPIPE_PRESS)


@pytest.mark.slow  # two prefills of two 512-token prompts through the embedded model, for every press
@pytest.mark.parametrize("name", list(KVPIPE_PRESS))
def test_kvpipe_keeps_what_kvpress_keeps(reference, kvpipe_kept, name):
    for index in range(len(reference["prompts"])):
        for ratio, layers in kvpipe_kept[name, index].items():
            assert_same_kept(reference[f"{name}/{ratio}/{index}"], layers, f"{name} ratio {ratio} prompt {index}")


def test_a_position_kept_otherwise_fails_naming_press_ratio_layer_and_head(reference):
    recorded = reference["knorm/0.5/0"]
    layers = [torch.from_numpy(np.unpackbits(layer, axis=-1).astype(bool)) for layer in recorded]
    assert_same_kept(recorded, layers, "knorm ratio 0.5 prompt 0")  # the recording read back: equal
    head = layers[3][1]
    dropped, kept = int(head.logical_not().nonzero()[0]), int(head.nonzero()[0])
    head[dropped], head[kept] = True, False  # one position swapped for another: as many kept, not the same
    with pytest.raises(AssertionError, match=rf"knorm ratio 0.5 prompt 0 layer 3 head 1: .*drops \[{kept}\]"):
        assert_same_kept(recorded, layers, "knorm ratio 0.5 prompt 0")
