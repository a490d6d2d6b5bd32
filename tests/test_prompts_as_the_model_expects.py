"""Prompts as the model expects them: the tokenizer's BOS exactly once where it adds one by default
(and counted in the prompt's length), never where it adds none; a chat-style workload on a tokenizer
with no chat template says so once and is tagged. Three tokenizers built here: one that adds BOS
and has no template, one whose template writes BOS itself, one with no BOS at all."""

from __future__ import annotations

import logging

import pytest

from kvpipe.workload import _encoding

from conftest import TINY, spec_for

BOS, PAD = 1, 0
WORDS = ["<pad>", "<s>", "</s>", "<unk>"] + (
    "a the pass key is what text of hidden below find it and remember number answer with only "
    "hello world python docs cache user assistant : ? ."
).split()


def build_tokenizer(adds_bos: bool, template: str | None = None):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {word: index for index, word in enumerate(WORDS + [str(d) for d in range(10)])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    if adds_bos:
        backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", BOS)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    tokenizer.padding_side = "left"
    if template:
        tokenizer.chat_template = template
    return tokenizer


BOS_TEMPLATE = "{{ bos_token }}{% for m in messages %}user : {{ m['content'] }} {% endfor %}assistant :"
PLAIN_TEMPLATE = "{% for m in messages %}user : {{ m['content'] }} {% endfor %}assistant :"
TOKENIZERS = {
    "adds BOS, no template": (lambda: build_tokenizer(True), True),
    "template writes BOS": (lambda: build_tokenizer(True, BOS_TEMPLATE), True),
    "adds BOS, template does not": (lambda: build_tokenizer(True, PLAIN_TEMPLATE), True),
    "no BOS at all": (lambda: build_tokenizer(False, PLAIN_TEMPLATE), False),
}


def leading_bos(ids: list[int]) -> int:
    count = 0
    while count < len(ids) and ids[count] == BOS:
        count += 1
    return count


@pytest.mark.slow  # a real job per workload and tokenizer
@pytest.mark.parametrize("case", sorted(TOKENIZERS))
@pytest.mark.parametrize("kind", ["chat", "long_context", "passkey"])
def test_bos_once_where_the_tokenizer_adds_it_and_lengths_stay_exact(case, kind):
    make, wants_bos = TOKENIZERS[case]
    tokenizer = make()
    overrides = {
        "chat": ["workload=chat", "workload.prompts=[hello world]"],
        "long_context": ["workload=long_context", "workload.prompt_tokens=40"],
        "passkey": ["workload=passkey", "workload.context_tokens=60", "workload.depths=[0.5]", "workload.trials=1"],
    }[kind]
    spec = spec_for(*TINY, *overrides)
    for batch in spec.bound_workload.batches(tokenizer, "cpu"):
        for ids, mask in zip(batch.input_ids.tolist(), batch.attention_mask.tolist()):
            real = [token for token, keep in zip(ids, mask) if keep]
            assert leading_bos(real) == (1 if wants_bos else 0), tokenizer.decode(real)
            assert BOS not in real[1:]  # never twice, never inside
            if kind == "long_context":
                assert len(real) == 40
            if kind == "passkey":
                assert len(real) == 60
    window = spec.bound_workload.windows(tokenizer, 1, 8)[0]
    assert leading_bos(window.prefix) == (1 if wants_bos else 0)


def test_a_chat_workload_without_a_template_says_so_once_and_is_tagged(caplog):
    tokenizer = build_tokenizer(True)
    workload = spec_for(*TINY, "workload.prompts=[hello world, python docs]").bound_workload
    with caplog.at_level(logging.WARNING, logger=_encoding.__name__):
        workload.batches(tokenizer, "cpu")
        workload.windows(tokenizer, 2, 8)
    said = [r for r in caplog.records if "has none" in r.getMessage()]
    assert len(said) == 1 and "workload=chat" in said[0].getMessage()
    assert workload.tags(tokenizer) == {"chat_template": "none"}
    assert workload.tags(build_tokenizer(True, BOS_TEMPLATE)) == {"chat_template": "model"}
    assert (
        spec_for(*TINY, "workload=long_context").bound_workload.tags(tokenizer) == {}
    )  # plain text: no template asked


def test_a_model_whose_tokenizer_adds_bos_runs_with_it_counted(tmp_path):
    """End to end on a saved folder (a tiny Llama and a BOS-adding tokenizer without a template):
    the prompt the model saw starts with BOS, its length counts it, and the run is tagged."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from kvpipe.job.runner import run_job

    tokenizer = build_tokenizer(True)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256, bos_token_id=BOS,
        eos_token_id=2, pad_token_id=PAD,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    spec = spec_for("model=hf", f"model.name_or_path={tmp_path}", "workload.prompts=[hello world]", *TINY[1:])
    job = run_job(spec)
    assert job.texts[0]["prompt"].startswith("<s>") and not job.texts[0]["prompt"].startswith("<s><s>")
    assert job.metrics["prompt_tokens"] == len(tokenizer("hello world")["input_ids"]) == 3
    assert job.tags["chat_template"] == "none"
