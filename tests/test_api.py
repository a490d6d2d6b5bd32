"""kvpipe.api: the measured cache in a user's own generate call, and the out-of-memory fallback."""

from __future__ import annotations

import pytest

from kvpipe import api
from kvpipe import model as models
from kvpipe.errors import KvpipeError
from kvpipe.job.runner import run_job

from conftest import TINY, spec_for


@pytest.fixture(scope="module")
def tiny():
    loaded = models.load(spec_for(*TINY).model)
    inputs = loaded.tokenizer(["Explain a KV cache."], return_tensors="pt")
    return loaded, dict(inputs)


@pytest.mark.slow  # real jobs and generate calls
@pytest.mark.parametrize("settings", ["cache=static", "cache=quantized backend=hqq backend.nbits=4 axis=kivi"])
def test_a_users_generate_with_the_api_cache_makes_the_runners_tokens(tiny, settings):
    loaded, _ = tiny
    spec = spec_for(*TINY, *settings.split(), "workload.prompts=[Explain a KV cache.]", "workload.repeats=1")
    runner = run_job(spec)
    (batch,) = spec.bound_workload.batches(loaded.tokenizer, "cpu")  # the prompt as the runner sends it
    inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}
    kwargs = api.cache_kwargs(loaded.model, settings, prompt_tokens=batch.prompt_tokens, max_new_tokens=6)
    output = loaded.model.generate(**inputs, max_new_tokens=6, min_new_tokens=6, do_sample=False, **kwargs)
    new = loaded.tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert new == runner.texts[0]["completion"]


def test_settings_of_other_groups_are_refused_in_one_line():
    with pytest.raises(KvpipeError, match=r"model=tiny_random: not a cache setting; expected overrides of cache"):
        api.settings("cache=static model=tiny_random")
    with pytest.raises(KvpipeError, match=r"backend.nbits .*=3 is not valid: expected one of: 2, 4"):
        api.settings("cache=quantized backend=quanto backend.nbits=3")


@pytest.mark.slow  # imports the quantized layers, seconds in a new process
def test_generate_with_fallback_retries_after_out_of_memory_as_the_runner_does(tiny, monkeypatch):
    import torch

    loaded, inputs = tiny
    calls = []
    original = loaded.model.generate

    def generate(**kwargs):
        calls.append(type(kwargs["cache"]).__name__)
        if len(calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return original(**kwargs)

    monkeypatch.setattr(loaded.model, "generate", generate)
    output, record = api.generate_with_fallback(
        loaded.model, "cache=static fallback=[quantized]", max_new_tokens=3, **inputs
    )
    assert calls == ["StaticCache", "LayeredQuantizedCache"]  # a QuantizedCache of kvpipe's layers
    assert record["fallback_from"] == "static" and record["fallback_to"] == "quantized"
    assert record["cache"] == "quantized" and "out of memory" in record["fallback_error"]
    assert output.shape[1] == inputs["input_ids"].shape[1] + 3
