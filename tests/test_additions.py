"""What adding a subcommand, a limit or an accelerator takes: each is one module or one entry, and
every command that should know of it does. Each addition here is a throwaway made in the test."""

from __future__ import annotations

import importlib
import json
import math
import sys

import pandas as pd
import pytest

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


# ---- a cache strategy and a quantization backend: one module and its YAML each ------------------

STRATEGY = '''"""cache=spare: a StaticCache with `spare` tokens past prompt + new tokens, made in a test."""

from dataclasses import dataclass

from kvpipe.cache.accounting import dense_bytes
from kvpipe.cache.base import CacheSetup, CacheStrategy
from kvpipe.errors import ConfigError


class Spare(CacheStrategy):
    name = "spare"
    family = "static"
    order = 26

    @dataclass
    class Settings:
        spare: int = 16

    def check(self, overridden=frozenset()):
        if self.settings.spare < 0:
            raise ConfigError("cache.spare", self.settings.spare, "expected 0 or more")
        return super().check(overridden)

    def build(self, loaded, longest_prompt):
        from transformers import StaticCache

        length = longest_prompt + self.choice.max_new_tokens + self.settings.spare

        def make(capacity=0):
            return StaticCache(config=loaded.model.config, max_cache_len=max(length, capacity))

        return CacheSetup(self.name, self.name, make, {"disable_compile": True})

    def predict_kv_bytes(self, kv, prompt_tokens, new_tokens):
        return dense_bytes(kv, prompt_tokens + new_tokens + self.settings.spare)
'''

# Only what a backend must say: no residual_length, no dequantized_tokens, no axes (the base's defaults).
BACKEND = '''"""backend=plain16: layers kept as transformers' DynamicLayer, made in a test."""

from dataclasses import dataclass

from kvpipe.cache.backends.base import QuantBackend


class Plain16(QuantBackend):
    name = "plain16"
    order = 90
    nbits_choices = (16,)

    @dataclass
    class Settings:
        nbits: int = 16
        header_bytes: int = 0

    @classmethod
    def layer_class(cls):
        from transformers.cache_utils import DynamicLayer

        return DynamicLayer

    def layer_bytes(self, kv, window, prompt_tokens, new_tokens):
        return (prompt_tokens + new_tokens - 1) * kv.token_bytes() + self.settings.header_bytes

    def token_bytes(self, kv):
        return kv.token_bytes()
'''

ADDED = {"cache": ("spare", STRATEGY, "strategy: spare\nspare: 16\n"),
         "backend": ("plain16", BACKEND, "name: plain16\nnbits: 16\nheader_bytes: 0\n")}  # fmt: skip


@pytest.fixture
def added(tmp_path, monkeypatch):
    """A strategy module and a backend module in a folder of their own, each with its YAML in a
    config folder Hydra searches (hydra.searchpath): no file of kvpipe's is edited."""
    from kvpipe import cache
    from kvpipe.cache import backends
    from kvpipe.registry import import_plugins
    from kvpipe.spec import register_schemas

    for group, package in (("cache", cache), ("backend", backends)):
        name, module, yaml = ADDED[group]
        (tmp_path / "modules" / group).mkdir(parents=True)
        (tmp_path / "modules" / group / f"{name}.py").write_text(module)
        (tmp_path / "conf" / group).mkdir(parents=True)
        (tmp_path / "conf" / group / f"{name}.yaml").write_text(yaml)
        monkeypatch.setattr(package, "__path__", [*package.__path__, str(tmp_path / "modules" / group)])
        import_plugins(package.__name__, package.__path__)  # what importing the package does
    register_schemas()
    yield [f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "model=tiny_random"]
    for group, package in (("cache", cache), ("backend", backends)):
        name = ADDED[group][0]
        del package.get(name).registry.classes[name]
        sys.modules.pop(f"{package.__name__}.{name}", None)
    register_schemas()


def test_a_new_strategy_and_backend_compose_with_their_own_typed_settings(added):
    from kvpipe.errors import ConfigError
    from kvpipe.spec import spec_from

    spare = spec_from([*added, "cache=spare", "cache.spare=4"])
    assert spare.strategy.settings.spare == 4 and spare.as_dict()["cache"] == {"strategy": "spare", "spare": 4}
    with pytest.raises(ConfigError, match=r"cache.spare='many' .*wrong type; expected int \(cache=spare's type\)"):
        spec_from([*added, "cache=spare", "cache.spare=many"])
    assert spec_from([*added, "cache.spare=4"]).warnings == ("cache.spare is ignored by cache=dynamic",)
    plain = spec_from([*added, "cache=quantized", "backend=plain16", "backend.header_bytes=64"])
    assert plain.strategy.backend.settings.header_bytes == 64 and plain.residual_length == 128  # no residual
    with pytest.raises(ConfigError, match=r"backend.header_bytes='x' .*expected int \(backend=plain16's type\)"):
        spec_from([*added, "cache=quantized", "backend=plain16", "backend.header_bytes=x"])


def test_plan_shows_the_rows_of_a_new_strategy_and_of_a_backend_without_its_optional_hooks(added, tmp_path):
    planned = run_cli(["plan", *added, "--context", "100", "--device", "cpu"], cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr
    rows = {line.split("│")[1].strip() for line in planned.stdout.splitlines() if line.count("│") > 2}
    assert {"spare", "plain16", "dynamic"} <= rows, rows  # a backend that reads no axis: a row of its own


@pytest.mark.slow  # two real jobs through the command line
def test_a_new_strategy_and_backend_each_run_a_job(added, tmp_path):
    quick = ["workload.max_new_tokens=4", "workload.warmup=0", "workload.repeats=1", "quality=off", "tracking=off"]
    for choice in (["cache=spare", "cache.spare=4"], ["cache=quantized", "backend=plain16"]):
        folder = tmp_path / choice[0].replace("=", "_")
        folder.mkdir()
        ran = run_cli([*added, *quick, *choice], cwd=folder)
        assert ran.returncode == 0, ran.stderr
        (path,) = folder.rglob("result.json")
        result = json.loads(path.read_text())
        assert result["config"]["cache"]["strategy"] == choice[0].split("=")[1]
        assert result["metrics"]["kv_cache_bytes"] > 0
