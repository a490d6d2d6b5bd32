"""workload=dataset with a labelled file: each answer scored against the row's expected answer(s) by
workload.scorer, and the run's task_accuracy with its 95% interval; bad labels are one line before
the model loads."""

from __future__ import annotations

import json

import pytest
from test_dataset import dataset_spec, write_jsonl

from kvpipe import workload
from kvpipe.errors import ConfigError
from kvpipe.workload.dataset import scoring

LABELLED = [
    {"prompt": "What is two plus two?", "answer": "4"},
    {"prompt": "What is the capital of France?", "answer": ["Paris", "paris city"]},
    {"prompt": "Which colour is the sky?", "answer": "blue"},
]


@pytest.mark.parametrize(
    "scorer, answer, expected, score",
    [
        ("contains", "The capital is Paris.", "paris", 1.0),
        ("contains", "It is New York City", "the New-York", 0.0),  # punctuation joins words, as SQuAD's does
        ("contains", "It is New York City", "New York", 1.0),
        ("contains", "Parisian food", "Paris", 0.0),  # whole words only
        ("exact", "The Paris!", "paris", 1.0),
        ("exact", "Paris, France", "Paris", 0.0),
        ("number", "It is 1,234.0 apples", "1234", 1.0),
        ("number", "7, or maybe 8", "8", 0.0),  # the first number counts
        ("number", "no digits here", "3", 0.0),
        ("number", "It is -2.", "-2", 1.0),
        ("regex", "Answer: 42", r"\b4\d\b", 1.0),
        ("regex", "answer: 42", "^Answer", 0.0),  # as written: (?i) for any case
        ("f1", "the cat sat", "cat sat down", 0.8),  # precision 2/2, recall 2/3
        ("f1", "a dog", "cat", 0.0),
        # ROUGE-L F: the longest common subsequence "the cat on the mat", 5 of 6 words either way
        ("rouge_l", "the cat sat on the mat", "the cat is on the mat", 5 / 6),
        ("rouge_l", "The capital is Paris.", "paris", 0.4),  # precision 1/4, recall 1/1: articles count
        ("rouge_l", "mat the on", "on the mat", 1 / 3),  # a subsequence keeps order: one word in common in turn
        ("rouge_l", "cats", "cat", 0.0),  # no stemming
    ],
)
def test_each_scorer_scores_an_answer_against_an_expected_one(scorer, answer, expected, score):
    assert scoring.SCORERS[scorer].score(answer, expected) == pytest.approx(score)


def test_normalisation_is_squads():
    assert scoring.normalise("The  Quick, brown fox  ate AN apple!") == "quick brown fox ate apple"


def test_rouge_l_is_rouge_scores_own_figure():
    ours = scoring.SCORERS["rouge_l"].score("a x c e", "a b c d e")  # first: scoring imports rouge_score as it must
    from rouge_score import rouge_scorer

    reference = rouge_scorer.RougeScorer(["rougeL"]).score("a b c d e", "a x c e")["rougeL"].fmeasure
    assert ours == pytest.approx(reference)
    assert reference == pytest.approx(2 * (3 / 4) * (3 / 5) / (3 / 4 + 3 / 5))


def test_rouge_l_is_not_binary_so_its_interval_is_a_t_interval():
    rouge = scoring.SCORERS["rouge_l"]
    assert not rouge.binary
    assert scoring.interval(rouge, [0.4, 0.6, 0.5, 0.5]) == scoring.t_interval([0.4, 0.6, 0.5, 0.5])


def test_an_answer_keeps_its_best_score_over_the_accepted_answers():
    assert scoring.SCORERS["f1"].best("the cat sat", ["dog", "cat sat down", "cat sat"]) == 1.0
    assert scoring.SCORERS["contains"].best("Lutetia, now Paris", ["London", "Paris"]) == 1.0


def test_wilson_interval_of_known_proportions():
    assert scoring.wilson(8, 10) == pytest.approx((0.4902, 0.9433), abs=1e-4)
    low, high = scoring.wilson(0, 2)
    assert low == 0.0 and high == pytest.approx(0.6576, abs=1e-4)


def test_f1_takes_a_t_interval_within_zero_and_one():
    low, high = scoring.interval(scoring.SCORERS["f1"], [0.4, 0.6, 0.5, 0.5])
    assert (low, high) == pytest.approx((0.3701, 0.6299), abs=1e-4)  # 0.5 ± t(0.975, 3) · 0.0816 / 2
    assert scoring.interval(scoring.SCORERS["f1"], [0.0, 1.0, 0.5]) == pytest.approx((0.0, 1.0))
    assert scoring.interval(scoring.SCORERS["f1"], [0.7]) == (0.0, 1.0)


def test_task_accuracy_is_the_datasets_quality_metric_higher_is_better():
    quality = workload.quality_metrics()["dataset"]
    assert quality.metric.name == "task_accuracy" and quality.metric.lower_is_better is False
    assert quality.loss(0.75) == pytest.approx(0.25)


def test_a_labelled_file_is_scored_and_stops_at_eos(tmp_path):
    spec = dataset_spec(write_jsonl(tmp_path / "q.jsonl", LABELLED))
    assert (spec.workload.answer_field, spec.workload.scorer, spec.workload.ignore_eos) == ("answer", "contains", False)
    rows = spec.bound_workload.rows()
    assert [row.answers for row in rows] == [("4",), ("Paris", "paris city"), ("blue",)]
    params = spec.params()
    assert params["workload.scorer"] == "contains" and params["workload.ignore_eos"] == "false"


@pytest.mark.parametrize(
    "labelled, given, ignore_eos",
    [
        (True, (), False),  # an answer is the text before EOS: a labelled file stops there
        (True, ("workload.ignore_eos=true",), True),  # unless the user says otherwise
        (True, ("workload.ignore_eos=false",), False),
        (False, (), True),  # a file without answers runs to max_new_tokens, as every benchmark does
        (False, ("workload.ignore_eos=false",), False),
    ],
)
def test_a_labelled_file_stops_at_eos_unless_ignore_eos_is_set(tmp_path, labelled, given, ignore_eos):
    rows = LABELLED if labelled else [{"prompt": row["prompt"]} for row in LABELLED]
    spec = dataset_spec(write_jsonl(tmp_path / "q.jsonl", rows), *given)
    assert spec.workload.ignore_eos is ignore_eos
    assert spec.params()["workload.ignore_eos"] == str(ignore_eos).lower()


def test_ignore_eos_null_elsewhere_means_every_call_runs_to_max_new_tokens():
    from conftest import TINY, spec_for

    assert spec_for(*TINY, "workload=passkey", "workload.ignore_eos=null").workload.ignore_eos is True


def test_a_file_without_answers_reads_no_scoring_settings(tmp_path):
    spec = dataset_spec(write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a"}]))
    assert spec.workload.scorer is None and spec.workload.ignore_eos is True
    assert not any(name in spec.params() for name in ("workload.scorer", "workload.answer_field"))
    assert "scorer" not in spec.bound_workload.identity()


def test_answer_field_names_the_column_and_numbers_are_answers(tmp_path):
    path = write_jsonl(tmp_path / "q.jsonl", [{"prompt": "2+2?", "gold": 4}, {"prompt": "3+3?", "gold": [6, "6.0"]}])
    spec = dataset_spec(path, "workload.answer_field=gold", "workload.scorer=number")
    assert [row.answers for row in spec.bound_workload.rows()] == [("4",), ("6", "6.0")]


@pytest.mark.parametrize(
    "rows, overrides, message",
    [
        (LABELLED, ("workload.answer_field=gold",), r"workload.answer_field='gold' .*no such column; expected one of: prompt, answer"),
        (LABELLED, ("workload.scorer=exactly",), r"workload.scorer='exactly' .*expected one of: contains, exact, number, regex, f1, rouge_l; did you mean exact\?"),
        ([{"prompt": "a", "answer": "(unclosed"}], ("workload.scorer=regex",), r"workload.path=.*row 1's answer '\(unclosed' is not a regular expression"),
        ([{"prompt": "a", "answer": "x"}, {"prompt": "b", "answer": ""}], (), r"workload.path=.*row 2 has no usable answer in column 'answer'"),
        ([{"prompt": "a", "answer": []}], (), r"workload.path=.*row 1 has no usable answer in column 'answer'"),
        ([{"prompt": "a", "answer": "the"}], (), r"workload.path=.*row 1's answer 'the' normalises to nothing"),
        ([{"prompt": "a", "answer": "four"}], ("workload.scorer=number",), r"workload.path=.*row 1's answer 'four' is not a number"),
        ([{"prompt": "a", "answer": "日本"}], ("workload.scorer=rouge_l",), r"workload.path=.*row 1's answer '日本' has no ASCII letters or digits"),
        ([{"prompt": "a"}], ("workload.scorer=exact",), r"workload.scorer='exact' .*the file has no 'answer' column"),
    ],
)  # fmt: skip
def test_bad_labels_are_one_line_naming_the_field(tmp_path, rows, overrides, message):
    with pytest.raises(ConfigError, match=message) as error:
        dataset_spec(write_jsonl(tmp_path / "q.jsonl", rows), *overrides)
    assert "\n" not in str(error.value)


@pytest.mark.slow  # a real job on the tiny model with its quality pass, recorded: ~8 s
def test_a_labelled_job_records_its_scored_answers_and_accuracy_with_its_interval(tmp_path):
    from kvpipe.job.runner import run_job
    from kvpipe.record import recorder
    from kvpipe.record.result import Result

    quality = ("quality=on", "quality.windows=1", "quality.scored_tokens=4")
    spec = dataset_spec(
        write_jsonl(tmp_path / "q.jsonl", LABELLED), "workload.repeats=2", "workload.batch_size=2", *quality
    )
    job = run_job(spec)
    result = Result.load(recorder.record(spec, Result.finished(spec, job), tmp_path / "run", tmp_path))
    rows = sorted(result.answers, key=lambda row: row["row"])
    assert len(rows) == len(LABELLED)  # greedy repeats write the same answers: counted once
    for row, labelled in zip(rows, LABELLED):
        accepted = labelled["answer"] if isinstance(labelled["answer"], list) else [labelled["answer"]]
        assert row["prompt"] == labelled["prompt"] and row["expected"] == accepted
        assert row["score"] == scoring.SCORERS["contains"].best(row["answer"], row["expected"])
    right = sum(row["score"] for row in rows)
    metrics = result.metrics
    assert metrics["task_accuracy"] == pytest.approx(right / len(rows)) and metrics["task_answers"] == len(rows)
    assert (metrics["task_accuracy_ci_low"], metrics["task_accuracy_ci_high"]) == pytest.approx(
        scoring.wilson(right, len(rows))
    )
    assert metrics["task_accuracy_ci_low"] <= metrics["task_accuracy"] <= metrics["task_accuracy_ci_high"]
    assert list(spec.bound_workload.scored(result.answers).tables) == ["answers/answers.json"]
    assert "end-of-sequence" in result.tags["generation"]
    # the dense cache is the reference itself: every answer is the reference's own
    assert all(row["reference_answer"] == row["answer"] for row in rows)
    assert (metrics["answers_changed"], metrics["flipped_to_wrong"], metrics["flipped_to_right"]) == (0, 0, 0)
    assert metrics["reference_accuracy"] == metrics["task_accuracy"]  # the reference's answers, judged alike
    assert all(0 < row["answer_tokens"] == row["reference_tokens"] <= 32 for row in rows)  # ran to EOS or the cap
    assert metrics["output_length_ratio"] == 1.0


@pytest.mark.slow  # a real job on the tiny model with its quality pass: ~5 s
def test_ignore_eos_true_on_a_labelled_file_scores_all_it_wrote_and_says_so(tmp_path):
    from kvpipe.job.runner import run_job
    from kvpipe.record.result import Result

    quality = ("quality=on", "quality.windows=1", "quality.scored_tokens=4")
    spec = dataset_spec(write_jsonl(tmp_path / "q.jsonl", LABELLED), "workload.ignore_eos=true", *quality)
    result = Result.finished(spec, run_job(spec))
    assert all(row["answer_tokens"] == row["reference_tokens"] == 6 for row in result.answers)  # EOS held back
    assert "output_length_ratio" not in result.metrics  # 1 by construction: it would say nothing
    assert "task_accuracy" in result.metrics and "answers_changed" in result.metrics
    assert "held back" in result.tags["generation"] and "every token generated" in result.tags["generation"]


def test_answers_beside_the_references_count_changes_and_flips():
    from kvpipe.workload.dataset import labelled

    rows = [
        {
            "row": n,
            "expected": ["paris"],
            "answer": answer,
            "score": scoring.SCORERS["contains"].best(answer, ["paris"]),
        }
        for n, answer in enumerate(["Paris.", "Paris", "Rome", "London", "paris"])
    ]
    reference = {0: "Paris.", 1: "It is Paris", 2: "Paris", 3: "Lyon", 4: "Berlin"}
    found = labelled.figures(
        labelled.with_reference(rows, reference, scoring.SCORERS["contains"]), scoring.SCORERS["contains"]
    )
    assert found["answers_changed"] == pytest.approx(4 / 5)  # only row 0 wrote the reference's very text
    assert (found["flipped_to_wrong"], found["flipped_to_right"]) == (1, 1)  # row 2 lost it, row 4 found it
    assert "answers_changed" not in labelled.figures(rows, scoring.SCORERS["contains"])  # no quality pass: none


def test_output_length_ratio_is_the_answers_tokens_over_the_references_summed():
    from kvpipe.workload.dataset import labelled

    rows = [
        {"row": n, "expected": ["x"], "answer": "x", "score": 1.0, "answer_tokens": t} for n, t in enumerate([6, 2, 4])
    ]
    reference = {n: "x" for n in range(3)}
    contains = scoring.SCORERS["contains"]
    found = labelled.figures(labelled.with_reference(rows, reference, contains, {0: 3, 1: 0, 2: 5}), contains)
    assert found["output_length_ratio"] == pytest.approx(12 / 8)  # the reference's empty answer divides nothing
    silent = labelled.with_reference(rows, reference, contains, {0: 0, 1: 0, 2: 0})
    assert "output_length_ratio" not in labelled.figures(silent, contains)  # nothing to compare with
    older = labelled.with_reference(rows, reference, contains)  # rows recorded before lengths were kept
    assert "output_length_ratio" not in labelled.figures(older, contains) and "answers_changed" in labelled.figures(
        older, contains
    )


def task_runs(*rows: tuple[str, float, float]):
    """Recorded runs of a labelled file, as MLflow's runs frame holds them: (cache, TPOT ms, task accuracy)."""
    import pandas as pd

    from kvpipe.decide import runs as recorded

    records = [
        {
            "run_id": f"run{i}",
            "params.cache.strategy": cache,
            "params.workload.kind": "dataset",
            "metrics.tpot_ms": tpot_ms,
            "metrics.peak_memory_bytes": 1e9,
            "metrics.weights_bytes": 5e8,
            "metrics.task_accuracy": accuracy,
        }
        for i, (cache, tpot_ms, accuracy) in enumerate(rows)
    ]
    return recorded.with_derived(pd.DataFrame(records))


def test_min_accuracy_and_the_front_judge_labelled_runs_by_task_accuracy():
    from kvpipe.decide.limits import Limits
    from kvpipe.decide.recommend import choose

    runs = task_runs(("dynamic", 40.0, 0.5), ("static", 30.0, 0.9))
    assert list(runs["answer_quality"]) == [0.5, 0.9]
    assert list(runs["pareto"]) == [False, True]  # static is faster and answers better
    chosen, (what, _) = choose(runs, Limits(accuracy=0.8))
    assert chosen["strategy"] == "static" and "task accuracy 90% (at least 80%)" in what
    assert Limits(accuracy=0.8).misses(runs.iloc[0]) == {"accuracy": pytest.approx(1 - 0.5 / 0.8)}


@pytest.mark.slow  # a real served job on the tiny model with its quality pass: ~6 s
@pytest.mark.parametrize("cache", ["dynamic", "paged"])
def test_answers_served_under_a_load_are_scored_as_a_batch_jobs_are(tmp_path, cache):
    from kvpipe.job.runner import run_job
    from kvpipe.record.result import Result

    # six requests over three prompts, two in flight: every served request's answer is scored
    load = ("load=concurrency", "load.concurrency=2", "load.requests=6")
    spec = dataset_spec(write_jsonl(tmp_path / "q.jsonl", LABELLED), f"cache={cache}", *load, "quality=off")
    result = Result.finished(spec, run_job(spec))
    rows = result.answers
    assert len(rows) == 6 and sorted({row["row"] for row in rows}) == [0, 1, 2]  # numbered from 0 inside
    for row in rows:
        assert row["score"] == scoring.SCORERS["contains"].best(row["answer"], row["expected"])
    right = sum(row["score"] for row in rows)
    assert result.metrics["task_accuracy"] == pytest.approx(right / 6) and result.metrics["task_answers"] == 6


@pytest.mark.slow  # a batch job and a served one on the tiny model: ~4 s
def test_a_pressed_cache_under_a_load_serves_one_request_per_call_and_answers_as_batch_by_batch(tmp_path):
    from kvpipe.job.runner import run_job
    from kvpipe.record.result import Result

    path = write_jsonl(tmp_path / "q.jsonl", LABELLED)
    press = ("press=snapkv", "press.ratio=0.5", "press.window=4", "quality=off", "workload.max_new_tokens=6")
    alone = Result.finished(spec := dataset_spec(path, *press), run_job(spec))
    load = ("load=concurrency", "load.concurrency=3", "load.requests=3")  # all three could be in flight
    served = Result.finished(spec := dataset_spec(path, *press, *load), run_job(spec))
    # each prompt pressed alone, as a batch job presses it: the same answers, one request in flight
    assert [row["answer"] for row in served.answers] == [row["answer"] for row in alone.answers]
    assert served.metrics["max_in_flight"] == 1 and served.metrics["task_answers"] == 3
    assert any("served one request per call" in note for note in served.notes)


@pytest.mark.parametrize(
    "overrides, field, says",
    [
        (("press.protocol=query_agnostic",), "press.protocol", "each request's prompt is pressed whole"),
        (("workload=conversation",), "press.name", "which a press would compress again"),
    ],
)
def test_what_a_press_cannot_do_under_a_load_is_one_line_naming_the_field(overrides, field, says):
    from conftest import TINY, spec_for

    with pytest.raises(ConfigError, match=field) as refused:
        spec_for(*TINY, "press=snapkv", "load=concurrency", *overrides)
    assert says in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.slow  # a served job on the tiny model, recorded in MLflow: ~10 s
def test_a_served_run_keeps_every_request_judged_and_counts_goodput_of_right_answers(tmp_path, existing_store):
    import mlflow

    from kvpipe.measure.request_figures import percentile
    from kvpipe.record.result import Result

    from conftest import kvpipe_here

    # regex answers: "." is right for any answer but an empty one, "^$" for an empty one only
    rows = [{"prompt": "Say something.", "answer": "."}, {"prompt": "Say nothing.", "answer": "^$"}]
    write_jsonl(tmp_path / "q.jsonl", rows)
    existing_store(tmp_path)
    load = ("load=concurrency", "load.concurrency=2", "load.requests=4", "load.max_ttft_ms=60000")
    tiny = ("model=tiny_random", "model.threads=1", "workload.max_new_tokens=4", "workload.warmup=0", "quality=off")
    args = [*tiny, "workload=dataset", "workload.path=q.jsonl", "workload.scorer=regex", *load, "workload.repeats=2"]
    done = kvpipe_here(args, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = next((tmp_path / "outputs" / "runs").glob("*/*"))
    result = Result.load(run_dir / "result.json")
    served = result.requests
    assert len(served) == 2 * 4 and {r["pass"] for r in served} == {0, 1}
    # the first pass's verdicts are its scored answers' (greedy answers are scored once: the first pass)
    assert [r["correct"] for r in served if r["pass"] == 0] == [a.correct for a in result.scored().answers]
    span_s = result.metrics["serve_span_ms"] * 2 / 1e3
    right = sum(r["correct"] and r["within_targets"] for r in served)
    assert result.metrics["goodput_correct_requests_per_s"] == pytest.approx(right / span_s)
    assert result.metrics["goodput_requests_per_s"] == pytest.approx(8 / span_s)  # every request met 60 s
    ttft = [r["ttft_ms"] for r in served]
    assert percentile(ttft, 0.9) == pytest.approx(result.metrics["ttft_p90_ms"], abs=1e-3)
    # beside result.json, and in the run's MLflow artifacts
    assert (run_dir / "requests.trace.json").is_file() and (run_dir / "requests_timeline.png").is_file()
    trace = json.loads((run_dir / "requests.trace.json").read_text())  # each pass named with the load it met
    passes = [e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"]
    assert len(passes) == 2 and all(
        p.endswith(f" · {result.tags['load']} · pass {i + 1}") for i, p in enumerate(passes)
    )
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    logged = {a.path for a in mlflow.MlflowClient().list_artifacts(result.mlflow_run_id, "requests")}
    assert logged == {"requests/requests.json", "requests/requests.trace.json", "requests/requests_timeline.png"}
    table = mlflow.artifacts.load_dict(f"runs:/{result.mlflow_run_id}/requests/requests.json")  # MLflow's table form
    assert [row[table["columns"].index("correct")] for row in table["data"]] == [r["correct"] for r in served]
