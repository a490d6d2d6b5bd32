"""workload=shared_context: each context read and compressed once, every question answered from a copy
of that compressed cache. Without a press each answer is generate()'s on the whole prompt; with one,
each is what a context compressed for that question alone gives (dense, quantized and bounded layers);
the press fires once per context; the run scores every question and records the compression once and
the compressed context's bytes; a bad file is one line before the model loads."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import DynamicCache

from kvpipe import model as models
from kvpipe.errors import ConfigError
from kvpipe.job.phases import eos_ids
from kvpipe.job.question_after_context import answers_after_context, generate_after_context
from kvpipe.job.runner import run_job
from kvpipe.measure.clock import TokenClock
from kvpipe.workload.base import Batch

from conftest import run_cli, spec_for

JOB = ("model=tiny_random", "tracking=off", "workload.warmup=0", "workload.repeats=1", "workload.max_new_tokens=5")
SHARED = (*JOB, "workload=shared_context", "workload.contexts=2", "workload.context_tokens=120", "workload.facts=3")
AGNOSTIC = "press.protocol=query_agnostic"


def context_and_questions(spec):
    loaded = models.load(spec.model)
    batch = spec.bound_workload.batches(loaded.tokenizer, "cpu")[0]
    return loaded, batch


def answered(loaded, batch, cache, new_tokens: int = 6):
    with torch.inference_mode():
        return answers_after_context(
            loaded.model, batch.input_ids, batch.questions, cache, TokenClock(False), new_tokens,
            eos_ids(loaded.model), True, loaded.tokenizer.pad_token_id,
        )  # fmt: skip


def test_without_a_press_each_answer_is_what_generate_gives_the_whole_prompt():
    loaded, batch = context_and_questions(spec_for(*SHARED))
    answers = answered(loaded, batch, DynamicCache())
    for question, new in zip(batch.questions, answers.new_tokens):
        whole = torch.cat([batch.input_ids, question], dim=1)
        with torch.inference_mode():
            expected = loaded.model.generate(
                input_ids=whole, attention_mask=torch.ones_like(whole), max_new_tokens=6, min_new_tokens=6,
                do_sample=False, pad_token_id=loaded.tokenizer.pad_token_id,
            )  # fmt: skip
        assert torch.equal(new, expected[:, whole.shape[1] :])


@pytest.mark.parametrize(
    "cache",
    [
        ("press=snapkv", "press.window=8"),
        ("press=streaming",),  # bounded: it evicts context tokens while a question is answered
        ("cache=quantized", "backend.residual_length=2", "backend.q_group_size=32", "press=knorm"),
        ("cache=quantized", "backend=hqq", "backend.residual_length=2", "backend.q_group_size=32", "press=knorm"),
    ],
)
def test_each_answer_from_the_copied_cache_is_the_answer_to_a_context_compressed_for_it_alone(cache):
    spec = spec_for(*SHARED, *cache, AGNOSTIC)
    loaded, batch = context_and_questions(spec)
    make = spec.strategy.setup(loaded, 200).make_cache
    answers = answered(loaded, batch, make())
    for question, new in zip(batch.questions, answers.new_tokens):
        whole = torch.cat([batch.input_ids, question], dim=1)
        alone = Batch(whole, torch.ones_like(whole), [""], question_tokens=question.shape[1])
        with torch.inference_mode():
            output, _ = generate_after_context(
                loaded.model, alone, make(), TokenClock(False), 6, eos_ids(loaded.model), True,
                loaded.tokenizer.pad_token_id,
            )  # fmt: skip
        assert torch.equal(new, output[:, whole.shape[1] :])


def test_the_press_fires_once_per_context_however_many_questions():
    spec = spec_for(*SHARED, "press=knorm", AGNOSTIC)
    loaded, batch = context_and_questions(spec)
    kept, keep = [], spec.strategy.press.keep
    spec.strategy.press.keep = lambda *args: kept.append(keep(*args)) or kept[-1]
    answered(loaded, batch, spec.strategy.setup(loaded, 200).make_cache())
    assert len(batch.questions) == 3
    assert len(kept) == loaded.shape.full_layers  # once per layer, not per question


def test_a_job_scores_every_question_and_records_the_compression_once_and_the_contexts_bytes():
    pressed = run_job(spec_for(*SHARED, "press=knorm", "press.ratio=0.5", AGNOSTIC, "quality=off"))
    plain = run_job(spec_for(*SHARED, "quality=off"))
    rows = pressed.scored.rows
    assert [(row["context"], row["question_number"]) for row in rows] == [(c, q) for c in (0, 1) for q in (0, 1, 2)]
    assert all(row["first_token_ms"] < row["answer_ms"] for row in rows)
    # each question an MLflow trace: the question stands for its (long) prompt
    assert [a.prompt for a in pressed.scored.answers] == [row["question"] for row in rows]
    metrics = pressed.metrics
    assert metrics["task_answers"] == 6 and 0 <= metrics["task_accuracy"] <= 1
    assert 0 < metrics["context_prefill_ms"] < metrics["ttft_ms"]
    context = int(metrics["prompt_tokens"])
    assert metrics["kv_cache_tokens"] == int(
        context * 0.5
    )  # the compressed context (kvpress's count), as questions found it
    assert plain.metrics["kv_cache_tokens"] == context
    assert metrics["kv_cache_bytes"] * context == plain.metrics["kv_cache_bytes"] * metrics["kv_cache_tokens"]


def test_the_bundled_example_hides_each_answer_in_its_context_and_asks_after_it():
    spec = spec_for(*SHARED)
    tokenizer = models.load_tokenizer(spec.model)
    for batch in spec.bound_workload.batches(tokenizer, "cpu"):
        context = tokenizer.decode(batch.input_ids[0])
        for question, ids in zip(batch.rows, batch.questions):
            (code,) = question.answers
            assert context.count(code) == 1
            assert code not in tokenizer.decode(ids[0])


def write(tmp_path, *lines) -> str:
    path = tmp_path / "contexts.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return str(path)


def test_a_users_file_is_its_contexts_and_questions(tmp_path):
    path = write(tmp_path, {"context": "Ada was born in 1815. Alan in 1912.",
                            "questions": [{"question": "When was Ada born?", "answer": 1815},
                                          {"question": "When was Alan born?", "answer": ["1912", "nineteen twelve"]}]})  # fmt: skip
    spec = spec_for(*JOB, "workload=shared_context", f"workload.path={path}")
    (batch,) = spec.bound_workload.batches(models.load_tokenizer(spec.model), "cpu")
    assert [q.answers for q in batch.rows] == [("1815",), ("1912", "nineteen twelve")]
    assert spec.params()["workload.path"] == path
    other_example = spec_for(*JOB, "workload=shared_context", f"workload.path={path}", "workload.facts=2")
    assert other_example.measurement_key() == spec.measurement_key()  # the bundled example's settings: unread


@pytest.mark.parametrize(
    "line, says",
    [
        ({"context": "text", "questions": [{"question": "Why?"}]}, "row 1 has no usable answer in column 'questions[0].answer'"),
        ({"context": "text", "questions": []}, "line 1 has no questions"),
        ({"questions": [{"question": "Why?", "answer": "no"}]}, "line 1 has no context text"),
    ],
)  # fmt: skip
def test_a_file_without_what_each_question_needs_is_one_line_naming_the_path(tmp_path, line, says):
    with pytest.raises(ConfigError) as refused:
        spec_for(*JOB, "workload=shared_context", f"workload.path={write(tmp_path, line)}")
    assert str(refused.value).startswith("workload.path=") and says in str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.slow  # starts kvpipe's command line
def test_a_questions_file_without_answers_exits_2_before_the_model_loads_and_writes_nothing(tmp_path):
    path = write(tmp_path, {"context": "text", "questions": [{"question": "Why?"}]})
    proc = run_cli(["model=tiny_random", "workload=shared_context", f"workload.path={path}"], tmp_path)
    (line,) = proc.stderr.strip().splitlines()
    assert proc.returncode == 2
    assert "workload.path=" in line and "no usable answer" in line
    assert not list(tmp_path.glob("outputs/**/result.json")) and not (tmp_path / "outputs" / "mlflow.db").exists()


@pytest.mark.parametrize(
    "overrides, field",
    [
        (("press=snapkv", "press.window=8"), "press.protocol"),  # the press would never see a question anyway
        (("workload.batch_size=2",), "workload.batch_size"),
        (("workload.do_sample=true",), "workload.do_sample"),
        (("workload.facts=0",), "workload.facts"),
        (("cache=static",), "cache.strategy"),  # written in place: its layers cannot be shared by forks
        (("load=offline",), "load.kind"),
    ],
)
def test_what_a_shared_context_cannot_run_is_one_line_naming_the_field(overrides, field):
    with pytest.raises(ConfigError) as refused:
        spec_for(*SHARED, *overrides)
    assert str(refused.value).startswith(f"{field}=")
