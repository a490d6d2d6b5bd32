"""The passkey workload's prompt construction, on the embedded tokenizer (tiny_random borrows it)."""

from __future__ import annotations

import pytest

from kvpipe import model as models
from kvpipe.errors import ConfigError
from kvpipe.job.passkey import QUESTION, found, needle, passkey_key, passkey_prompt

from conftest import spec_for


@pytest.fixture(scope="module")
def tokenizer():
    return models.load_tokenizer(spec_for("model=tiny_random").model)


@pytest.mark.parametrize("context_tokens", [300, 1000, 2048])
@pytest.mark.parametrize("depth", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_every_prompt_lands_on_its_exact_token_count(tokenizer, context_tokens, depth):
    prompt = passkey_prompt(tokenizer, context_tokens, depth, passkey_key(0, context_tokens, depth, 0))
    assert len(prompt.input_ids) == context_tokens


def test_the_needle_sits_at_its_depth_of_the_filler(tokenizer):
    starts = []
    for depth in (0.1, 0.5, 0.9):
        prompt = passkey_prompt(tokenizer, 1000, depth, "48213")
        needle_ids = tokenizer(needle("48213"), add_special_tokens=False)["input_ids"]
        assert prompt.input_ids[prompt.needle_start : prompt.needle_start + len(needle_ids)] == needle_ids
        starts.append(prompt.needle_start)
    span = starts[2] - starts[0]  # 0.8 of the filler
    assert abs((starts[1] - starts[0]) - span / 2) <= 1 and 600 < span / 0.8 < 1000


def test_keys_are_seeded_digits_that_differ_between_cells_and_trials():
    assert passkey_key(0, 1000, 0.5, 0) == passkey_key(0, 1000, 0.5, 0)
    keys = {passkey_key(seed, ctx, d, t) for seed in (0, 1) for ctx in (500, 1000) for d in (0.1, 0.9) for t in (0, 1)}
    assert len(keys) == 16 and all(k.isdigit() and len(k) == 5 for k in keys)


def test_the_question_does_not_leak_the_key_and_the_key_appears_once_as_a_needle(tokenizer):
    key = "48213"
    prompt = passkey_prompt(tokenizer, 1000, 0.5, key)
    text = tokenizer.decode(prompt.input_ids)
    assert key not in QUESTION and text.count(key) == 2  # the needle says it twice, nothing else does
    assert text.rstrip().endswith("assistant") or QUESTION.strip() in text[-200:]


def test_trials_hide_the_key_in_different_filler(tokenizer):
    a, b = (passkey_prompt(tokenizer, 800, 0.5, "11111", trial=t).input_ids for t in (0, 1))
    assert len(a) == len(b) and a[:20] == b[:20] and a[100:300] != b[100:300]  # same template start, other text


def test_too_short_a_context_names_the_setting(tokenizer):
    with pytest.raises(ConfigError, match="workload.context_tokens=20"):
        passkey_prompt(tokenizer, 20, 0.5, "12345")


@pytest.mark.parametrize(
    "answer, hit", [("The pass key is 48213.", True), ("48213", True), ("482130", False), ("The pass is", False)]
)
def test_an_answer_counts_only_with_the_exact_key(answer, hit):
    assert found(answer, "48213") is hit
