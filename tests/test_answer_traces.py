"""Each scored answer as an MLflow trace of its run (inputs the prompt, outputs the answer, the
expected answer as an expectation, and kvpipe's code verdicts as feedback: correct, the reference's
answer, flipped), for a fresh job and a `kvpipe sync` alike; and compare's list, per cache, of the
prompts that flipped to wrong against the reference's answers."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pandas as pd
import pytest
from test_dataset import dataset_spec, write_jsonl

from kvpipe.workload import Answer

from conftest import REPO

QUALITY = ("quality=on", "quality.windows=1", "quality.scored_tokens=4")


def answer(row: int, correct: bool, reference_correct: bool | None = None, **more) -> Answer:
    texts = {"prompt": f"question {row}?", "expected": ("yes",), "answer": "yes" if correct else "no"}
    reference = {} if reference_correct is None else {"reference_answer": "yes" if reference_correct else "no"}
    return Answer(row, 0, score=float(correct), correct=correct, reference_correct=reference_correct,
                  **{**texts, **reference, **more})  # fmt: skip


def test_an_answer_says_whether_it_flipped_against_the_reference():
    assert answer(0, False, True).flipped == "to_wrong"
    assert answer(0, True, False).flipped == "to_right"
    assert answer(0, True, True).flipped == answer(0, False, False).flipped == "no"
    assert answer(0, True).flipped is None  # no quality pass: nothing to flip against


def test_a_labelled_files_rows_are_declared_as_answers_right_from_half_a_score():
    from kvpipe import workload

    rows = [
        {"row": 3, "repeat": 0, "prompt": "Capital of France?", "expected": ["Paris", "paris city"],
         "answer": "Paris", "score": 1.0, "reference_answer": "Lyon", "reference_score": 0.0},
        {"row": 5, "repeat": 0, "prompt": "Two plus two?", "expected": ["4"], "answer": "four", "score": 0.4,
         "reference_answer": "4", "reference_score": 1.0},
    ]  # fmt: skip
    scored = workload.get("dataset")({"kind": "dataset", "scorer": "f1"}).scored(rows)
    assert scored.scorer == "f1"
    first, second = scored.answers
    assert (first.row, first.expected, first.correct, first.reference_answer) == (
        3,
        ("Paris", "paris city"),
        True,
        "Lyon",
    )
    assert (first.flipped, second.flipped, second.correct) == ("to_right", "to_wrong", False)


def test_passkey_answers_expect_their_key_and_are_right_where_it_was_found():
    from kvpipe.workload.passkey import retrieval

    rows = [
        {"context_tokens": 1000, "depth": 0.5, "trial": t, "repeat": r, "key": "4821", "answer": a, "found": a == "4821"}
        for r in (0, 1)
        for t, a in enumerate(["4821", "48"])
    ]  # fmt: skip
    answers = retrieval.answers(rows)
    assert [(a.row, a.repeat, a.correct, a.expected) for a in answers] == [
        (0, 0, True, ("4821",)), (1, 0, False, ("4821",)), (0, 1, True, ("4821",)), (1, 1, False, ("4821",))
    ]  # fmt: skip
    assert "depth 50% of 1,000 tokens" in answers[1].prompt and answers[1].flipped is None


def test_a_failed_trace_logging_is_one_warning_and_the_run_goes_on(monkeypatch, caplog):
    import mlflow

    from kvpipe.record import traces

    def refuse(*args, **kwargs):
        raise RuntimeError("the store went away\nsecond line")

    monkeypatch.setattr(mlflow, "start_span_no_context", refuse)
    with caplog.at_level(logging.WARNING, logger=traces.__name__):
        assert traces.log_answers("1", "run", [answer(0, True)], "contains", "dynamic") == 0
    (warning,) = caplog.records
    assert "RuntimeError: the store went away" in warning.getMessage() and "\n" not in warning.getMessage()


def recorded_runs(*points: str) -> pd.DataFrame:
    """Runs as compare reads them, after with_points: a judged run per point."""
    return pd.DataFrame({"run_id": list(points), "point": list(points), "answer_quality": [0.5] * len(points)})


def test_compare_lists_per_cache_the_prompts_that_flipped_to_wrong():
    from kvpipe.decide import flipped

    answers = {
        "dynamic": [answer(n, True, True) for n in range(3)],
        "quantized:quanto:int2": [answer(0, False, True, answer="a very long answer " * 10), answer(1, True, False),
                                  *(answer(n, False, True) for n in range(2, 2 + flipped.SHOWN + 2))],
    }  # fmt: skip
    counts, broken = flipped.sections(recorded_runs(*answers), answers.__getitem__)
    assert counts.rows == [
        ["dynamic", "3", "0", "0"],
        ["quantized:quanto:int2", str(flipped.SHOWN + 4), str(flipped.SHOWN + 3), "1"],
    ]
    assert len(broken.rows) == flipped.SHOWN  # the first few of each cache
    first = dict(zip(broken.columns, broken.rows[0]))
    assert first["cache"] == "quantized:quanto:int2" and first["row"] == "0" and first["prompt"] == "question 0?"
    assert (first["expected"], first["reference answered"]) == ("yes", "yes")
    assert first["answered"].startswith("a very long answer") and len(first["answered"]) == flipped.TEXT_CHARS


def test_compare_has_no_flipped_list_without_the_references_answers():
    from kvpipe.decide import flipped

    answers = {"dynamic": [answer(0, True)], "quantized": [answer(0, False)]}
    assert flipped.sections(recorded_runs(*answers), answers.__getitem__) == []


# --- real jobs on the tiny model, logged to an SQLite store and read back ----------------------------


@pytest.fixture(scope="module")
def labelled_jobs(tmp_path_factory):
    """Two jobs on a file whose expected answers are the reference's own (a dense cache's, read from
    a first job's quality pass), kept on disk (tracking=off): dense, whose answers all stay right, and
    2-bit quantized, whose changed answers flip to wrong."""
    from kvpipe.job.runner import run_job
    from kvpipe.record import recorder
    from kvpipe.record.result import Result
    from kvpipe.workload.dataset import scoring

    folder = tmp_path_factory.mktemp("labelled_jobs")
    questions = [json.loads(line) for line in (REPO / "examples" / "questions.jsonl").read_text().splitlines()][:8]
    lossy = ("cache=quantized", "backend.nbits=2", "axis.key=0")

    def job(path, name, *overrides):
        spec = dataset_spec(path, "workload.scorer=exact", *QUALITY, *overrides)
        return Result.load(recorder.record(spec, Result.finished(spec, run_job(spec)), folder / name, folder))

    first = job(write_jsonl(folder / "questions.jsonl", questions), "first", *lossy)
    # the reference's own answers become the expected ones: a changed answer is now a wrong one
    by_row = {row["row"]: row["reference_answer"] for row in first.answers}
    usable = [n for n in range(len(questions)) if scoring.SCORERS["exact"].unusable(by_row[n]) is None]
    expected = [{"prompt": questions[n]["prompt"], "answer": by_row[n]} for n in usable]
    path = write_jsonl(folder / "reference_answers.jsonl", expected)
    return SimpleNamespace(folder=folder, dense=job(path, "dense"), lossy=job(path, "lossy", *lossy))


def traced(uri: str) -> dict[str, list[dict]]:
    """Each run's traces read back (by run name): the prompt, answer, tags and assessments of each."""
    import mlflow

    mlflow.set_tracking_uri(uri)
    found = {}
    for run in mlflow.search_runs(search_all_experiments=True, output_format="list"):
        traces = mlflow.search_traces(locations=[run.info.experiment_id], run_id=run.info.run_id, return_type="list")
        found[run.info.run_name] = sorted(
            (
                {
                    "inputs": json.loads(trace.info.request_metadata["mlflow.traceInputs"]),
                    "outputs": json.loads(trace.info.request_metadata["mlflow.traceOutputs"]),
                    "run": trace.info.request_metadata["mlflow.sourceRun"] == run.info.run_id,
                    "tags": {k: v for k, v in trace.info.tags.items() if k.startswith("kvpipe.")},
                    "assessments": {a.name: (a.source.source_type, a.value) for a in trace.info.assessments},
                }
                for trace in traces
            ),
            key=lambda t: int(t["tags"]["kvpipe.row"]),
        )
    return found


@pytest.mark.slow  # three real jobs with their quality pass, then an MLflow store: ~40 s
def test_each_answer_is_a_trace_of_its_run_with_its_verdict_fresh_or_synced(labelled_jobs, existing_store):
    from kvpipe.record import recorder
    from kvpipe.record.sync import sync_one, target

    assert not (labelled_jobs.folder / "outputs").exists()  # tracking=off logged nothing
    fresh, synced = labelled_jobs.folder / "fresh", labelled_jobs.folder / "synced"
    stores = {
        name: f"sqlite:///{existing_store(folder, 'mlflow.db')}"
        for name, folder in (("fresh", fresh), ("synced", synced))
    }
    for result, name in ((labelled_jobs.dense, "dense"), (labelled_jobs.lossy, "lossy")):
        recorder.upload(target(result, stores["fresh"]), result, labelled_jobs.folder / name, fresh)
        result.mlflow_run_id = None  # the same result.json again, as `kvpipe sync` finds it
        sync_one(labelled_jobs.folder / name / "result.json", result, stores["synced"])
    logged = traced(stores["fresh"])
    assert logged == traced(stores["synced"])
    (lossy,) = [
        traces for name, traces in logged.items() if name.startswith(labelled_jobs.lossy.tags["cache.effective"])
    ]
    rows = sorted(labelled_jobs.lossy.answers, key=lambda row: row["row"])
    assert len(lossy) == len(rows) > 0
    for trace, row in zip(lossy, rows):
        assert trace["inputs"] == {"prompt": row["prompt"]} and trace["outputs"] == row["answer"] and trace["run"]
        assert trace["tags"] == {"kvpipe.cache": labelled_jobs.lossy.tags["cache.effective"],
                                 "kvpipe.row": str(row["row"]), "kvpipe.repeat": "0"}  # fmt: skip
        verdicts = trace["assessments"]
        assert verdicts["expected_response"][1] == row["expected"][0]
        assert verdicts["correct"] == ("CODE", row["score"] >= 0.5)
        assert verdicts["reference_answer"] == ("CODE", row["reference_answer"])
        was, now = row["reference_score"] >= 0.5, row["score"] >= 0.5
        assert verdicts["flipped"][1] == ("no" if was == now else "to_wrong" if was else "to_right")


@pytest.mark.slow  # the jobs above, logged and compared: ~10 s more
def test_compare_names_the_prompts_the_lossy_cache_broke(labelled_jobs, existing_store):
    from kvpipe.decide import compare
    from kvpipe.decide.runs import load_runs
    from kvpipe.record import recorder
    from kvpipe.record.sync import target

    store = f"sqlite:///{existing_store(labelled_jobs.folder / 'compared', 'mlflow.db')}"
    for result, name in ((labelled_jobs.dense, "dense"), (labelled_jobs.lossy, "lossy")):
        result.mlflow_run_id = None
        recorder.upload(target(result, store), result, labelled_jobs.folder / name, labelled_jobs.folder)
    runs, _ = load_runs("kvpipe", None, store, whole_experiment=True)
    shown = compare.shown(runs, "test")
    counts, broken = [s for s in shown.sections if s.title.startswith(("answers flipped", "prompts each cache"))]
    wrong = [row for row in sorted(labelled_jobs.lossy.answers, key=lambda r: r["row"]) if row["score"] < 0.5]
    assert wrong, "the 2-bit cache changed no answer: nothing to compare"
    lossy = labelled_jobs.lossy.tags["cache.effective"]
    (dense_counts, lossy_counts) = sorted(counts.rows, key=lambda row: row[0].startswith(lossy))
    assert dense_counts[0] == "dynamic" and dense_counts[1:] == [str(len(labelled_jobs.dense.answers)), "0", "0"]
    assert lossy_counts[2] == str(len(wrong))  # every wrong answer was right with the reference
    assert [row[1] for row in broken.rows] == [str(row["row"]) for row in wrong][: len(broken.rows)]
    assert all(row[0].startswith(lossy) for row in broken.rows)
