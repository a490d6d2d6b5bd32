"""Recommend: size parsing, each of the guide's rules on made-up runs, and the CLI on a real sweep."""

from __future__ import annotations

import math

import pytest

from kvpipe import cli, workload
from kvpipe.decide import limits, recommend
from kvpipe.decide import runs as decided_runs
from kvpipe.decide.limits import Limits
from kvpipe.decide.recommend import choose
from kvpipe.errors import KvpipeError
from kvpipe.units import parse_bytes as parse_size

from conftest import run_cli
from test_compare import MIB, fake_runs

# what --min-accuracy is called in a limits line: every workload's term that judges answers (retrieval, ...)
ACCURACY_TERMS = limits.accuracy_terms()
JUDGING_KINDS = " or ".join(f"workload={kind}" for kind in workload.quality_metrics())

GIB = 2**30
DYNAMIC = {"cache": "dynamic", "tpot_ms": 40.0, "peak_mib": 900}
STATIC = {"cache": "static", "tpot_ms": 38.0, "peak_mib": 950}
COMPILED = {"cache": "static+compile", "tpot_ms": 31.2, "peak_mib": 950}
OFFLOADED = {"cache": "offloaded", "tpot_ms": 70.0, "peak_mib": 400}
INT4 = {"cache": "quantized:quanto:int4:kivi", "tpot_ms": 55.0, "peak_mib": 500, "kl": 0.006}
INT4_SLOWER = {"cache": "quantized:hqq:int4:kivi", "tpot_ms": 60.0, "peak_mib": 500, "kl": 0.004}
INT2 = {"cache": "quantized:quanto:int2:kivi", "tpot_ms": 50.0, "peak_mib": 450, "kl": 0.18}


# --- sizes -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("8GiB", 8 * GIB),
        ("512MiB", 512 * MIB),
        ("24GB", 24 * 10**9),
        ("1e9", 10**9),
        ("0.5 TiB", 2**39),
        ("64kb", 64000),
        ("4096", 4096),
    ],
)
def test_sizes_parse_in_binary_and_decimal_units(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["8 gigs", "GiB", "-1GiB", "0", "8e", ""])
def test_unparseable_size_is_a_one_line_error_naming_what_works(text):
    with pytest.raises(KvpipeError, match=r"--memory-budget=.* expected a positive size like 8GiB, 512MiB, 24GB"):
        parse_size(text)


# --- the rules ---------------------------------------------------------------------------------------


def test_dynamic_is_the_default_when_it_meets_every_limit():
    run, (what, why) = choose(fake_runs(DYNAMIC, STATIC, INT4), Limits(8 * GIB, 45, 0.05))
    assert run["label"] == "dynamic"
    assert "static decodes 5% faster than dynamic (TPOT 38.0 vs 40.0 ms); a fixed cache pays only when" in why
    assert what == "dynamic: TPOT 40.0 ms within 45 ms, peak 900.0 MiB within 8.0 GiB, lossless"


def test_static_with_compile_wins_when_it_is_at_least_ten_percent_faster():
    run, (what, why) = choose(fake_runs(DYNAMIC, STATIC, COMPILED), Limits(8 * GIB, 45, 0.05))
    assert run["label"] == "static+compile"
    assert what == "static+compile: TPOT 31.2 ms vs 40.0 ms for dynamic (-22%), peak 950.0 MiB within 8.0 GiB, lossless"


def test_static_wins_when_dynamic_misses_a_limit():
    run, (_, why) = choose(fake_runs(DYNAMIC, STATIC), Limits(8 * GIB, 39, 0.05))
    assert run["label"] == "static"
    assert "dynamic (run run00000) misses only TPOT by 3% (40.0 ms vs 39.0 ms)" in why


def test_offloaded_when_memory_binds_and_it_fits():
    run, (_, why) = choose(fake_runs(DYNAMIC, STATIC, OFFLOADED, INT4), Limits(800 * MIB, 80, 0.05))
    assert run["label"] == "offloaded"
    assert "memory binds: dense caches need at least 900.0 MiB, over the 800.0 MiB budget" in why


def test_quantized_when_memory_binds_and_its_loss_is_within_max_kl():
    run, (what, _) = choose(fake_runs(DYNAMIC, STATIC, INT4, INT4_SLOWER, INT2), Limits(800 * MIB, 60, 0.05))
    assert run["label"] == "quantized:quanto:int4:kivi"  # int2 is faster but loses too much; hqq is slower
    assert "KL 0.006 nats within 0.05" in what


def test_quantized_runs_equally_fast_are_split_by_lower_loss():
    tie = {**INT4, "cache": "quantized:hqq:int4:kivi", "kl": 0.001}
    run, _ = choose(fake_runs(DYNAMIC, INT4, tie), Limits(800 * MIB, 60, 0.05))
    assert run["label"] == "quantized:hqq:int4:kivi"


def test_lossy_run_without_quality_metrics_is_never_recommended():
    unmeasured = {key: value for key, value in INT4.items() if key != "kl"}
    run, (what, why) = choose(fake_runs(DYNAMIC, unmeasured), Limits(800 * MIB, 60, 0.05))
    assert run is None
    assert "KL not measured" not in why  # dynamic, 12% over on memory, is closer than "unknown"


def test_nothing_meets_the_limits_names_the_closest_run_and_limit():
    run, (what, why) = choose(fake_runs(DYNAMIC, INT4, INT2), Limits(400 * MIB, 45, 0.05))
    assert run is None and what == "no measured run meets the limits"
    # int4: memory +25% and TPOT +22%; int2: memory +12%, TPOT +11% but KL 3.6x over; dynamic: memory +125%
    assert why == (
        "closest: quantized:quanto:int4:kivi (run run00001) misses TPOT by 22% (55.0 ms vs 45.0 ms) "
        "and memory by 25% (500.0 MiB vs 400.0 MiB)"
    )


def test_each_workload_gets_its_own_answer_and_exit_1_when_any_has_none(monkeypatch, capsys):
    runs = fake_runs(
        {**DYNAMIC, "params": {"workload.batch_size": 1}},
        {**DYNAMIC, "peak_mib": 5000, "params": {"workload.batch_size": 8}},
    )
    monkeypatch.setattr(decided_runs, "load_runs", lambda *args, **kwargs: (runs, None))
    assert cli.subcommand(["recommend", "--memory-budget", "1GiB"]) == 1
    out = capsys.readouterr().out
    assert "workload.batch_size=1:\nrecommend: dynamic" in out
    assert "workload.batch_size=8:\nno measured run meets the limits" in out


def test_the_command_line_to_use_names_every_setting_of_a_quantized_cache():
    runs = fake_runs(
        {
            **INT4,
            "cache": "quantized:hqq:int4:kivi",
            "params": {"backend.name": "hqq", "backend.nbits": 4, "axis.layout": "kivi"},
        }
    )
    # a run recorded before kvpipe kept each job's overrides: rebuilt from the registry
    assert (
        recommend.use_command(runs.iloc[0]) == "python -m kvpipe cache=quantized backend=hqq backend.nbits=4 axis=kivi"
    )


def test_a_slower_static_cache_is_said_to_be_slower():
    run, (_, why) = choose(fake_runs(DYNAMIC, {**STATIC, "tpot_ms": 488.0}), Limits(8 * GIB))
    assert run["label"] == "dynamic"
    assert "static decodes 1120% slower than dynamic (TPOT 488.0 vs 40.0 ms)" in why


@pytest.mark.parametrize(
    "cache, params",
    [
        ("static", {}),
        ("quantized:hqq:int4:kivi", {"backend.name": "hqq", "backend.nbits": 4, "axis.layout": "kivi"}),
    ],
)
def test_the_python_snippet_runs_in_a_users_own_generate_call(cache, params):
    from kvpipe import model as models

    from conftest import spec_for

    run = fake_runs({**INT4, "cache": cache, "params": {**params, "workload.max_new_tokens": 5}}).iloc[0]
    code = recommend.snippet(run)
    assert "api.cache_kwargs(model, " in code and "max_new_tokens=5" in code
    loaded = models.load(spec_for("model=tiny_random").model)
    inputs = loaded.tokenizer(["What is a KV cache?"], return_tensors="pt")
    namespace = {"model": loaded.model, "inputs": dict(inputs)}
    exec(code, namespace)  # as a user pastes it: `model` and `inputs` are theirs
    assert namespace["output"].shape[1] == inputs["input_ids"].shape[1] + 5
    assert type(namespace["kwargs"]["cache"]).__name__ == (
        "StaticCache" if cache == "static" else "LayeredQuantizedCache"
    )


def test_min_accuracy_rules_out_a_faster_cache_that_loses_the_needle():
    dynamic = {**DYNAMIC, "accuracy": 1.0}
    int4 = {**INT4, "accuracy": 0.67}
    int2 = {**INT2, "kl": 0.01, "accuracy": 0.17}  # the fastest, and within KL: only retrieval tells
    runs = fake_runs(dynamic, int4, int2)
    assert choose(runs, Limits(600 * MIB, None, 0.05))[0]["label"] == "quantized:quanto:int2:kivi"
    run, (what, _) = choose(runs, Limits(600 * MIB, None, 0.05, accuracy=0.5))
    assert run["label"] == "quantized:quanto:int4:kivi"
    assert what.endswith("passkey retrieval 67% (at least 50%)")
    _, (_, why) = choose(runs, Limits(300 * MIB, None, 0.05, accuracy=0.5))
    assert "accuracy 17%, below 50%" in why


def test_min_accuracy_stands_in_for_the_default_kl_limit(monkeypatch, capsys):
    # passkey runs without a KL pass: the quantized one is chosen on its retrieval accuracy alone
    params = {"backend.name": "quanto", "backend.nbits": 4, "axis.layout": "kivi"}
    runs = fake_runs({**DYNAMIC, "accuracy": 0.8}, {**INT4, "kl": None, "accuracy": 0.8, "params": params})
    monkeypatch.setattr(decided_runs, "load_runs", lambda *a, **k: (runs, None))
    args = ["--memory-budget", "600MiB", "--min-accuracy", "0.75"]
    assert cli.subcommand(["recommend", *args]) == 0
    out = capsys.readouterr().out
    assert (
        f"limits: memory ≤ 600.0 MiB · {ACCURACY_TERMS} ≥ 75%" in out and "recommend: quantized:quanto:int4:kivi" in out
    )
    assert cli.subcommand(["recommend", *args, "--max-kl", "0.05"]) == 1  # both limits when both are asked for
    out = capsys.readouterr().out
    assert f"KL ≤ 0.05 nats · {ACCURACY_TERMS} ≥ 75%" in out and "no measured run meets the limits" in out


def test_min_accuracy_misses_runs_that_never_measured_retrieval():
    run = fake_runs(DYNAMIC).iloc[0]
    assert Limits(accuracy=0.9).misses(run) == {"accuracy": math.inf}
    assert (
        f"accuracy not measured (run it with {JUDGING_KINDS})" in choose(fake_runs(DYNAMIC), Limits(accuracy=0.9))[1][1]
    )


@pytest.mark.slow  # starts a kvpipe process per case
@pytest.mark.parametrize("value", ["1.5", "-0.1"])
def test_min_accuracy_outside_0_to_1_is_one_line_with_exit_2(tmp_path, value):
    proc = run_cli(["recommend", "--min-accuracy", value], cwd=tmp_path, timeout=60)
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        f"kvpipe: error: --min-accuracy={float(value)} is not valid: expected a fraction from 0 to 1, e.g. 0.9"
    ]


def test_overshoot_is_infinite_for_a_figure_that_was_not_measured():
    runs = fake_runs({key: value for key, value in INT4.items() if key != "kl"})
    assert Limits(kl=0.05).misses(runs.iloc[0]) == {"KL": math.inf}


# --- the CLI ----------------------------------------------------------------------------------------


def test_bad_budget_is_one_line_with_exit_2(tmp_path):
    proc = run_cli(["recommend", "--memory-budget", "8 gigs"], cwd=tmp_path, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "kvpipe: error: --memory-budget='8 gigs' is not valid: "
        "expected a positive size like 8GiB, 512MiB, 24GB or 1e9 (bytes)"
    ]


@pytest.fixture
def sweep_dir(tiny_sweep):
    """The launch dir of the session's real sweep (conftest.tiny_sweep): 4 measured runs."""
    return tiny_sweep.launch_dir


@pytest.mark.slow  # reads the session's real sweep (conftest.tiny_sweep)
def test_recommend_exits_0_with_a_measured_choice_and_the_command_to_use_it(sweep_dir):
    proc = run_cli(["recommend", "--memory-budget", "8GiB", "--max-kl", "0.05"], cwd=sweep_dir)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("limits: memory ≤ 8.0 GiB · KL ≤ 0.05 nats · 4 measured runs of tiny_random from sweep ")
    assert lines[1].startswith(("recommend: dynamic", "recommend: static"))  # lossless, and nothing binds
    (use,) = [line for line in lines if line.startswith("  use: ")]
    assert use.startswith("  use: python -m kvpipe model=tiny_random workload.max_new_tokens=3 ")  # as swept
    code = [line for line in lines if not line.startswith("  memory: ")]  # a line only where a cache peaks higher
    assert code[-3:][0].strip() == "from kvpipe import api" and "model.generate(**inputs" in code[-1]


@pytest.mark.slow  # reads the session's real sweep, then runs the recommended command in a new process
def test_the_use_line_measures_the_recommended_run_again(sweep_dir, tmp_path, existing_store, monkeypatch, capsys):
    import shlex

    from kvpipe.decide.runs import load_runs

    monkeypatch.chdir(sweep_dir)
    assert cli.subcommand(["recommend", "--memory-budget", "8GiB", "--max-kl", "1"]) == 0
    out = capsys.readouterr().out
    chosen_id = out.split("(run ")[1].split(")")[0]
    use = next(line for line in out.splitlines() if line.startswith("  use: ")).removeprefix("  use: ")
    runs, _ = load_runs("kvpipe", None, None, whole_experiment=True)
    key = runs.set_index("run_id").loc[chosen_id, "tags.kvpipe.measurement_key"]
    existing_store(tmp_path)
    proc = run_cli(shlex.split(use)[3:], cwd=tmp_path)  # after `python -m kvpipe`
    assert proc.returncode == 0, proc.stderr[-2000:]
    import json

    (result,) = tmp_path.glob("outputs/runs/*/*/result.json")
    assert json.loads(result.read_text())["measurement_key"] == key


@pytest.mark.slow  # reads the session's real sweep (conftest.tiny_sweep)
def test_recommend_exits_1_when_no_run_fits_and_says_which_limit_is_closest(sweep_dir, monkeypatch, capsys):
    monkeypatch.chdir(sweep_dir)  # in-process: the CLI dispatch is covered above, this saves a start-up
    assert cli.subcommand(["recommend", "--memory-budget", "1MiB", "--all"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "no measured run meets the limits"
    assert lines[2].startswith("  closest: ") and "misses only memory by" in lines[2]
    # and, where a smaller cache peaked higher than the closest run (the peaks are measured), why
    assert lines[3:] == [] or (len(lines) == 4 and lines[3].startswith("  memory: "))


# --- differences the runs can tell ----------------------------------------------------------------------


def with_rounds(runs, *series: list[float], group: str = "g1"):
    """The runs as an interleaved sweep records them: each one's round means of TPOT, one round group."""
    import json

    runs = runs.copy()
    runs["tags.kvpipe.round_tpot_ms"] = [json.dumps(values) for values in series]
    runs["tags.kvpipe.round_group"] = group
    return runs


def test_static_is_not_taken_on_a_speed_up_its_rounds_cannot_tell_from_noise():
    runs = fake_runs({**DYNAMIC, "tpot_ms": 40.0}, {**STATIC, "tpot_ms": 35.0})
    noisy = with_rounds(runs, [40, 30, 50, 40], [36, 40, 30, 34])  # 12% faster on average, not round by round
    run, (what, why) = choose(noisy, Limits(8 * GIB, 60, 0.05))
    assert run["label"] == "dynamic"
    assert "static's TPOT against dynamic's: not yet decided: 0.88× (" in why and "only for a clear speed-up" in why
    steady = with_rounds(runs, [40, 30, 50, 40], [35, 26.3, 43.7, 35])  # 12.5% faster in every round
    run, (what, why) = choose(steady, Limits(8 * GIB, 60, 0.05))
    assert run["label"] == "static" and "TPOT 0.88× (" in why


def test_a_latency_tie_goes_to_the_run_that_takes_less_memory():
    tied = fake_runs({**INT4, "tpot_ms": 50.0, "peak_mib": 500}, {**INT2, "tpot_ms": 51.0, "peak_mib": 450, "kl": 0.01})
    runs = with_rounds(tied, [50, 60, 40, 50], [52, 58, 41, 53])
    run, (what, why) = choose(runs, Limits(480 * MIB, None, 0.05))
    assert run["label"] == "quantized:quanto:int2:kivi"  # within 480 MiB only it fits; the budget decides
    run, (what, why) = choose(runs, Limits(8 * GIB, None, 0.05))
    assert run["label"] == "quantized:quanto:int2:kivi"
    assert "their TPOTs are not clearly apart (not yet decided: 1.0" in why and "takes less memory" in why
    apart = with_rounds(tied, [50, 60, 40, 50], [60, 72, 48, 60])  # 20% slower in every round: a real difference
    run, _ = choose(apart, Limits(8 * GIB, None, 0.05))
    assert run["label"] == "quantized:quanto:int4:kivi"


def test_the_accuracy_limit_names_each_kind_of_accuracy_once():
    """Several task workloads judge answers alike: --min-accuracy says "task" once, not once each."""
    terms = ACCURACY_TERMS.removesuffix(" accuracy").split(" or ")
    assert len(terms) == len(set(terms)) and "task" in terms, ACCURACY_TERMS
