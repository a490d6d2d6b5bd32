"""Record what NVIDIA's kvpress keeps: for each press x compression ratio, the prompt positions each
layer and KV head keeps after prefill, as kvpress's own `compress` returns them, on prompts given as
token ids. `tests/test_kvpress_parity.py` holds kvpipe's presses to them.

kvpress pins transformers below kvpipe's, so this runs in a venv of its own and never imports kvpipe:
the model folder and the prompts' ids come as arguments (README.md beside this file says how to
make them with kvpipe). What kvpress keeps is read back from its output, not re-derived: each
compressed key row is matched to the row of the uncompressed keys it came from.

    python record.py --model DIR --prompts ids.json --output kvpress_reference.npz
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch
import transformers
from kvpress import (
    ExpectedAttentionPress,
    KnormPress,
    ObservedAttentionPress,
    PyramidKVPress,
    RandomPress,
    SnapKVPress,
    StreamingLLMPress,
    TOVAPress,
)

RATIOS = (0.25, 0.5, 0.75)
# name -> (kvpress press class, its settings, the attention implementation it runs under)
PRESSES = {
    "knorm": (KnormPress, {}, "sdpa"),
    "snapkv_window64": (SnapKVPress, {"window_size": 64}, "sdpa"),
    "snapkv_window8": (SnapKVPress, {"window_size": 8}, "sdpa"),
    "snapkv_window64_eager": (SnapKVPress, {"window_size": 64}, "eager"),
    "streaming": (StreamingLLMPress, {"n_sink": 4}, "sdpa"),
    "random_seed0": (RandomPress, {"seed": 0}, "sdpa"),
    "tova": (TOVAPress, {}, "sdpa"),
    "tova_eager": (TOVAPress, {}, "eager"),
    "observed_attention": (ObservedAttentionPress, {}, "eager"),
    "expected_attention": (ExpectedAttentionPress, {}, "sdpa"),
    "pyramidkv_window8": (PyramidKVPress, {"window_size": 8}, "sdpa"),
}


def kept_mask(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """[batch, kv_heads, tokens] True where a row of `before` survives in `after` (each exactly once)."""
    same = (after[:, :, :, None, :] == before[:, :, None, :, :]).all(dim=-1)  # [b, h, kept, tokens]
    if not bool((same.sum(dim=-1) == 1).all()):
        raise RuntimeError("a kept key matches no uncompressed row, or several: cannot tell which it was")
    return same.any(dim=-2)


def recording(press) -> dict:
    """`press` made to record what its own `compress` keeps, into the dict returned (layer index ->
    [kv_heads, tokens] bool mask), as it runs."""
    masks = {}
    compress = press.compress

    def recording_compress(module, hidden_states, keys, values, attentions, kwargs):
        kept_keys, kept_values = compress(module, hidden_states, keys, values, attentions, kwargs)
        masks[module.layer_idx] = kept_mask(keys, kept_keys)[0]
        return kept_keys, kept_values

    press.compress = recording_compress
    return masks


def stacked(masks: dict) -> np.ndarray:
    """[layers, kv_heads, tokens] bool, from `recording`'s masks."""
    return torch.stack([masks[index] for index in sorted(masks)]).numpy()


def made_by() -> dict:
    """How a recording was made: the command, the versions and the machine (its `meta`)."""
    return {
        "command": "python " + " ".join(shlex.quote(word) for word in sys.argv),
        "versions": {p: version(p) for p in ("kvpress", "transformers", "torch", "numpy")},
        "python": platform.python_version(),
        "machine": platform.machine(),
    }


def record_press(model, press, input_ids) -> np.ndarray:
    """[layers, kv_heads, tokens] bool: what `press` keeps in each layer, for one prompt."""
    masks = recording(press)
    with torch.no_grad(), press(model):
        model(input_ids, past_key_values=transformers.DynamicCache(config=model.config))
    return stacked(masks)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a transformers model folder (Llama-style)")
    parser.add_argument("--prompts", required=True, help="JSON: a list of prompts, each a list of token ids")
    parser.add_argument("--output", required=True, help="the .npz to write")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    prompts = json.loads(Path(args.prompts).read_text())
    models = {}
    arrays = {"prompts": np.array(prompts, dtype=np.int32), "ratios": np.array(RATIOS)}
    for name, (press_class, settings, attention) in PRESSES.items():
        if attention not in models:
            models[attention] = transformers.AutoModelForCausalLM.from_pretrained(
                args.model, attn_implementation=attention, dtype=torch.float32
            ).eval()
        for ratio in RATIOS:
            for index, ids in enumerate(prompts):
                press = press_class(compression_ratio=ratio, **settings)
                mask = record_press(models[attention], press, torch.tensor([ids]))
                arrays[f"{name}/{ratio}/{index}"] = np.packbits(mask, axis=-1)
            print(f"{name} {ratio}: recorded", file=sys.stderr)
    meta = {
        **made_by(),
        "presses": {
            name: {"kvpress": c.__name__, "settings": s, "attn_implementation": a}
            for name, (c, s, a) in PRESSES.items()
        },  # fmt: skip
        "tokens": len(prompts[0]),
    }
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez_compressed(args.output, **arrays)


if __name__ == "__main__":
    main()
