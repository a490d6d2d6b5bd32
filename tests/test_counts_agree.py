"""What kvpipe prints about counts and sizes reads right: a count agrees with its noun, one size is
always shown in one unit, a row of a user's file is counted as an editor counts it, and a limit past
a file's rows is said in one line."""

from __future__ import annotations

import json

import pytest

from kvpipe.errors import ConfigError
from kvpipe.units import counted, human_bytes

from conftest import TINY, spec_for


@pytest.mark.parametrize(
    "count, noun, text", [(1, "prompt", "1 prompt"), (8, "prompt", "8 prompts"), (0, "row", "0 rows"),
                          (1200, "request", "1,200 requests"), (1.0, "run", "1 run")],
)  # fmt: skip
def test_a_count_agrees_with_its_noun(count, noun, text):
    assert counted(count, noun) == text


@pytest.mark.parametrize("size, text", [(2**30 - 1, "1.0 GiB"), (2**30 - 2**20 // 20, "1.0 GiB"),
                                        (2**20 - 1, "1.0 MiB"), (1023, "1023 B"), (1536, "1.5 KiB")])  # fmt: skip
def test_a_size_never_shows_as_1024_of_a_unit(size, text):
    assert human_bytes(size) == text


def test_a_limit_past_the_files_rows_is_one_note_and_every_row_runs():
    spec = spec_for(*TINY, "workload=dataset", "workload.path=examples/prompts.jsonl", "workload.limit=200")
    assert "workload.limit=200 but the file has 8 rows: all 8 used" in spec.warnings
    assert len(spec.bound_workload.rows()) == 8
    within = spec_for(*TINY, "workload=dataset", "workload.path=examples/prompts.jsonl", "workload.limit=8")
    assert not any("workload.limit" in warning for warning in within.warnings)


def test_arrival_rows_are_counted_from_one_as_in_an_editor(tmp_path):
    path = tmp_path / "trace.jsonl"  # line 3 goes back in time
    path.write_text(
        "".join(json.dumps({"prompt": f"q{i}", "timestamp": t}) + "\n" for i, t in enumerate([0.1, 0.5, 0.3]))
    )
    with pytest.raises(ConfigError, match=r"row 3 has timestamp=0.3, before row 2's 0.5"):
        spec_for(*TINY, "workload=dataset", f"workload.path={path}")


def test_plan_calls_the_copy_a_paged_step_makes_a_layer_copy_not_a_dequantized_one(tmp_path):
    from conftest import run_cli

    said = run_cli(["plan", "model=tiny_random", "--hardware", "l4"], cwd=tmp_path)
    assert said.returncode == 0, said.stderr
    assert "dequant" not in said.stdout.split("floors on")[1].split("\n", 3)[2]  # the table's header
    assert "layer copy" in said.stdout and "a paged layer's pages gathered" in said.stdout


def test_the_run_table_counts_one_prompt_as_one_prompt():
    from kvpipe.record.report import prompt_lengths

    lengths = {f"prompt_tokens_{name}": 40.0 for name in ("mean", "p50", "p90", "max")}
    assert prompt_lengths({"prompt_count": 1.0, **lengths}).startswith("1 prompt · 40")
    assert prompt_lengths({"prompt_count": 8.0, **lengths}).startswith("8 prompts · 40")
