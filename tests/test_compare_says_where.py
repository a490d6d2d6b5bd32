"""compare says where it wrote its files; on a sweep that measured nothing, why, in one line (its
jobs' reasons) and exit 2, rather than failing inside pandas on the columns an empty search lacks."""

from __future__ import annotations

from kvpipe.config import TrackingConfig
from kvpipe.record import tags as mlflow_tags
from kvpipe.record import tracking
from kvpipe.record.result import Result

from conftest import run_cli

REFUSED = "press.window=64 is not valid: expected fewer than the shortest prompt's 39 tokens"


def test_compare_on_a_sweep_whose_every_job_was_skipped_names_the_reasons(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sweep_dir = tmp_path / "sweep"
    for job, reason in enumerate([REFUSED, REFUSED, "measures the same as job 0"]):
        Result.unfinished({}, "SKIPPED", reason, measurement_key=f"key{job}").save(sweep_dir / str(job))
    tracking.start_parent(TrackingConfig(uri=uri), tmp_path, "sweep", {}, {mlflow_tags.SWEEP_DIR: str(sweep_dir)})
    said = run_cli(["compare", "--tracking-uri", uri], cwd=tmp_path)
    assert said.returncode == 2 and "Traceback" not in said.stderr
    assert said.stderr.strip().endswith(
        f"the sweep in {sweep_dir} measured nothing: every job was skipped ({REFUSED}; measures the same as job 0)"
    )
    assert len(said.stderr.strip().splitlines()) == 1


def test_compare_says_where_its_files_are_and_whether_they_are_on_the_run(tmp_path):
    from kvpipe.commands.compare import wrote_line

    written = [tmp_path / "compare.md", tmp_path / "memory_vs_context.png"]
    assert wrote_line(written, tmp_path, "abc123") == (
        f"wrote compare.md, memory_vs_context.png to {tmp_path}; logged on MLflow run abc123 (compare/)"
    )
    assert wrote_line(written, tmp_path, None) == f"wrote compare.md, memory_vs_context.png to {tmp_path}"
