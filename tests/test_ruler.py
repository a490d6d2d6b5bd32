"""workload=ruler: RULER's synthetic tasks at exact token lengths on any tokenizer, seeded, scored as
RULER scores them, with its question named for a press that compresses the context alone."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from test_prompts_as_the_model_expects import BOS, PLAIN_TEMPLATE, build_tokenizer, leading_bos

from kvpipe import model as models
from kvpipe.errors import ConfigError
from kvpipe.workload._encoding import template_parts
from kvpipe.workload.ruler import qa, scoring, tasks
from kvpipe.workload.ruler.tasks import TASKS

from conftest import run_cli, spec_for

RULER = ("workload=ruler", "workload.samples=1")


@pytest.fixture(scope="module")
def tokenizer():
    return models.load_tokenizer(spec_for("model=tiny_random").model)


def materials(tokenizer, seed=0, haystack_path=None):
    return tasks.Materials(tokenizer, haystack_path, qa.read(None), seed)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("length", [1024, 2048])
def test_every_task_lands_on_its_exact_token_count_with_its_answers_in_the_context(tokenizer, task, length):
    prompt = tasks.prompt(task, materials(tokenizer), length, sample=1)
    assert len(prompt.input_ids) == length
    context = tokenizer.decode(prompt.input_ids[: -prompt.question_tokens])
    if task.startswith("qa"):
        assert any(answer in context for answer in prompt.expected)
    else:
        assert all(answer in context for answer in prompt.expected), (task, prompt.expected)


@pytest.mark.parametrize("adds_bos", [True, False], ids=["adds BOS", "no BOS"])
@pytest.mark.parametrize("task", TASKS)
def test_lengths_stay_exact_with_bos_once_on_another_tokenizer(task, adds_bos):
    other = build_tokenizer(adds_bos, PLAIN_TEMPLATE)  # word-level: every word one token (most unknown)
    ids = tasks.prompt(task, materials(other), 1500, sample=0).input_ids
    assert len(ids) == 1500 and leading_bos(ids) == (1 if adds_bos else 0) and BOS not in ids[1:]


def test_question_tokens_are_the_question_the_template_suffix_and_the_answer_prefix(tokenizer):
    _, after = template_parts(tokenizer)
    for task in TASKS:
        prompt = tasks.prompt(task, materials(tokenizer), 1024, sample=0)
        tail = tokenizer.decode(prompt.input_ids[-prompt.question_tokens :])
        assert tail.startswith("\n") and prompt.question in tail and after in tail, (task, tail)
        before_tail = tokenizer.decode(prompt.input_ids[-prompt.question_tokens - 20 : -prompt.question_tokens])
        assert prompt.question not in before_tail
    vt = tasks.prompt("vt", materials(tokenizer), 1024, sample=0)
    assert tokenizer.decode(vt.input_ids[-vt.question_tokens :]).endswith("they are: ")


def test_prompts_are_the_same_for_the_same_seed_and_differ_between_samples_and_seeds(tokenizer):
    same = [tasks.prompt("niah_multikey_1", materials(tokenizer), 1024, 0).input_ids for _ in range(2)]
    assert same[0] == same[1]
    other_sample = tasks.prompt("niah_multikey_1", materials(tokenizer), 1024, 1)
    other_seed = tasks.prompt("niah_multikey_1", materials(tokenizer, seed=1), 1024, 0)
    assert other_sample.input_ids != same[0] and other_seed.input_ids != same[0]
    assert other_sample.expected != other_seed.expected


def test_niah_questions_ask_for_keys_whose_values_the_question_does_not_hold(tokenizer):
    single = tasks.prompt("niah_single_2", materials(tokenizer), 1024, 0)
    assert single.question.startswith("What is the special magic number for") and len(single.expected) == 1
    assert single.expected[0].isdigit() and len(single.expected[0]) == 7
    many = tasks.prompt("niah_multiquery", materials(tokenizer), 1024, 0)
    assert many.question.startswith("What are all the special magic numbers for") and len(many.expected) == 4
    assert not any(value in many.question for value in many.expected)
    uuids = tasks.prompt("niah_multikey_3", materials(tokenizer), 1024, 0)
    assert len(uuids.expected[0]) == 36 and uuids.expected[0].count("-") == 4


def test_cwe_and_fwe_answers_are_the_most_frequent_words_of_their_lists(tokenizer):
    cwe = tasks.prompt("cwe", materials(tokenizer), 1024, 0)
    listed = tokenizer.decode(cwe.input_ids[: -cwe.question_tokens]).split(
        "Memorize the ones that appear most often.\n"
    )[-1]
    words = [item.split(" ")[0] for item in listed.split(". ")[1:]]
    counts = {word: words.count(word) for word in set(words)}
    assert sorted(cwe.expected) == sorted(sorted(counts, key=counts.get, reverse=True)[:10])
    assert min(counts[word] for word in cwe.expected) > max(c for w, c in counts.items() if w not in cwe.expected)
    fwe = tasks.prompt("fwe", materials(tokenizer), 1024, 0)
    coded = tokenizer.decode(fwe.input_ids[: -fwe.question_tokens]).split("coded words. ")[-1].split()
    ranked = sorted(set(coded), key=coded.count, reverse=True)
    assert ranked[0] == "..." and ranked[1:4] == list(fwe.expected)


# --- scoring ------------------------------------------------------------------------------------------


def ruler_string_match_all(preds, refs):  # RULER's scripts/eval/synthetic/constants.py, verbatim
    score = sum([sum([1.0 if r.lower() in pred.lower() else 0.0 for r in ref]) / len(ref) for pred, ref in zip(preds, refs)]) / len(preds) * 100  # fmt: skip  # noqa: E501
    return round(score, 2)


def ruler_string_match_part(preds, refs):
    score = sum([max([1.0 if r.lower() in pred.lower() else 0.0 for r in ref]) for pred, ref in zip(preds, refs)]) / len(preds) * 100  # fmt: skip  # noqa: E501
    return round(score, 2)


PREDS = ["1234567 and 7654321", "The numbers are 1234567.", "none", "GREEN-apple, 42", "lake wenlow"]
REFS = [["1234567", "7654321"], ["1234567", "7654321"], ["1234567"], ["green-apple", "43"], ["Lake Wenlow", "Wenlow"]]


def test_scores_match_rulers_own_functions_on_known_strings():
    ours_all = [scoring.string_match_all(p, r) for p, r in zip(PREDS, REFS)]
    ours_part = [scoring.string_match_part(p, r) for p, r in zip(PREDS, REFS)]
    assert ours_all == [1.0, 0.5, 0.0, 0.5, 1.0] and ours_part == [1.0, 1.0, 0.0, 1.0, 1.0]
    assert round(100 * sum(ours_all) / len(PREDS), 2) == ruler_string_match_all(PREDS, REFS)
    assert round(100 * sum(ours_part) / len(PREDS), 2) == ruler_string_match_part(PREDS, REFS)


def _row(task, length, score):
    return {"task": task, "context_tokens": length, "sample": 0, "repeat": 0, "question": "What is it?",
            "expected": ["1234"], "answer": "1234" if score else "", "score": score,
            "ttft_ms": 10.0, "tpot_ms": 1.0, "kv_cache_bytes": 100}  # fmt: skip


def test_the_suite_averages_its_tasks_and_every_accuracy_has_a_wilson_interval():
    rows = [_row("vt", 1024, 1.0), _row("vt", 1024, 1.0), _row("cwe", 1024, 0.5), _row("cwe", 1024, 0.0)]
    figures = scoring.figures(rows)
    assert figures["ruler_vt_accuracy"] == 1.0 and figures["ruler_cwe_accuracy"] == 0.25
    assert figures["ruler_accuracy"] == pytest.approx(0.625) and figures["ruler_answers"] == 4
    assert figures["ruler_vt_accuracy_ci_high"] == 1.0 and 0 < figures["ruler_vt_accuracy_ci_low"] < 1
    assert figures["ruler_accuracy_ci_low"] < 0.625 < figures["ruler_accuracy_ci_high"]
    nothing = scoring.figures([_row("vt", 1024, 0.0)] * 3)
    assert nothing["ruler_accuracy"] == 0 and nothing["ruler_accuracy_ci_low"] == 0 < nothing["ruler_accuracy_ci_high"]


def test_answers_are_cut_at_end_of_sequence_and_scored_by_their_tasks_rule(tokenizer):
    eos = tokenizer.eos_token_id
    say = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    prompt = lambda task, expected: SimpleNamespace(task=task, context_tokens=1024, sample=0, question="?",  # noqa: E731
                                                    expected=expected)  # fmt: skip
    batch = SimpleNamespace(
        rows=[prompt("niah_multivalue", ("1111111", "2222222")), prompt("qa_1", ("Thursday", "Thu"))]
    )
    first = say(" 1111111 and") + [eos] + say(" 2222222")
    second = say(" On Thursday.") + [eos]
    second += [eos] * (len(first) - len(second))
    call = SimpleNamespace(new_tokens=torch.tensor([first, second]), timing=SimpleNamespace(ttft_ms=5.0, tpot_ms=1.0),
                           kv_bytes=10)  # fmt: skip
    rows = scoring.score(tokenizer, {eos}, [batch], [call], {name: task.match for name, task in TASKS.items()})
    assert [(r["answer"], r["score"]) for r in rows] == [("1111111 and", 0.5), ("On Thursday.", 1.0)]


def test_a_recorded_result_scores_again_with_per_task_metrics_steps_and_its_heatmap():
    from kvpipe.record.result import Result

    rows = [
        _row("niah_single_1", 512, 1.0),
        _row("niah_single_1", 1024, 0.0),
        _row("vt", 512, 1.0),
        _row("vt", 1024, 1.0),
    ]
    scored = Result(status="FINISHED", config={"workload": {"kind": "ruler"}}, answers=rows).scored()
    values = scored.values()
    assert values["ruler_niah_single_1_accuracy"] == 0.5 and values["ruler_vt_accuracy"] == 1.0
    steps = {(step.series, step.step): step.value for step in scored.steps}
    assert steps[("ruler_accuracy/all_tasks", 1024)] == 0.5 and steps[("ruler_accuracy/task_vt", 512)] == 1.0
    assert [(f.name, f.artifact_dir) for f in scored.files] == [("ruler_heatmap.png", "ruler")]
    # each answer for its MLflow trace: right where its score reaches half, its prompt named by task and length
    assert [(a.correct, a.prompt) for a in scored.answers][:2] == [
        (True, "niah_single_1, 512 tokens, sample 0: What is it?"),
        (False, "niah_single_1, 1,024 tokens, sample 0: What is it?"),
    ]


def test_the_heatmap_is_drawn_with_a_row_per_task_and_a_column_per_length(tmp_path):
    from kvpipe.workload import _heatmap
    from kvpipe.workload.ruler.heatmap import LAYOUT

    cells = scoring.cells([_row(task, n, 0.5) for task in ("vt", "niah_single_1", "qa_2") for n in (512, 1024)])
    path = _heatmap.save(cells, LAYOUT, tmp_path / "ruler_heatmap.png", "a run")
    assert path.stat().st_size > 5000 and LAYOUT.down_order({"vt", "qa_2", "niah_single_1"}) == [
        "niah_single_1",
        "vt",
        "qa_2",
    ]


# --- the workload: settings, batches, bad input -----------------------------------------------------------


def test_tasks_keep_the_suites_order_and_lengths_are_sorted(tiny_spec):
    spec = tiny_spec(*RULER, "workload.tasks=[vt,niah_single_1]", "workload.context_tokens=[900,300]")
    assert spec.workload.tasks == ["niah_single_1", "vt"] and spec.workload.context_tokens == [300, 900]


def test_batches_name_their_question_and_answer_in_each_tasks_own_length(tiny_spec, tokenizer):
    spec = tiny_spec(*RULER, "workload.tasks=[niah_single_1,vt]", "workload.context_tokens=[400]",
                     "workload.samples=3", "workload.batch_size=3", "workload.max_new_tokens=64")  # fmt: skip
    batches = spec.bound_workload.batches(tokenizer, "cpu")
    assert sum(b.input_ids.shape[0] for b in batches) == 6 and all(b.prompt_tokens == 400 for b in batches)
    for batch in batches:
        assert {p.question_tokens for p in batch.rows} == {batch.question_tokens}
        assert batch.max_new_tokens == (64 if batch.rows[0].task.startswith("niah") else 30)  # RULER's vt: 30


@pytest.mark.parametrize(
    "override, message",
    [
        ("workload.tasks=[niah_single_9]", r"^workload.tasks='niah_single_9' .*niah_single_1"),
        ("workload.tasks=[]", r"^workload.tasks=\[\] .*expected some of niah_single_1"),
        ("workload.samples=0", r"^workload.samples=0 .*expected a positive integer"),
        ("workload.context_tokens=[0]", r"^workload.context_tokens=\[0\] .*expected a positive integer"),
        ("workload.haystack_path=/nonexistent.txt", r"^workload.haystack_path='/nonexistent.txt' .*exists"),
    ],
)
def test_bad_settings_name_their_field_and_what_is_allowed(tiny_spec, override, message):
    with pytest.raises(ConfigError, match=message):
        tiny_spec(*RULER, override)


def test_a_length_too_short_for_a_task_names_the_length_it_needs(tiny_spec, tokenizer):
    workload = tiny_spec(*RULER, "workload.tasks=[niah_multiquery]", "workload.context_tokens=[120]").bound_workload
    with pytest.raises(ConfigError, match=r"^workload.context_tokens=120 .*at least \d+ for task niah_multiquery"):
        workload.batches(tokenizer, "cpu")


def test_a_qa_file_without_answers_or_without_multi_document_rows_is_named(tiny_spec, tmp_path):
    no_answers = tmp_path / "no_answers.jsonl"
    no_answers.write_text(json.dumps({"context": "Some text.", "question": "What?"}) + "\n")
    with pytest.raises(ConfigError, match=r"^workload.qa_path=.*row 1 has no answers; expected .*answers"):
        tiny_spec(*RULER, "workload.tasks=[qa_1]", f"workload.qa_path={no_answers}")
    single = tmp_path / "single.jsonl"
    single.write_text(json.dumps({"context": "Some text.", "question": "What?", "answers": ["text"]}) + "\n")
    assert tiny_spec(*RULER, "workload.tasks=[qa_1]", f"workload.qa_path={single}").workload.tasks == ["qa_1"]
    with pytest.raises(ConfigError, match=r"^workload.qa_path=.*no row with several documents.*qa_2"):
        tiny_spec(*RULER, "workload.tasks=[qa_2]", f"workload.qa_path={single}")


def test_the_users_own_qa_rows_and_haystack_make_the_prompts(tiny_spec, tokenizer, tmp_path):
    rows = tmp_path / "qa.jsonl"
    rows.write_text(json.dumps({"context": "Zorbel is purple.", "question": "What colour is Zorbel?",
                                "answers": ["purple"]}) + "\n")  # fmt: skip
    haystack = tmp_path / "haystack.txt"
    haystack.write_text("Ducks paddle across the quiet millpond at dawn. " * 400)
    spec = tiny_spec(*RULER, "workload.tasks=[qa_1,niah_single_2]", "workload.context_tokens=[600]",
                     f"workload.qa_path={rows}", f"workload.haystack_path={haystack}")  # fmt: skip
    niah_prompt, qa_prompt = spec.bound_workload.prompts(tokenizer)  # in the suite's order
    assert "Zorbel is purple." in tokenizer.decode(qa_prompt.input_ids) and qa_prompt.question.endswith("Zorbel?")
    assert "millpond" in tokenizer.decode(niah_prompt.input_ids) and len(niah_prompt.input_ids) == 600
    assert "haystack_digest" in spec.bound_workload.identity() and "qa_digest" in spec.bound_workload.identity()


def test_a_haystack_file_too_short_for_the_length_says_how_long_it_is(tiny_spec, tokenizer, tmp_path):
    haystack = tmp_path / "short.txt"
    haystack.write_text("Only a few words here.")
    workload = tiny_spec(*RULER, "workload.tasks=[niah_single_2]", "workload.context_tokens=[600]",
                         f"workload.haystack_path={haystack}").bound_workload  # fmt: skip
    with pytest.raises(ConfigError, match=r"^workload.haystack_path=.* holds \d+ tokens; expected at least \d+"):
        workload.batches(tokenizer, "cpu")


def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path):
    proc = run_cli(["model=tiny_random", "tracking=off", *RULER, "workload.tasks=[niah_singel_1]"], cwd=tmp_path)
    assert proc.returncode == 2 and "workload.tasks='niah_singel_1'" in proc.stderr and "niah_single_1" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.rglob("result.json")) and not list(tmp_path.rglob("*.db"))  # Hydra's own log at most


# --- a ruler sweep, recorded and compared -------------------------------------------------------------------

RULER_SWEEP = ["-m", "model=tiny_random", "workload=ruler", "workload.context_tokens=[300,400]",
               "workload.tasks=[niah_single_1,vt]", "workload.samples=1", "workload.max_new_tokens=2",
               "workload.warmup=0", "quality=off", "cache=dynamic,quantized", "backend=hqq", "backend.nbits=2"]  # fmt: skip


@pytest.mark.slow  # a sweep of two real jobs, recorded in MLflow, then compared
def test_a_sweep_records_every_answer_and_compare_shows_tasks_by_length_with_heatmaps(tmp_path, existing_store):
    from kvpipe.record.result import iter_results

    existing_store(tmp_path)
    proc = run_cli(RULER_SWEEP, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (sweep_dir,) = (tmp_path / "outputs" / "multiruns").glob("*/*")
    for path, result in iter_results(sweep_dir):
        assert {(row["task"], row["context_tokens"]) for row in result.answers} == {
            (task, n) for task in ("niah_single_1", "vt") for n in (300, 400)
        }
        assert result.metrics["ruler_answers"] == 4 and "ruler_vt_accuracy" in result.metrics
        assert (path.parent / "ruler_heatmap.png").stat().st_size > 5000
    section = (sweep_dir / "compare.md").read_text().split("## RULER accuracy by task and context length")[1]
    header, _, *rows = [line for line in section.strip().splitlines() if line.startswith("|")]
    assert all(
        column in header for column in ("cache", "task", "300 tokens", "400 tokens", "all lengths (95% interval)")
    )
    assert all("% (" in row for row in rows)  # each task's accuracy over every length, with its interval
    assert len(rows) == 6 and sum("mean over tasks" in row for row in rows) == 2  # 2 tasks + the mean, per run
    assert (sweep_dir / "ruler_heatmaps.png").stat().st_size > 5000
