"""The command line's habits: what `kvpipe --version` says, and one line with a way forward when a
word, a choice or a value is not what kvpipe expected."""

from __future__ import annotations

from importlib.metadata import version

import pytest

from kvpipe import __version__

from conftest import run_cli


def one_error_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("kvpipe: error: ")
    return lines[0]


def test_version_names_kvpipe_torch_and_transformers(tmp_path):
    proc = run_cli(["--version"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (
        f"kvpipe {__version__} (torch {version('torch')}, transformers {version('transformers')})"
    )


def test_a_mistyped_subcommand_is_an_unknown_command_with_a_suggestion(tmp_path):
    line = one_error_line(run_cli(["compre"], cwd=tmp_path))
    assert "unknown command 'compre'; did you mean compare? (subcommands: advise, capacity, compare," in line
    assert line.endswith("; a job takes key=value overrides)")


def test_a_bare_word_like_no_subcommand_lists_them_without_a_guess(tmp_path):
    line = one_error_line(run_cli(["cache=static", "xyzzy"], cwd=tmp_path))
    assert "unknown command 'xyzzy' (subcommands: " in line
    assert "did you mean" not in line


def test_the_value_of_a_hydra_flag_is_not_a_command(tmp_path):
    proc = run_cli(["--cfg", "job"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr


def test_a_mistyped_option_gets_a_guess_after_the_choices(tmp_path):
    line = one_error_line(run_cli(["cache=statc"], cwd=tmp_path))
    assert "cache=statc is not a known option; expected one of: dynamic," in line
    assert line.endswith("; did you mean static?")


def test_a_mistyped_key_gets_a_guess(tmp_path):
    assert one_error_line(run_cli(["model.dtyp=float16"], cwd=tmp_path)).endswith("; did you mean dtype?")


def test_an_appended_mistyped_key_gets_a_guess(tmp_path):
    line = one_error_line(run_cli(["+workload.max_new_token=3"], cwd=tmp_path))
    assert line.endswith("; did you mean max_new_tokens?")


@pytest.mark.parametrize("sweep", [[], ["-m", "cache=dynamic,static"]], ids=["job", "sweep"])
def test_a_misspelt_appended_group_is_refused_not_run_as_a_default_job(tmp_path, sweep):
    line = one_error_line(run_cli([*sweep, "+experimnt=needle", "model=tiny_random"], cwd=tmp_path))
    assert "experimnt='needle' is not valid: not a known config group or key; expected one of: axis," in line
    assert line.endswith("; did you mean experiment?")
    assert not list(tmp_path.rglob("result.json"))  # refused before a job ran


def test_a_mistyped_value_gets_a_guess(tmp_path):
    line = one_error_line(run_cli(["model.dtype=bfloat61"], cwd=tmp_path))
    assert line.endswith("expected one of: auto, float32, bfloat16, float16; did you mean bfloat16?")


def test_a_choice_spelt_like_nothing_valid_gets_no_guess(tmp_path):
    assert "did you mean" not in one_error_line(run_cli(["cache=fastest"], cwd=tmp_path))


def test_a_negative_size_reaches_the_size_check(tmp_path):
    line = one_error_line(run_cli(["recommend", "--memory-budget", "-1GiB"], cwd=tmp_path))
    assert "--memory-budget='-1GiB' is not valid: expected a positive size like 8GiB" in line


def test_a_negative_duration_reaches_the_duration_check(tmp_path):
    line = one_error_line(run_cli(["advise", "--timeout", "-20"], cwd=tmp_path))
    assert "--timeout='-20' is not valid: expected a duration" in line


def test_an_option_followed_by_another_still_lacks_its_value(tmp_path):
    line = one_error_line(run_cli(["recommend", "--memory-budget", "--all"], cwd=tmp_path))
    assert "argument --memory-budget: expected one argument" in line


def test_advise_prints_a_bare_timeout_as_seconds():
    from kvpipe.commands.advise import parse_duration
    from kvpipe.units import duration_text

    assert duration_text(parse_duration("20")) == "20s"


@pytest.mark.slow  # reads the session's real sweep
def test_a_sweeps_8_character_id_as_its_title_prints_it_names_it(tiny_sweep, tmp_path):
    from kvpipe.decide import runs as recorded

    store = f"sqlite:///{tiny_sweep.launch_dir}/outputs/mlflow.db"
    _, parent = recorded.load_runs("kvpipe", None, store)
    short = parent.run_id[:8]
    proc = run_cli(["compare", "--parent", short, "--out", str(tmp_path)], cwd=tiny_sweep.launch_dir)
    assert proc.returncode == 0, proc.stderr
    _, named = recorded.load_runs("kvpipe", short, store)
    assert named.run_id == parent.run_id


@pytest.mark.slow  # reads the session's real sweep
def test_a_prefix_shorter_than_8_characters_is_no_run(tiny_sweep):
    from kvpipe.decide import runs as recorded

    store = f"sqlite:///{tiny_sweep.launch_dir}/outputs/mlflow.db"
    _, parent = recorded.load_runs("kvpipe", None, store)
    line = one_error_line(run_cli(["compare", "--parent", parent.run_id[:7]], cwd=tiny_sweep.launch_dir))
    assert "no such run in" in line


def test_ctrl_c_in_a_subcommand_is_one_line_and_status_130(monkeypatch, capsys):
    from kvpipe import cli
    from kvpipe.commands import capacity

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(capacity, "run", interrupted)  # as Ctrl-C in capacity's shared rounds
    assert cli.subcommand(["capacity", "--max-tpot-ms", "150"]) == 130
    assert capsys.readouterr().err == cli.INTERRUPTED + "\n"
