"""What adding a subcommand, a limit, an accelerator or a metric takes: each is one module or one entry,
and every command that should know of it does. Each addition here is a throwaway made in the test
(plugins, one module and a YAML each: tests/test_plugin_additions.py)."""

from __future__ import annotations

import importlib
import math

import pandas as pd
from test_catalogue import described_metrics

from kvpipe import catalogue, cli, commands
from kvpipe.decide import compare, limits
from kvpipe.orchestrate.search import objectives
from kvpipe.predict import hardware
from kvpipe.record import report
from kvpipe.record.result import Result
from kvpipe.workload import metrics

from conftest import run_cli
from test_compare import fake_runs

HELLO = '''"""`kvpipe hello`: a subcommand made in a test."""

HELP = "say hello, to show what a subcommand takes"


def add_arguments(parser):
    parser.add_argument("--name", default="world")


def run(args):
    print(f"hello, {args.name}")
    return 0
'''


def test_a_new_subcommand_is_one_module_in_kvpipe_commands(tmp_path, monkeypatch):
    (tmp_path / "hello.py").write_text(HELLO)
    monkeypatch.setattr(commands, "__path__", [*commands.__path__, str(tmp_path)])
    assert "hello" in cli.subcommands()
    said = run_cli(["hello", "--name", "kvpipe"], cwd=tmp_path)
    assert (said.returncode, said.stdout) == (0, "hello, kvpipe\n")
    listed = run_cli(["--help"], cwd=tmp_path)
    assert "hello       say hello, to show what a subcommand takes" in listed.stdout
    wrong = run_cli(["hello", "--nmae", "x"], cwd=tmp_path)
    assert wrong.returncode == 2 and "unrecognized arguments: --nmae" in wrong.stderr


TTFT = limits.Limit(
    "TTFT", "ttft_ms", "max_ttft_ms", "metrics.ttft_ms", "ttft_ms", "time to the first token", "MS",
    limits._at_least_zero, describe=lambda v: f"TTFT ≤ {v:g} ms",
)  # fmt: skip


def test_a_new_limit_is_one_entry_of_the_limits_table(monkeypatch):
    monkeypatch.setattr(limits, "LIMITS", (*limits.LIMITS, TTFT))
    from kvpipe.commands import recommend

    parser = cli._Parser(prog="kvpipe recommend")
    recommend.add_arguments(parser)
    args = parser.parse_args(["--max-ttft-ms", "200", "--max-kl", "0.1"])
    chosen = limits.limits_of(args)
    assert chosen.ttft_ms == 200 and chosen.describe() == "KL ≤ 0.1 nats · TTFT ≤ 200 ms"
    run = pd.Series({"memory_bytes": 1e9, "metrics.tpot_ms": 30.0, "quality_loss": 0.01, "metrics.ttft_ms": 300.0})
    assert chosen.misses(run) == {"TTFT": 0.5}  # recommend's rule
    assert objectives.constraints(run, chosen) == [-0.9, 0.5]  # the search's constraints: KL, then TTFT
    assert math.isinf(chosen.misses(run.drop("metrics.ttft_ms"))["TTFT"])
    from kvpipe.orchestrate.search import sweeper

    try:  # the search sweeper's settings are made from the table: hydra.sweeper.max_ttft_ms
        assert "max_ttft_ms" in importlib.reload(sweeper).SearchSettings.__dataclass_fields__
    finally:
        monkeypatch.undo()
        importlib.reload(sweeper)


def test_a_new_accelerator_is_one_entry_of_conf_hardware_yaml(tmp_path, monkeypatch):
    entry = {
        "name": "toy_gpu", "title": "Toy GPU", "device": "cuda", "memory_gb": 16, "memory_bandwidth_gb_per_s": 500,
        "peak_dense_tflops": {"bfloat16": 100, "float32": 10},
        "sources": {"memory_gb": "made in a test", "memory_bandwidth_gb_per_s": "made in a test",
                    "peak_dense_tflops": "made in a test"},
    }  # fmt: skip
    table = {**hardware._table(), "toy_gpu": entry}
    monkeypatch.setattr(hardware, "_table", lambda: table)
    assert "toy_gpu" in hardware.names()
    planned = run_cli(["plan", "model=tiny_random", "--hardware", "toy_gpu", "--json"], cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr
    assert '"title": "Toy GPU"' in planned.stdout
    unknown = run_cli(["plan", "model=tiny_random", "--hardware", "toy_gpx"], cwd=tmp_path)
    assert unknown.returncode == 2 and "toy_gpu" in unknown.stderr


# --- a workload with its own metric ------------------------------------------------------------------


PREFILL = catalogue.Metric("prefill_ms", "prefill", "ms", ".1f", True, in_run_table=True, compare=True)


def test_a_new_metric_is_one_catalogue_entry_the_run_table_compare_and_the_manual_read(monkeypatch, capsys, tmp_path):
    """A figure the job measures is one entry of the catalogue (name, label, unit, format, direction);
    the run's table and compare's columns show it, and the manual's check asks for its meaning."""
    monkeypatch.setattr(catalogue, "CORE", (*catalogue.CORE, PREFILL))
    result = Result(status="FINISHED", config={"model": {"name": "tiny"}},
                    metrics={"tpot_ms": 40.0, "prefill_ms": 12.34}, tags={"cache.effective": "dynamic", "device": "cpu"})  # fmt: skip
    report.print_run(result, tmp_path / "result.json")
    row = next(line for line in capsys.readouterr().out.splitlines() if "prefill" in line)
    assert [cell.strip() for cell in row.split("│")[1:3]] == ["prefill", "12.3 ms"]
    runs = fake_runs({"cache": "dynamic"}, {"cache": "static"})
    runs[PREFILL.column] = [12.34, 56.78]
    assert list(compare.display_table(runs)[PREFILL.header()]) == ["12.3", "56.8"]
    assert "prefill_ms" in set(metrics()) - set(described_metrics())  # docs/metrics.yaml must say what it means
