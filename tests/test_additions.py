"""What adding a subcommand, a limit or an accelerator takes: each is one module or one entry, and
every command that should know of it does. Each addition here is a throwaway made in the test."""

from __future__ import annotations

import importlib
import math

import pandas as pd

from kvpipe import cli, commands
from kvpipe.decide import limits
from kvpipe.orchestrate.search import objectives
from kvpipe.predict import hardware

from conftest import run_cli

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


# ---- a load kind: one module and its YAML -------------------------------------------------------

GAP = '''"""load=gap: one request every load.gap_s seconds, in turn: a load made in a test."""

from dataclasses import dataclass

from kvpipe.errors import ConfigError
from kvpipe.load.base import Load


class Gap(Load):
    name = "gap"
    order = 90

    @dataclass
    class Settings:
        gap_s: float = 0.05  # seconds between two arrivals

    def check(self):
        super().check()
        if not self.settings.gap_s >= 0:
            raise ConfigError("load.gap_s", self.settings.gap_s, "expected seconds, 0 or more")

    def arrivals(self, requests):
        return [number * self.settings.gap_s for number in range(len(requests))]

    def label(self):
        return f"gap({self.settings.gap_s:g}s)"
'''

GAP_YAML = "kind: gap\ngap_s: 0.05\nrequests: null\nmax_ttft_ms: null\nmax_tpot_ms: null\n"


def test_a_new_load_is_one_module_and_its_yaml_and_a_served_job_uses_its_arrivals(tmp_path, monkeypatch):
    import sys

    import pytest

    from kvpipe import load
    from kvpipe.errors import ConfigError
    from kvpipe.job.runner import job_for
    from kvpipe.job.shared_rounds import run_rounds
    from kvpipe.spec import register_schemas

    from conftest import TINY, spec_for

    (tmp_path / "gap.py").write_text(GAP)
    (tmp_path / "conf" / "load").mkdir(parents=True)
    (tmp_path / "conf" / "load" / "gap.yaml").write_text(GAP_YAML)
    monkeypatch.setattr(load, "__path__", [*load.__path__, str(tmp_path)])
    importlib.import_module("kvpipe.load.gap")  # as kvpipe.load's import_plugins would at start-up
    register_schemas()  # the load schema gains gap_s
    try:
        found = f"hydra.searchpath=[file://{tmp_path / 'conf'}]"
        job = ("workload.prompts=[Hi.,Hello there.]", "workload.repeats=1", "load.requests=3")

        def served(*overrides):
            return spec_for(*TINY, found, "load=gap", *job, *overrides)

        assert "gap" in load.names() and served().params()["load.gap_s"] == "0.05"
        assert served("load.gap_s=0.2").measurement_key() != served().measurement_key()
        with pytest.raises(ConfigError, match=r"^load.gap_s=-1.0 is not valid: expected seconds, 0 or more$"):
            served("load.gap_s=-1")
        measured = job_for(served("load.gap_s=0.2"))
        measured.prepare()
        run_rounds([measured], seed=0, shuffle=False)
        (requests,) = [outcome.served for outcome in measured.passes]
        first = requests[0].arrival_s
        assert [r.arrival_s - first for r in requests] == pytest.approx([0.0, 0.2, 0.4])  # its arrivals, used
        result = measured.result({})
        assert result.tags["load"] == "gap(0.2s)" and result.metrics["served_requests"] == 3
        assert result.metrics["serve_span_ms"] >= 400
    finally:
        del load.Load.registry.classes["gap"]
        sys.modules.pop("kvpipe.load.gap", None)
        register_schemas()
