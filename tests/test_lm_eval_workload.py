"""workload=lm_eval: lm-evaluation-harness generate_until tasks, built and scored by lm-eval itself,
their answers generated through the job's cache; what cannot decode through a cache (loglikelihood,
multiple choice), an unknown task and a missing extra are one line before the model loads. Every task
here is a local YAML over a local JSONL (lm-eval's own tasks download their datasets)."""

from __future__ import annotations

import json
import sys

import pytest

from kvpipe.errors import ConfigError
from kvpipe.workload.lm_eval import scoring

from conftest import TINY, run_cli, spec_for

QUESTIONS = [{"question": "Capital of France?", "answer": "Paris"},
             {"question": "Two plus two?", "answer": "4"},
             {"question": "Colour of the sky?", "answer": "blue"}]  # fmt: skip
TASK = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: {output_type}
doc_to_text: "Q: {{{{question}}}}\\nA:"
doc_to_target: answer
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 5
filter_list:
  - name: first_word
    filter:
      - function: regex
        regex_pattern: "(\\\\w+)"
      - function: take_first
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: true
"""


def write_task(folder, name="tiny_questions", output_type="generate_until"):
    """A task YAML over a JSONL of QUESTIONS, in `folder` (the include path)."""
    folder.mkdir(exist_ok=True)
    data = folder / "questions.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in QUESTIONS))
    (folder / f"{name}.yaml").write_text(TASK.format(name=name, data=data, output_type=output_type))
    return folder


@pytest.fixture(scope="module")
def questions(tmp_path_factory):
    """The workload of a job on QUESTIONS, its tasks loaded once for the module's tests."""
    return lm_eval_spec(write_task(tmp_path_factory.mktemp("tasks"))).bound_workload


def lm_eval_spec(folder, *overrides: str, task="tiny_questions"):
    return spec_for(*TINY, "workload=lm_eval", f"workload.include_path={folder}", f"workload.tasks=[{task}]",
                    "workload.repeats=1", *overrides)  # fmt: skip


def test_without_lm_eval_the_workload_is_refused_naming_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # as if the eval extra were not installed
    with pytest.raises(ConfigError, match=r'workload.kind.*pip install -e "\.\[eval\]"') as error:
        lm_eval_spec(write_task(tmp_path / "tasks"))
    assert "\n" not in str(error.value)


def test_an_unknown_task_lists_what_the_include_path_offers(tmp_path):
    with pytest.raises(ConfigError, match=r"workload.tasks='nope'.*its tasks: tiny_questions"):
        lm_eval_spec(write_task(tmp_path / "tasks"), task="nope")


def test_a_loglikelihood_task_is_refused_saying_a_cache_never_changes_it(tmp_path):
    folder = write_task(tmp_path / "tasks", "scored_in_prefill", output_type="loglikelihood")
    with pytest.raises(ConfigError, match=r"workload.tasks='scored_in_prefill'.*one prefill.*never changes") as error:
        lm_eval_spec(folder, task="scored_in_prefill")
    assert "\n" not in str(error.value)


@pytest.mark.slow  # kvpipe's command line end to end: ~10 s
def test_a_refused_task_exits_2_before_the_model_loads_and_writes_nothing(tmp_path):
    folder = write_task(tmp_path / "tasks", "scored_in_prefill", output_type="loglikelihood")
    done = run_cli(["model=tiny_random", "workload=lm_eval", f"workload.include_path={folder}",
                    "workload.tasks=[scored_in_prefill]", "tracking=off"], tmp_path)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [next(line for line in done.stderr.splitlines() if "error" in line)]
    assert "loglikelihood" in done.stderr and "Traceback" not in done.stderr
    assert not list(tmp_path.rglob("result.json")) and not list(tmp_path.rglob("mlflow.db"))


@pytest.mark.parametrize("setting, value", [("limit", 0), ("num_fewshot", -1), ("include_path", "no/such/folder")])
def test_bad_settings_are_one_line_naming_the_field(tmp_path, setting, value):
    overrides = [f"workload.{setting}={value}"]
    with pytest.raises(ConfigError, match=f"workload.{setting}="):
        lm_eval_spec(write_task(tmp_path / "tasks"), *overrides)


def test_a_task_sets_its_answers_length_and_lm_eval_builds_its_prompts(questions):
    assert questions.common.ignore_eos is False  # an answer ends at end-of-sequence, as in lm-eval
    requests = questions.requests(tokenizer=None)
    assert [r.context for r in requests[:2]] == ["Q: Capital of France?\nA:", "Q: Two plus two?\nA:"]
    assert {(r.until, r.max_gen_toks) for r in requests} == {(("\n",), 5)}


def test_answers_are_cut_at_the_tasks_stop_sequences():
    assert scoring.cut(" Paris\nQ: next", ("\n",)) == " Paris"
    assert scoring.cut(" Paris. Then", ("\n", ".")) == " Paris"
    assert scoring.cut(" Paris", ("",)) == " Paris"  # an empty stop sequence cuts nothing, as in lm-eval


def test_lm_eval_filters_and_scores_the_answers(questions):
    workload = questions
    requests = workload.requests(tokenizer=None)
    texts = [" paris is it\nQ: more", " Four", " Blue sky"]  # right (any case), wrong, right
    rows = scoring.answer_rows(workload.lm_eval_tasks(), requests, texts)
    assert [row["answer"] for row in rows] == [" paris is it", " Four", " Blue sky"]
    assert [row["filtered"] for row in rows] == ["paris", "Four", "Blue"]  # the task's regex filter
    assert [row["score"] for row in rows] == [1.0, 0.0, 1.0]
    assert rows[0]["metrics"] == {"exact_match,first_word": 1.0}
    (figure,) = scoring.task_figures(workload.lm_eval_tasks(), rows)
    assert (figure["metric"], figure["filter"], figure["documents"]) == ("exact_match", "first_word", 3)
    assert figure["value"] == pytest.approx(2 / 3) and figure["stderr"] == pytest.approx((1 / 3) ** 0.5 / 3**0.5)
    scored = workload.scored(rows)
    assert scored.values()["task_accuracy"] == pytest.approx(2 / 3) and scored.values()["task_answers"] == 3
    # each answer declared for its MLflow trace, with its verdict and its task's one target
    assert [(a.answer, a.correct, len(a.expected)) for a in scored.answers] == [
        (" paris is it", True, 1), (" Four", False, 1), (" Blue sky", True, 1)
    ]  # fmt: skip


def test_a_changed_task_file_is_a_new_measurement(tmp_path):
    folder = write_task(tmp_path / "tasks")
    before = lm_eval_spec(folder).bound_workload.identity()
    (folder / "tiny_questions.yaml").write_text(
        (folder / "tiny_questions.yaml").read_text().replace("max_gen_toks: 5", "max_gen_toks: 12")
    )  # a new size: the digest is cached by size and mtime
    after = lm_eval_spec(folder).bound_workload.identity()
    assert before["include_digest"] != after["include_digest"]


@pytest.mark.slow  # a real job on the tiny model with its quality pass: ~5 s
def test_a_job_scores_its_answers_through_lm_eval_beside_the_reference(tmp_path):
    from kvpipe.job.runner import run_job

    spec = lm_eval_spec(write_task(tmp_path / "tasks"), "quality=on", "quality.windows=1", "quality.scored_tokens=4")
    job = run_job(spec)
    rows = job.scored.rows
    assert [row["doc_id"] for row in rows] == [0, 1, 2]
    assert all(len(row["answer"]) > 0 and "\n" not in row["answer"] for row in rows)
    accuracy = sum(row["score"] for row in rows) / len(rows)
    assert job.metrics["task_accuracy"] == pytest.approx(accuracy)
    # the dense cache is the reference itself: every answer is the reference's own
    assert all(row["reference_answer"] == row["answer"] for row in rows) and job.metrics["answers_changed"] == 0
    assert set(job.scored.tables) == {"lm_eval/answers.json", "lm_eval/tasks.json"}
    assert "end-of-sequence" in job.tags["generation"]


class TemplatedTokenizer:
    """A tokenizer whose chat template marks each turn, to see what lm-eval hands it."""

    def apply_chat_template(self, messages, tokenize, add_generation_prompt, continue_final_message):
        turns = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        return turns + ("<assistant>" if add_generation_prompt else "")


def test_apply_chat_template_renders_lm_evals_prompts_through_the_models_template(tmp_path):
    spec = lm_eval_spec(write_task(tmp_path / "tasks"), "workload.apply_chat_template=true", "workload.limit=1")
    (request,) = spec.bound_workload.requests(TemplatedTokenizer())
    assert request.context == "<user>Q: Capital of France?\nA:<assistant>"


def test_an_explicit_ignore_eos_is_kept(tmp_path):
    """workload.ignore_eos=true runs every call to its length, as the user asked; unset, calls stop at EOS."""
    spec = lm_eval_spec(write_task(tmp_path), "workload.ignore_eos=true")
    assert spec.bound_workload.common.ignore_eos is True
