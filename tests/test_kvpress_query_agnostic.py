"""Under press.protocol=query_agnostic kvpipe reproduces kvpress's own pipeline: the context pressed
alone and compressed once, then the question and the answer appended, greedily. On the six passkey
prompts at 1,024 tokens recorded by benchmarks/kvpress_reference/record_query_agnostic.py (in
kvpress's venv: kvpress cannot be a dependency), for streaming, knorm and snapkv at ratios 0.25, 0.5
and 0.75, kvpipe keeps the same positions in every layer and KV head and finds the same keys.

One prefill per prompt serves every press: the context's forward does not depend on what the cache
keeps, so the hook of the job's own cache (streaming 0.5, query_agnostic, answered by the job's own
`generate_after_context`) hands each press what it would see, and the presses answer from the context's
keys and values gathered at what each keeps, the three of one ratio as one batch (they keep as many)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_kvpress_parity import assert_same_kept
from transformers import DynamicCache

from kvpipe import model as models
from kvpipe.job.phases import eos_ids
from kvpipe.job.question_after_context import answer, generate_after_context
from kvpipe.measure.clock import TokenClock
from kvpipe.workload.base import Batch
from kvpipe.workload.passkey.prompts import found

from conftest import spec_for

DATA = Path(__file__).parent / "data" / "kvpress_query_agnostic.npz"
PASSKEY = ("workload=passkey", "workload.context_tokens=[1024]", "workload.depths=[0.1,0.5,0.9]", "workload.trials=2")  # fmt: skip
AGNOSTIC = (*PASSKEY, "press.protocol=query_agnostic", "tracking=off")
KVPIPE_PRESS = {"streaming": ("press=streaming", "press.sinks=4"), "knorm": ("press=knorm",), "snapkv": ("press=snapkv", "press.window=64")}  # fmt: skip
NEW_TOKENS = 12  # kvpipe's passkey default, as recorded
CARRIER = ("streaming", 0.5)  # the press the job's own cache compresses with, and answers through the job's call


@pytest.fixture(scope="module")
def recorded():
    with np.load(DATA) as data:
        arrays = {name: data[name] for name in data.files}
    return arrays, json.loads(str(arrays.pop("meta")))


def test_the_recording_says_how_it_was_made_and_pressed_kvpipes_own_prompts(recorded):
    arrays, meta = recorded
    assert meta["command"].startswith("python record_query_agnostic.py --model ")
    assert set(meta["presses"]) == set(KVPIPE_PRESS) and meta["versions"]["kvpress"]
    spec = spec_for(*AGNOSTIC, "press=streaming")
    batches = spec.bound_workload.batches(models.load_tokenizer(spec.model), "cpu")
    ours = [(ids, batch.question_tokens, row.key) for batch in batches for ids, row in zip(batch.input_ids.tolist(), batch.rows)]  # fmt: skip
    theirs = [(p["context"] + p["question"], len(p["question"]), p["key"]) for p in meta["prompts"]]
    assert ours == theirs


@pytest.fixture(scope="module")
def kvpipe_answers(recorded) -> dict[str, tuple[list[torch.Tensor], str]]:
    """By 'press/ratio/prompt': what each layer kept ([kv_heads, tokens] masks) and kvpipe's answer."""
    arrays, meta = recorded
    carrier = spec_for(*AGNOSTIC, *KVPIPE_PRESS[CARRIER[0]], f"press.ratio={CARRIER[1]}")
    presses = {name: spec_for(*AGNOSTIC, *overrides).strategy.press for name, overrides in KVPIPE_PRESS.items()}
    loaded = models.load(carrier.model)
    results = {}
    for index, prompt in enumerate(meta["prompts"]):
        results.update(answers_for_prompt(loaded, carrier, presses, arrays["ratios"], index, prompt))
    return results


def answers_for_prompt(loaded, carrier, presses, ratios, index: int, prompt: dict) -> dict:
    context, question = torch.tensor([prompt["context"]]), torch.tensor([prompt["question"]])
    kept, stored = {(name, float(r)): [] for name in presses for r in ratios}, []
    carrier_keep = carrier.strategy.press.keep

    def keeping_for_every_press(module, hidden_states, keys, values, *rest):
        stored.append((keys, values))
        for (name, ratio), layers in kept.items():
            press = presses[name]
            settings, press.settings = press.settings, dataclasses.replace(press.settings, ratio=ratio)
            layers.append(press.keep(module, hidden_states, keys, values, *rest)[0])
            press.settings = settings
        return carrier_keep(module, hidden_states, keys, values, *rest)

    carrier.strategy.press.keep = keeping_for_every_press
    ids = torch.cat([context, question], dim=1)
    batch = Batch(ids, torch.ones_like(ids), [""], question_tokens=question.shape[1])
    cache = carrier.strategy.setup(loaded, ids.shape[1]).make_cache()
    model, stops, pad = loaded.model, eos_ids(loaded.model), loaded.tokenizer.pad_token_id
    with torch.inference_mode():
        generated, _ = generate_after_context(model, batch, cache, TokenClock(False), NEW_TOKENS, stops, False, pad)
        results = {f"{CARRIER[0]}/{CARRIER[1]}/{index}/job": (None, decoded(loaded, generated[0, ids.shape[1] :]))}
        for ratio in sorted({ratio for _, ratio in kept}):  # every press keeps as many at one ratio: one batch
            names, gathered = list(presses), DynamicCache(config=model.config)
            for layer, (keys, values) in enumerate(stored):
                chosen = torch.stack([kept[name, ratio][layer] for name in names])
                at = chosen[..., None].expand(-1, -1, -1, keys.shape[-1])
                rows = (len(names), -1, -1, -1)
                gathered.update(keys.expand(rows).gather(2, at), values.expand(rows).gather(2, at), layer)
            asked = question.expand(len(names), -1)
            tokens = answer(model, gathered, asked, context.shape[1], TokenClock(False), NEW_TOKENS, stops, False, pad)
            for row, name in enumerate(names):
                layers = kept[name, ratio]
                mask = [torch.zeros(keys.shape[1:3], dtype=torch.bool).scatter(-1, c, True) for c in layers]
                results[f"{name}/{ratio}/{index}"] = (mask, decoded(loaded, tokens[row]))
    return results


def decoded(loaded, tokens: torch.Tensor) -> str:
    return loaded.tokenizer.decode(tokens, skip_special_tokens=True)


@pytest.mark.slow  # six 1,024-token prefills of the embedded model, and 54 short answers
@pytest.mark.parametrize("name", list(KVPIPE_PRESS))
def test_kvpipe_keeps_what_kvpress_keeps_and_finds_the_keys_it_finds(recorded, kvpipe_answers, name):
    arrays, meta = recorded
    for ratio in arrays["ratios"].tolist():
        ours = [found(kvpipe_answers[f"{name}/{ratio}/{i}"][1], p["key"]) for i, p in enumerate(meta["prompts"])]
        theirs = [found(meta["answers"][f"{name}/{ratio}/{i}"], p["key"]) for i, p in enumerate(meta["prompts"])]
        assert ours == theirs, f"{name} {ratio}: kvpipe found {sum(ours)} of 6 keys ({ours}), kvpress {sum(theirs)} ({theirs})"  # fmt: skip
        for index in range(len(meta["prompts"])):
            assert_same_kept(arrays[f"{name}/{ratio}/{index}"], kvpipe_answers[f"{name}/{ratio}/{index}"][0], f"{name} {ratio} prompt {index}")  # fmt: skip


@pytest.mark.slow
def test_the_jobs_own_call_answers_as_the_gathered_cache_does(recorded, kvpipe_answers):
    name, ratio = CARRIER
    for index in range(len(recorded[1]["prompts"])):
        assert kvpipe_answers[f"{name}/{ratio}/{index}/job"][1] == kvpipe_answers[f"{name}/{ratio}/{index}"][1]
