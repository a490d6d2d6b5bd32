"""press.protocol: query_aware (the default: the press sees the whole prompt, question included) or
query_agnostic (the context compressed alone, the question fed after it at its true positions). The
question-after-context call generates exactly what generate() does when nothing is evicted; the press
under query_agnostic never sees the question; the protocol is keyed, logged and labelled only off its
default; where it does not apply it is refused in one line, or ignored with a warning."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from kvpipe import model as models
from kvpipe.cache import presses
from kvpipe.errors import ConfigError
from kvpipe.job.phases import eos_ids
from kvpipe.job.question_after_context import generate_after_context
from kvpipe.job.runner import run_job
from kvpipe.measure.clock import TokenClock
from kvpipe.workload.base import Batch

from conftest import spec_for

JOB = ("model=tiny_random", "tracking=off", "workload.warmup=0", "workload.repeats=1", "workload.max_new_tokens=4")
PASSKEY = (*JOB, "workload=passkey", "workload.context_tokens=120", "workload.depths=[0.5]", "workload.trials=1")
AGNOSTIC = "press.protocol=query_agnostic"


def prompt(batch: int = 2, tokens: int = 50, question: int = 9) -> Batch:
    ids = torch.randint(3, 1000, (batch, tokens), generator=torch.Generator().manual_seed(0))
    return Batch(ids, torch.ones_like(ids), [""] * batch, question_tokens=question)


def after_context(loaded, batch: Batch, cache, new_tokens: int, ignore_eos: bool = True):
    with torch.inference_mode():
        return generate_after_context(
            loaded.model, batch, cache, TokenClock(False), new_tokens,
            eos_ids(loaded.model), ignore_eos, loaded.tokenizer.pad_token_id,
        )  # fmt: skip


# ---- the call: positions and masks right ----------------------------------------------------------


@pytest.mark.parametrize("model", ["model=tiny_random", "model=tiny_sliding"])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("ignore_eos", [True, False])
def test_the_question_after_an_uncompressed_context_generates_what_generate_does(model, attention, ignore_eos):
    loaded = models.load(spec_for(model, f"model.attn_implementation={attention}").model)
    batch = prompt()
    with torch.inference_mode():
        whole = loaded.model.generate(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, max_new_tokens=12,
            min_new_tokens=12 if ignore_eos else None, do_sample=False, pad_token_id=loaded.tokenizer.pad_token_id,
        )  # fmt: skip
    split, context_ms = after_context(loaded, batch, DynamicCache(), 12, ignore_eos)
    assert torch.equal(split, whole)
    assert context_ms > 0


def test_a_row_that_ends_is_padded_until_every_row_has_ended_as_generate_pads_it():
    loaded = models.load(spec_for("model=tiny_random").model)
    batch = prompt()
    first, _ = after_context(loaded, batch, DynamicCache(), 3)
    ended_at = int(first[0, batch.prompt_tokens + 1])  # row 0's second new token, taken for its EOS
    loaded.model.generation_config.eos_token_id = ended_at
    try:
        with torch.inference_mode():
            whole = loaded.model.generate(
                input_ids=batch.input_ids, attention_mask=batch.attention_mask, max_new_tokens=8, do_sample=False,
                pad_token_id=loaded.tokenizer.pad_token_id,
            )  # fmt: skip
        split, _ = after_context(loaded, batch, DynamicCache(), 8, ignore_eos=False)
    finally:
        loaded.model.generation_config.eos_token_id = None
    assert torch.equal(split, whole)
    assert (split[0, batch.prompt_tokens + 2 :] == loaded.tokenizer.pad_token_id).all()


def test_under_query_agnostic_snapkvs_window_is_the_contexts_last_tokens_not_the_question():
    spec = spec_for(*PASSKEY, "press=snapkv", "press.window=8", "press.ratio=0.5", AGNOSTIC)
    loaded, batch = models.load(spec.model), prompt(batch=1, tokens=60, question=10)
    context = batch.input_ids[:, :50]

    def kept_indices(cache_input):
        cache, kept = spec.strategy.setup(loaded, 60).make_cache(), []
        keep = spec.strategy.press.keep
        spec.strategy.press.keep = lambda *args: kept.append(keep(*args)) or kept[-1]
        try:
            cache_input(cache)
        finally:
            del spec.strategy.press.keep
        return kept

    alone = kept_indices(lambda cache: loaded.model(input_ids=context, cache=cache, use_cache=True))
    asked = kept_indices(lambda cache: after_context(loaded, batch, cache, 3))
    whole = kept_indices(lambda cache: loaded.model(input_ids=batch.input_ids, cache=cache, use_cache=True))
    assert len(asked) == len(alone) == loaded.shape.full_layers
    assert all(torch.equal(a, b) for a, b in zip(asked, alone))  # the question never reached the press
    assert all(a.shape[-1] == 25 for a in asked)  # half of the 50 context tokens
    assert not all(torch.equal(a, w) for a, w in zip(asked, whole))  # which query_aware's would have


def test_a_query_agnostic_job_holds_the_compressed_context_then_the_question_and_answer():
    aware = run_job(spec_for(*PASSKEY, "press=knorm", "press.ratio=0.5"))
    agnostic = run_job(spec_for(*PASSKEY, "press=knorm", "press.ratio=0.5", AGNOSTIC))
    plain = run_job(spec_for(*PASSKEY))
    question = _question_tokens()
    context = 120 - question
    per_token = plain.metrics["kv_cache_bytes"] / plain.metrics["kv_cache_tokens"]
    assert agnostic.metrics["kv_cache_tokens"] == context - context // 2 + question + 4 - 1
    assert aware.metrics["kv_cache_tokens"] == 120 - 60 + 4 - 1
    assert agnostic.metrics["kv_cache_bytes"] == agnostic.metrics["kv_cache_tokens"] * per_token
    assert 0 < agnostic.metrics["context_prefill_ms"] < agnostic.metrics["ttft_ms"]
    assert "context_prefill_ms" not in aware.metrics


def _question_tokens() -> int:
    spec = spec_for(*PASSKEY)
    tokenizer = models.load_tokenizer(spec.model)
    (batch,) = spec.bound_workload.batches(tokenizer, "cpu")
    return batch.question_tokens


# ---- keyed, logged and labelled off its default ---------------------------------------------------


def test_query_aware_is_the_default_and_keys_every_press_run_as_before():
    implicit = spec_for(*PASSKEY, "press=snapkv", "press.window=8")
    explicit = spec_for(*PASSKEY, "press=snapkv", "press.window=8", "press.protocol=query_aware")
    assert implicit.strategy.press.protocol == presses.QUERY_AWARE
    assert implicit.measurement_key() == explicit.measurement_key()
    assert implicit.params() == explicit.params() and "press.protocol" not in implicit.params()
    assert "protocol" not in implicit.strategy.describe()
    assert implicit.strategy.press.label() == "snapkv0.5"


def test_query_agnostic_is_its_own_measurement_param_and_label():
    aware = spec_for(*PASSKEY, "press=streaming")
    agnostic = spec_for(*PASSKEY, "press=streaming", AGNOSTIC)
    assert agnostic.measurement_key() != aware.measurement_key()
    assert agnostic.params()["press.protocol"] == "query_agnostic"
    assert "press.protocol=query_agnostic" in agnostic.strategy.describe().split()
    assert agnostic.strategy.press.label() == "streaming0.5-query_agnostic"
    assert "press.protocol" in presses.get("streaming").in_label


def test_the_passkey_question_is_its_question_and_the_templates_suffix():
    from kvpipe.workload.passkey import prompts

    spec = spec_for(*PASSKEY)
    tokenizer = models.load_tokenizer(spec.model)
    (batch,) = spec.bound_workload.batches(tokenizer, "cpu")
    question = tokenizer.decode(batch.input_ids[0, -batch.question_tokens :])
    assert question.startswith(prompts.QUESTION)
    assert batch.rows[0].key not in question  # the key sits in the context, before it


# ---- where it does not apply ----------------------------------------------------------------------


def test_a_workload_that_does_not_name_its_question_is_refused_in_one_line():
    with pytest.raises(ConfigError) as refused:
        spec_for(*JOB, "workload=long_context", "press=knorm", AGNOSTIC)
    message = str(refused.value)
    assert "press.protocol" in message and "workload=passkey" in message and "\n" not in message


def test_sampling_under_query_agnostic_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="workload.do_sample=false"):
        spec_for(*PASSKEY, "press=knorm", AGNOSTIC, "workload.do_sample=true")


def test_an_unknown_protocol_names_the_valid_ones():
    with pytest.raises(ConfigError, match="query_aware, query_agnostic"):
        spec_for(*PASSKEY, "press=knorm", "press.protocol=question_last")


def test_query_agnostic_without_a_press_is_ignored_with_one_warning_and_keyed_as_before():
    ignored = spec_for(*PASSKEY, "cache=quantized", AGNOSTIC)
    assert ignored.measurement_key() == spec_for(*PASSKEY, "cache=quantized").measurement_key()
    assert [w for w in ignored.warnings if "press.protocol" in w] == [
        "press.protocol=query_agnostic is ignored: press=none compresses nothing, so the prompt is read whole"
    ]


# ---- compressed once, or rolling: press.rolling -----------------------------------------------------


def test_under_query_agnostic_streaming_compresses_the_context_once_unless_asked_to_roll():
    question = _question_tokens()
    context = 120 - question
    once = run_job(spec_for(*PASSKEY, "quality=off", "press=streaming", AGNOSTIC))
    rolling = run_job(spec_for(*PASSKEY, "quality=off", "press=streaming", AGNOSTIC, "press.rolling=true"))
    aware = run_job(spec_for(*PASSKEY, "quality=off", "press=streaming"))
    assert once.metrics["kv_cache_tokens"] == int(context * 0.5) + question + 4 - 1  # as kvpress's pipeline holds it
    assert rolling.metrics["kv_cache_tokens"] == int(context * 0.5)  # StreamingLLM's window: never past its budget
    assert aware.metrics["kv_cache_tokens"] == 60  # query_aware rolls, as every run before the setting


def test_rolling_is_keyed_logged_and_labelled_only_where_it_differs_from_what_runs_before_it_did():
    aware = spec_for(*PASSKEY, "press=streaming")
    assert aware.measurement_key() == spec_for(*PASSKEY, "press=streaming", "press.rolling=true").measurement_key()
    assert "press.rolling" not in aware.params() and aware.strategy.press.label() == "streaming0.5"
    once = spec_for(*PASSKEY, "press=streaming", AGNOSTIC)
    rolling = spec_for(*PASSKEY, "press=streaming", AGNOSTIC, "press.rolling=true")
    assert once.params()["press.rolling"] == "false" and "press.rolling" not in rolling.params()
    assert once.measurement_key() != rolling.measurement_key()
    assert once.strategy.press.label() == "streaming0.5-query_agnostic"
    assert rolling.strategy.press.label() == "streaming0.5-query_agnostic-rolling"
    aware_once = spec_for(*PASSKEY, "press=streaming", "press.rolling=false")
    assert aware_once.params()["press.rolling"] == "false" and aware_once.strategy.press.label() == "streaming0.5-once"
    assert "press.rolling=false" in aware_once.strategy.describe().split()
    knorm = spec_for(*PASSKEY, "press=knorm", AGNOSTIC)  # nothing to roll: keyed as before the setting
    assert "press.rolling" not in knorm.params()
    assert (
        knorm.measurement_key() == spec_for(*PASSKEY, "press=knorm", AGNOSTIC, "press.rolling=false").measurement_key()
    )


def test_rolling_a_press_that_scores_the_prompt_once_is_refused_in_one_line():
    with pytest.raises(ConfigError) as refused:
        spec_for(*PASSKEY, "press=snapkv", "press.rolling=true")
    message = str(refused.value)
    assert "press.rolling" in message and "press=streaming" in message and "\n" not in message


def test_query_agnostic_keeps_kvpresss_count_where_the_ratios_share_is_not_whole():
    aware = spec_for(*PASSKEY, "press=knorm", "press.ratio=0.25").strategy.press
    agnostic = spec_for(*PASSKEY, "press=knorm", "press.ratio=0.25", AGNOSTIC).strategy.press
    assert aware.kept(101) == 101 - 25 and agnostic.kept(101) == int(101 * 0.75) == 75
    assert aware.kept(100) == agnostic.kept(100) == 75


def test_a_run_that_rolled_is_spelled_back_as_rolling_and_one_compressed_once_as_the_default():
    streaming = presses.get("streaming")
    before = {"press.name": "streaming", "press.ratio": "0.5", "press.protocol": "query_agnostic"}  # logged no rolling
    assert "press.rolling=true" in streaming.command_overrides(before)
    once = spec_for(*PASSKEY, "press=streaming", AGNOSTIC)
    words = streaming.command_overrides(once.params())
    assert "press.rolling=false" in words and spec_for(*PASSKEY, *words).measurement_key() == once.measurement_key()
    aware = spec_for(*PASSKEY, "press=streaming")
    assert not any("rolling" in w for w in streaming.command_overrides(aware.params()))
