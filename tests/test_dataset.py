"""workload=dataset: the user's own prompts from a local file, read through Hugging Face datasets;
every way the file can be wrong is one line naming workload.path or workload.field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvpipe import model as models
from kvpipe.errors import ConfigError
from kvpipe.job.runner import run_job

from conftest import REPO, TINY, spec_for

EXAMPLE = REPO / "examples" / "prompts.jsonl"


def dataset_spec(path, *overrides: str):
    return spec_for(*TINY, "workload=dataset", f"workload.path={path}", "workload.repeats=1", *overrides)


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


@pytest.mark.parametrize(
    "name, content, field, message",
    [
        ("missing.jsonl", None, "workload.path", "no such file or folder"),
        ("empty.jsonl", [], "workload.path", "the file is empty"),
        (
            "broken.jsonl",
            [{"prompt": "a"}, '{"prompt": "b"', {"prompt": "c"}],
            "workload.path",
            "line 2 is not valid JSON",
        ),
        ("no_text.jsonl", [{"prompt": "a"}, {"prompt": "  "}], "workload.path", "row 2 has no text in column 'prompt'"),
        ("columns.jsonl", [{"question": "a", "id": 1}], "workload.field", "name one of: question, id"),
        ("notes.txt", ["hello"], "workload.path", "unknown file type '.txt'"),
    ],
)
def test_a_bad_file_is_one_line_naming_the_field(tmp_path, name, content, field, message):
    path = tmp_path / name
    if content is not None:
        write_jsonl(path, content) if content else path.write_text("")
    with pytest.raises(ConfigError) as error:
        dataset_spec(path)
    assert str(error.value).startswith(f"{field}=") and message in str(error.value)
    assert "\n" not in str(error.value)


def test_an_unknown_field_names_the_columns_that_exist(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a", "id": 1}])
    with pytest.raises(ConfigError, match=r"workload.field='question'.*no such column; expected one of: prompt, id"):
        dataset_spec(path, "workload.field=question")


def test_no_path_says_what_to_give():
    with pytest.raises(ConfigError, match=r"workload.path=None .*e.g. workload.path=examples/prompts.jsonl"):
        spec_for(*TINY, "workload=dataset")


def test_a_row_longer_than_the_models_positions_is_named_before_the_model_loads(tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "short"}, {"prompt": "word " * 80}])
    monkeypatch.setattr(models, "load", lambda *a: pytest.fail("the model loaded"))
    spec = dataset_spec(path, "model.max_position_embeddings=64")
    with pytest.raises(
        ConfigError, match=r"workload.path=.*row 2 is \d+ tokens, which with 6 new tokens exceeds the model's 64"
    ):
        run_job(spec)


def test_the_default_field_prefers_messages_then_text_then_prompt(tmp_path):
    both = write_jsonl(tmp_path / "both.jsonl", [{"prompt": "p", "text": "t"}])
    assert dataset_spec(both).workload.field == "text"
    chats = [{"messages": [{"role": "user", "content": "hi"}], "prompt": "p"}]
    assert dataset_spec(write_jsonl(tmp_path / "chats.jsonl", chats)).workload.field == "messages"


def test_csv_parquet_and_a_saved_dataset_read_the_same_prompts(tmp_path):
    import datasets

    rows = {"prompt": ["one two", "three"], "max_new_tokens": [3, 5]}
    table = datasets.Dataset.from_dict(rows)
    table.to_csv(str(tmp_path / "p.csv"), index=False)
    table.to_parquet(str(tmp_path / "p.parquet"))
    datasets.DatasetDict({"test": table, "train": table}).save_to_disk(str(tmp_path / "saved"))
    for path, extra in (
        (tmp_path / "p.csv", ()),
        (tmp_path / "p.parquet", ()),
        (tmp_path / "saved", ("workload.split=test",)),
    ):
        found = dataset_spec(path, *extra).bound_workload.rows()
        assert [(r.messages[0]["content"], r.max_new_tokens) for r in found] == [("one two", 3), ("three", 5)]
    with pytest.raises(ConfigError, match=r"workload.split=None .*expected one of the folder's splits: test, train"):
        dataset_spec(tmp_path / "saved")


def test_limit_is_a_seeded_sample_that_keeps_row_numbers(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"row {i}"} for i in range(20)])
    first = dataset_spec(path, "workload.limit=5").bound_workload.rows()
    again = dataset_spec(path, "workload.limit=5").bound_workload.rows()
    other = dataset_spec(path, "workload.limit=5", "workload.seed=1").bound_workload.rows()
    assert first == again and first != other and len(first) == 5
    assert all(row.messages[0]["content"] == f"row {row.number}" for row in first)


def test_a_changed_file_is_a_new_measurement(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a"}])
    before = dataset_spec(path).measurement_key()
    write_jsonl(path, [{"prompt": "b"}])
    assert dataset_spec(path).measurement_key() != before


def test_a_file_reached_through_a_symlinked_folder_is_the_same_measurement(tmp_path, monkeypatch):
    """The digest is of the file and its name in its folder, not of the way the cwd reached it: a
    folder that links to the examples (as another project's might) keys its runs as the repository's
    own, whichever is read first in the process."""
    from kvpipe.workload.dataset import reading

    (tmp_path / "examples").symlink_to(REPO / "examples")
    monkeypatch.chdir(tmp_path)
    through_link = reading.digest(Path("examples/prompts.jsonl"))
    monkeypatch.chdir(REPO)
    assert reading.digest(Path("examples/prompts.jsonl")) == through_link == reading.digest(EXAMPLE)


def test_batches_group_similar_lengths_and_each_row_runs_once_per_repeat(tmp_path):
    from kvpipe import model

    rows = [{"prompt": "word " * n} for n in (1, 30, 2, 31, 3, 32)]
    spec = dataset_spec(write_jsonl(tmp_path / "p.jsonl", rows), "workload.batch_size=3", "workload.repeats=2")
    batches = spec.bound_workload.batches(model.load_tokenizer(spec.model), "cpu")
    assert [sorted(r.number for r in b.rows) for b in batches] == [[0, 2, 4], [1, 3, 5]]
    assert all(max(b.row_tokens) - min(b.row_tokens) <= 2 for b in batches)  # little padding
    job = run_job(spec)
    assert len(job.texts) == 6 and job.metrics["prompt_count"] == 6
    assert job.metrics["prompt_tokens_max"] == max(n for b in batches for n in b.row_tokens)


def test_a_max_new_tokens_column_sets_each_rows_length(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a b", "max_new_tokens": 3}, {"prompt": "c"}])
    job = run_job(dataset_spec(path, "workload.max_new_tokens=5", "workload.batch_size=2"))
    assert job.metrics["new_tokens"] == pytest.approx((3 + 5) / 2)  # one batch of each length, not one of both
    assert len(job.texts) == 2


@pytest.mark.slow  # a real job with its quality pass
def test_the_example_file_runs_with_quality_scored_on_its_own_prompts():
    spec = dataset_spec(EXAMPLE, "quality=on", "quality.windows=2", "quality.scored_tokens=8", "workload.limit=3")
    job = run_job(spec)
    assert job.metrics["prompt_count"] == 3 and job.metrics["quality_windows"] == 2
    assert job.tags["chat_template"] == "model"
