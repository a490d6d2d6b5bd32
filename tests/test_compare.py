"""Compare: the Pareto front, varying columns, and the table, files and artifacts of a real sweep."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from kvpipe import cli
from kvpipe.decide import compare
from kvpipe.decide import runs as recorded
from kvpipe.errors import KvpipeError
from kvpipe.orchestrate import closing
from kvpipe.record import tags as mlflow_tags

from conftest import run_cli

MIB = 2**20
CACHES = ["dynamic", "static", "quantized:hqq:int2:kivi", "quantized:hqq:int4:kivi"]


def fake_runs(*rows: dict) -> pd.DataFrame:
    """Runs as MLflow's search_runs returns them, from short rows: cache, tpot_ms, peak_mib, kl,
    accuracy (passkey retrieval), params."""
    records = []
    for i, row in enumerate(rows):
        cache = row.get("cache", "dynamic")
        record = {
            "run_id": f"run{i:05d}xyz",
            "start_time": pd.Timestamp(2026, 1, 1) + pd.Timedelta(seconds=i),
            "params.cache.strategy": row.get("strategy", cache.split(":")[0].split("+")[0]),
            "tags.kvpipe.cache.requested": row.get("strategy", cache.split(":")[0].split("+")[0]),
            "tags.kvpipe.cache.effective": cache,
            "tags.kvpipe.peak_memory_source": row.get("source", "cuda_max_memory_allocated"),
            "metrics.tpot_ms": row.get("tpot_ms", 40.0),
            "metrics.tpot_ms_std": 1.0,
            "metrics.peak_memory_bytes": row.get("peak_mib", 1000) * MIB,
            "metrics.weights_bytes": row.get("weights_mib", 500) * MIB,
        }
        if row.get("kl") is not None:
            record["metrics.kl_vs_reference"] = row["kl"]
        if row.get("accuracy") is not None:
            record["metrics.retrieval_accuracy"] = row["accuracy"]
        record.update({f"params.{k}": str(v) for k, v in row.get("params", {}).items()})
        records.append(record)
    return recorded.with_derived(pd.DataFrame(records))


# --- Pareto front ------------------------------------------------------------------------------------


def test_run_worse_on_every_axis_is_off_the_front():
    runs = fake_runs(
        {"cache": "dynamic", "tpot_ms": 40, "peak_mib": 900}, {"cache": "static", "tpot_ms": 30, "peak_mib": 800}
    )
    assert list(runs["pareto"]) == [False, True]


def test_trade_offs_between_memory_speed_and_quality_all_stay_on_the_front():
    runs = fake_runs(
        {"cache": "static", "tpot_ms": 30, "peak_mib": 900},
        {"cache": "quantized:quanto:int4:kivi", "tpot_ms": 50, "peak_mib": 600, "kl": 0.01},
        {"cache": "quantized:quanto:int2:kivi", "tpot_ms": 50, "peak_mib": 600, "kl": 0.2},
    )
    assert list(runs["pareto"]) == [True, True, False]  # int2: same memory and speed as int4, more loss


def test_lossy_run_without_quality_metrics_is_left_off_the_front():
    runs = fake_runs(
        {"cache": "dynamic", "tpot_ms": 40, "peak_mib": 900},
        {"cache": "quantized:quanto:int4:kivi", "tpot_ms": 10, "peak_mib": 100},
    )
    assert list(runs["pareto"]) == [True, False]
    assert pd.isna(runs["quality_loss"][1])


def test_lossless_run_without_quality_metrics_counts_as_no_loss():
    runs = fake_runs(
        {"cache": "static", "tpot_ms": 30, "peak_mib": 800},
        {"cache": "quantized:quanto:int4:kivi", "tpot_ms": 30, "peak_mib": 800, "kl": 0.01},
    )
    assert list(runs["quality_loss"]) == [0.0, 0.01]
    assert list(runs["pareto"]) == [True, False]


def test_front_is_drawn_within_each_workload_not_across_them():
    runs = fake_runs(
        {"cache": "dynamic", "tpot_ms": 40, "peak_mib": 900, "params": {"workload.batch_size": 1}},
        {"cache": "static", "tpot_ms": 45, "peak_mib": 950, "params": {"workload.batch_size": 1}},
        {"cache": "static", "tpot_ms": 80, "peak_mib": 1900, "params": {"workload.batch_size": 8}},
    )
    assert list(runs["workload"]) == ["workload.batch_size=1"] * 2 + ["workload.batch_size=8"]
    assert list(runs["pareto"]) == [True, False, True]  # batch 8 is slower than batch 1, yet the best at batch 8


def test_identical_runs_are_both_on_the_front():
    runs = fake_runs({"cache": "dynamic"}, {"cache": "static"})
    assert list(runs["pareto"]) == [True, True]


# --- derived columns ---------------------------------------------------------------------------------


def test_cpu_growth_figure_gets_the_weights_added_and_cuda_peak_does_not():
    runs = fake_runs(
        {"peak_mib": 100, "weights_mib": 500, "source": "linux_vmhwm_growth"},
        {"peak_mib": 600, "weights_mib": 500, "source": "cuda_max_memory_allocated"},
    )
    assert list(runs["memory_bytes"]) == [600 * MIB, 600 * MIB]


def test_offloaded_that_ran_as_dynamic_is_labelled_as_both():
    runs = fake_runs({"cache": "dynamic", "strategy": "offloaded"})
    assert runs["label"][0] == "offloaded (as dynamic)"
    assert runs["strategy"][0] == "dynamic"


# --- varying columns ---------------------------------------------------------------------------------


def test_only_params_that_vary_become_columns():
    runs = fake_runs(
        {"params": {"model.name": "tiny", "workload.batch_size": 1}},
        {"params": {"model.name": "tiny", "workload.batch_size": 4}},
    )
    assert recorded.varying_params(runs) == ["workload.batch_size"]


def test_params_a_strategy_ignores_are_blank_and_do_not_count_as_varying():
    runs = fake_runs(
        {"cache": "dynamic", "params": {"backend.q_group_size": 32}},
        {"cache": "quantized:quanto:int4:kivi", "params": {"backend.q_group_size": 64}},
    )
    assert recorded.param_values(runs, "backend.q_group_size") == ["", "64"]
    assert recorded.varying_params(runs) == []


def test_params_in_the_cache_label_or_bookkeeping_are_not_columns():
    runs = fake_runs(
        {"cache": "quantized:quanto:int2:kivi", "params": {"backend.nbits": 2, "tracking.run_name": "a"}},
        {"cache": "quantized:quanto:int4:kivi", "params": {"backend.nbits": 4, "tracking.run_name": "b"}},
    )
    assert recorded.varying_params(runs) == []
    assert list(compare.display_table(runs)["cache"]) == ["quantized:quanto:int2:kivi", "quantized:quanto:int4:kivi"]


# --- a real sweep (conftest.tiny_sweep: started once per session, shared with test_sweep, test_recommend) ---


@pytest.fixture
def sweep_dir(tiny_sweep) -> Path:
    """The launch dir of the session's real sweep: 4 FINISHED runs (CACHES) and 5 skipped jobs."""
    return tiny_sweep.launch_dir


def store(launch_dir: Path) -> str:
    return f"sqlite:///{launch_dir}/outputs/mlflow.db"


@pytest.mark.slow  # reads the session's real sweep (conftest.tiny_sweep)
def test_sweep_ends_with_compare_files_in_its_dir_and_as_artifacts_of_its_parent(sweep_dir):
    from mlflow.tracking import MlflowClient

    (multirun,) = (sweep_dir / "outputs" / "multiruns").glob("*/*")
    for name in compare.OUTPUT_FILES:
        assert (multirun / name).stat().st_size > 0, name
    _, parent = recorded.load_runs("kvpipe", None, store(sweep_dir))
    logged = {a.path for a in MlflowClient().list_artifacts(parent.run_id, "compare")}
    assert logged == {f"compare/{name}" for name in compare.OUTPUT_FILES}


@pytest.mark.slow  # reads the session's real sweep (conftest.tiny_sweep)
def test_sweep_parent_run_shows_its_compare_table_as_its_description(sweep_dir):
    from mlflow.tracking import MlflowClient

    _, parent = recorded.load_runs("kvpipe", None, store(sweep_dir))
    note = MlflowClient().get_run(parent.run_id).data.tags["mlflow.note.content"]
    assert note.startswith("# kvpipe compare")
    rows = [line for line in note.splitlines() if line.startswith("| ")]
    assert "cache" in rows[0] and "TPOT ms" in rows[0]
    assert len(rows) == 1 + len(CACHES)


def test_a_short_table_is_the_description_whole():
    markdown = "# title\n\n| cache | TPOT ms |\n|---:|---:|\n| dynamic | 40.0 |\n\nfootnote\n"
    assert mlflow_tags.note(markdown, "compare/compare.md") == markdown


def test_a_table_too_long_for_a_description_is_cut_between_rows_and_names_the_whole_one():
    from mlflow.utils.validation import MAX_TAG_VAL_LENGTH

    rows = "\n".join(f"| quantized:hqq:int{i} | {i * 1.5:.1f} |" for i in range(1000))
    markdown = f"# title\n\n| cache | TPOT ms |\n|---:|---:|\n{rows}\n\nfootnote\n"
    note = mlflow_tags.note(markdown, "compare/compare.md")
    assert len(note) <= MAX_TAG_VAL_LENGTH  # MLflow would cut it itself, mid-row
    *kept, blank, last = note.splitlines()
    assert kept == markdown.splitlines()[: len(kept)] and kept[-1].endswith("|")  # whole rows only
    assert blank == "" and "compare/compare.md" in last  # apart from the table, not read as a row


@pytest.mark.slow  # reads the session's real sweep (conftest.tiny_sweep)
def test_latest_sweep_loads_its_finished_runs_once_each(sweep_dir):
    runs, parent = recorded.load_runs("kvpipe", None, store(sweep_dir))
    assert sorted(runs["label"]) == sorted(CACHES)
    assert set(runs["tags.mlflow.parentRunId"]) == {parent.run_id}


@pytest.mark.slow  # reads the session's real sweep (conftest.tiny_sweep)
def test_compare_prints_one_table_of_the_cache_and_figures_only(sweep_dir, tmp_path):
    proc = run_cli(["compare", "--out", str(tmp_path)], cwd=sweep_dir)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # not a TTY: nothing but the table, and where its files went
    files = ", ".join(compare.OUTPUT_FILES)
    assert f"\nwrote {files} to {tmp_path}; logged on MLflow run " in proc.stdout
    header = next(line for line in proc.stdout.splitlines() if "TPOT ms" in line)
    assert "cache" in header and "KL nats" in header and "★" in header
    assert "backend.nbits" not in header and "model.name" not in header  # in the label, or constant
    assert all(cache in proc.stdout for cache in CACHES)
    assert "★" in proc.stdout.split(header)[1]  # some row is on the front
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(compare.OUTPUT_FILES)


@pytest.mark.slow  # reads the session's real sweep (conftest.tiny_sweep)
def test_markdown_and_csv_hold_one_row_per_run(sweep_dir, tmp_path):
    runs, _ = recorded.load_runs("kvpipe", None, store(sweep_dir))
    compare.write_outputs(runs, tmp_path, "title")
    assert sum(line.startswith("| ") for line in (tmp_path / "compare.md").read_text().splitlines()) == 1 + 4
    csv = pd.read_csv(tmp_path / "compare.csv")
    assert sorted(csv["label"]) == sorted(CACHES) and {"pareto", "metrics.tpot_ms", "memory_bytes"} <= set(csv.columns)


@pytest.mark.slow  # reads the session's real sweep (conftest.tiny_sweep)
def test_unknown_experiment_names_the_experiments_that_exist(sweep_dir):
    with pytest.raises(KvpipeError, match=r"--experiment='nope'.*expected one of: .*kvpipe"):
        recorded.load_runs("nope", None, store(sweep_dir))


@pytest.mark.slow  # reads the session's real sweep (conftest.tiny_sweep)
def test_experiment_without_a_sweep_says_how_to_make_one(sweep_dir):
    with pytest.raises(KvpipeError, match=r"--experiment='Default'.*no sweep.*python -m kvpipe -m"):
        recorded.load_runs("Default", None, store(sweep_dir))


@pytest.mark.slow  # reads the session's real sweep (conftest.tiny_sweep)
def test_unknown_parent_is_a_one_line_error_with_exit_2(sweep_dir):
    proc = run_cli(["compare", "--parent", "0123456789abcdef"], cwd=sweep_dir)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"kvpipe: error: --parent='0123456789abcdef' is not valid: no such run in {store(sweep_dir)}; "
        "expected a sweep's parent run id, or no --parent for the latest sweep"
    ]


@pytest.mark.slow  # reads the session's real sweep (conftest.tiny_sweep)
def test_a_single_job_is_not_taken_for_a_sweep(sweep_dir):
    runs, _ = recorded.load_runs("kvpipe", None, store(sweep_dir))
    with pytest.raises(KvpipeError, match="one job, not a sweep"):
        recorded.load_runs("kvpipe", runs["run_id"][0], store(sweep_dir))


def test_missing_store_is_an_error_not_a_new_empty_database(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(KvpipeError, match="no MLflow store"):
        recorded.load_runs("kvpipe", None, None)
    assert not (tmp_path / "outputs").exists()


@pytest.mark.slow  # reads the session's real sweep (conftest.tiny_sweep)
def test_summarise_sweep_of_an_empty_sweep_logs_and_returns(sweep_dir, tmp_path, caplog):
    from kvpipe.config import TrackingConfig
    from kvpipe.record import tracking

    empty = TrackingConfig(experiment="empty sweeps")  # beside, not in, the experiment other tests read
    parent = tracking.start_parent(empty, sweep_dir, "nothing ran", {}, {})
    config = OmegaConf.create({"tracking": OmegaConf.structured(empty), "hydra": {"runtime": {"cwd": str(sweep_dir)}}})
    with caplog.at_level("INFO", logger="kvpipe.orchestrate.closing"):
        closing.summarise_sweep(config, parent, tmp_path / "sweep")
    assert not (tmp_path / "sweep").exists()
    assert f"sweep {parent} has no FINISHED runs" in caplog.text


# --- where the store is: one order everywhere -----------------------------------------------------------


@pytest.mark.slow  # reads the session's real sweep (conftest.tiny_sweep)
def test_compare_finds_the_store_from_any_folder_by_either_spelling(sweep_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # not the launch dir
    db = f"sqlite:///{sweep_dir}/outputs/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", db)
    assert cli.subcommand(["compare", "--out", str(tmp_path / "a")]) == 0
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert cli.subcommand(["compare", f"tracking.uri={db}", "--out", str(tmp_path / "b")]) == 0
    assert cli.subcommand(["recommend", f"tracking.uri={db}"]) == 0
    assert (tmp_path / "a" / "compare.md").is_file() and (tmp_path / "b" / "compare.md").is_file()


@pytest.mark.parametrize(
    "args, env, named",
    [
        ([], None, "the default store "),
        (["tracking.uri=sqlite:////no/such/mlflow.db"], None, "tracking.uri=sqlite:////no/such/mlflow.db: "),
        (["--tracking-uri", "sqlite:////no/such/mlflow.db"], None, "--tracking-uri=sqlite:////no/such/mlflow.db: "),
        ([], "sqlite:////no/such/mlflow.db", "MLFLOW_TRACKING_URI=sqlite:////no/such/mlflow.db: "),
    ],
)
def test_a_missing_store_is_named_as_the_user_named_it(args, env, named, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    if env:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", env)
    else:
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert cli.subcommand(["compare", *args]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("kvpipe: error: " + named) and "no MLflow store there" in line


def test_runs_write_where_mlflow_tracking_uri_points(tmp_path, monkeypatch):
    from kvpipe.config import TrackingConfig
    from kvpipe.record.store import store_paths

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/elsewhere.db")
    assert store_paths(TrackingConfig(), tmp_path / "launch")[0] == f"sqlite:///{tmp_path}/elsewhere.db"
    explicit = TrackingConfig(uri=f"sqlite:///{tmp_path}/explicit.db")
    assert store_paths(explicit, tmp_path)[0] == explicit.uri  # the setting wins over the variable
