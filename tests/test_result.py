"""result.json through one type: written atomically, read back whole, found in a sweep directory."""

from __future__ import annotations

import json

from kvpipe.record.result import RESULT_FILE, Result, iter_results


def test_a_result_round_trips_through_result_json(tmp_path):
    result = Result(status="FINISHED", config={"cache": {"strategy": "dynamic"}}, metrics={"tpot_ms": 1.5},
                    tags={"device": "cpu"}, notes=["n"], texts=[{"prompt": "p", "completion": "c"}],
                    measurement_key="abc", mlflow_run_id="run1")  # fmt: skip
    path = result.save(tmp_path / "job")
    assert path == tmp_path / "job" / RESULT_FILE
    assert Result.load(path) == result


def test_fields_without_a_value_are_left_out_of_the_document(tmp_path):
    skipped = Result.unfinished({"cache": {}}, "SKIPPED", "measures the same as job 0", measurement_key="k")
    document = json.loads(skipped.save(tmp_path).read_text())
    assert document["reason"] == "measures the same as job 0" and document["measurement_key"] == "k"
    assert not {"traceback", "mlflow_run_id", "mlflow_error"} & set(document)


def test_unknown_keys_from_a_newer_kvpipe_are_ignored_on_load(tmp_path):
    (tmp_path / RESULT_FILE).write_text(json.dumps({"status": "FAILED", "config": {}, "from_the_future": 1}))
    assert Result.load(tmp_path / RESULT_FILE).status == "FAILED"


def test_save_leaves_no_temporary_files_behind(tmp_path):
    Result(status="FINISHED", config={}).save(tmp_path)
    Result(status="FAILED", config={}).save(tmp_path)  # replaces, atomically
    assert [p.name for p in tmp_path.iterdir()] == [RESULT_FILE]
    assert Result.load(tmp_path / RESULT_FILE).status == "FAILED"


def test_a_sweep_directory_yields_its_jobs_in_order(tmp_path):
    for job, status in ((1, "SKIPPED"), (0, "FINISHED")):
        Result(status=status, config={}).save(tmp_path / str(job))
    Result(status="FINISHED", config={}).save(tmp_path / "0" / "nested")  # not a job of this sweep
    assert [(p.parent.name, r.status) for p, r in iter_results(tmp_path)] == [("0", "FINISHED"), ("1", "SKIPPED")]
    assert len(list(iter_results(tmp_path, recursive=True))) == 3


def test_a_measured_result_keeps_when_its_job_started_and_ended(tmp_path):
    from kvpipe.job.outcome import JobResult

    from conftest import spec_for

    job = JobResult(metrics={}, tags={}, texts=[], started_epoch_s=1_700_000_000.25, ended_epoch_s=1_700_000_042.5)
    result = Result.finished(spec_for(), job)
    assert result.span_ms() == (1_700_000_000_250, 1_700_000_042_500)
    assert Result.load(result.save(tmp_path)).span_ms() == result.span_ms()  # through result.json


def test_a_result_written_before_start_times_has_no_span(tmp_path):
    (tmp_path / RESULT_FILE).write_text(
        json.dumps({"status": "FINISHED", "config": {}, "finished_at": "2026-01-01T00:00:00+00:00"})
    )
    assert Result.load(tmp_path / RESULT_FILE).span_ms() is None
