"""What adding a plugin takes: a cache strategy, a quantization backend, an eviction press, a load kind
or a workload with its own metric is one module and its YAML, each made in a temporary folder here,
and every stage that should know of it does (its typed settings compose, `kvpipe plan` shows it, a
real job runs it, and its figures reach the record, MLflow, compare and recommend)."""

from __future__ import annotations

import importlib
import json
import sys

import pytest

from kvpipe.orchestrate.search import objectives

from conftest import run_cli

COUNTUP = '''"""workload=countup: '1 2 3' and the like as prompts; its own quality metric is the share of the
characters the model writes back that are digits. Made in a test."""

from dataclasses import dataclass, field
from functools import partial

from kvpipe.catalogue import Metric
from kvpipe.workload.base import Quality, Workload, Window, padded_batch
from kvpipe.workload._encoding import encode
from kvpipe.workload._scored import Scored, ScoredFile, Step

DIGIT_SHARE = Metric("digit_share", "digits answered", "", ".0%", False, in_run_table=True, compare=True)


def write_summary(shares, path, title):
    path.write_text(f"{title}: {shares}\\n")


class Countup(Workload):
    name = "countup"
    order = 95
    metrics = (DIGIT_SHARE,)
    quality = Quality(DIGIT_SHARE, term="digit", axis="digits answered")

    @dataclass
    class Settings:
        lengths: list = field(default_factory=lambda: [3, 5])

    def ids(self, tokenizer, length):
        return encode(tokenizer, " ".join(str(n) for n in range(1, length + 1)))

    def batches(self, tokenizer, device):
        return [padded_batch(tokenizer, [self.ids(tokenizer, n)], device, [n]) for n in self.settings.lengths]

    def windows(self, tokenizer, count, scored_tokens):
        return [Window(self.ids(tokenizer, max(self.settings.lengths)), None)] * count

    def answers(self, tokenizer, eos_ids, batches, calls):
        rows = []
        for index, call in enumerate(calls):
            text = tokenizer.decode(call.new_tokens[0], skip_special_tokens=True)
            share = sum(c.isdigit() for c in text) / max(1, len(text))
            rows.append({"length": batches[index % len(batches)].rows[0], "answer": text, "digit_share": share})
        return rows

    def scored(self, rows):
        by_length = {}
        for row in rows:
            by_length.setdefault(row["length"], []).append(row["digit_share"])
        shares = {length: sum(v) / len(v) for length, v in sorted(by_length.items())}
        return Scored(
            metrics={DIGIT_SHARE: sum(r["digit_share"] for r in rows) / len(rows)},
            steps=[Step("digit_share/by_length", share, length) for length, share in shares.items()],
            rows=rows,
            tables={"countup/answers.json": rows},
            files=[ScoredFile("countup.txt", "countup", partial(write_summary, shares))],
        )
'''


@pytest.fixture
def countup(tmp_path, monkeypatch):
    """The module above, dropped into kvpipe.workload's folder (here: one more folder on its path) and
    found as kvpipe finds every workload; gone again after the test."""
    from kvpipe import workload
    from kvpipe.jobspec import register_schemas
    from kvpipe.registry import import_plugins

    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "countup.py").write_text(COUNTUP)
    monkeypatch.setattr(workload, "__path__", [*workload.__path__, str(folder)])
    import_plugins(workload.__name__, workload.__path__, packages=True)
    register_schemas()  # the workload schema gains `lengths`
    yield workload.get("countup")
    del workload.REGISTRY["countup"]
    sys.modules.pop("kvpipe.workload.countup", None)
    register_schemas()


@pytest.mark.slow  # two real jobs and an MLflow store: ~15 s
def test_a_new_workload_with_its_own_metric_is_one_module(countup, tmp_path, existing_store):
    from mlflow.tracking import MlflowClient

    from kvpipe import workload
    from kvpipe.decide import compare
    from kvpipe.decide.limits import Limits
    from kvpipe.decide.recommend import choose
    from kvpipe.decide.runs import judged_by, load_runs
    from kvpipe.job.runner import run_job
    from kvpipe.jobspec import make_spec
    from kvpipe.record import recorder, sync
    from kvpipe.record.result import Result

    from conftest import TINY, compose_config

    db = existing_store(tmp_path)
    uri = f"sqlite:///{db}"
    assert workload.quality_metrics()["countup"].metric.name == "digit_share"
    recorded = {}
    for strategy, tracking in (("dynamic", f"tracking=sqlite tracking.uri={uri}"), ("static", "tracking=off")):
        spec = make_spec(compose_config([*TINY, "workload.kind=countup", f"cache={strategy}", *tracking.split()]))
        job = run_job(spec)
        path = recorder.record(spec, Result.finished(spec, job), tmp_path / strategy, tmp_path)
        recorded[strategy] = Result.load(path)
        # the run's record: its metric, its rows, and its file beside result.json
        assert recorded[strategy].metrics["digit_share"] == job.metrics["digit_share"]
        assert {row["length"] for row in recorded[strategy].answers} == {3, 5}
        assert (tmp_path / strategy / "countup.txt").read_text().startswith(f"{strategy} · tiny_random · countup")
    # a result kept on disk reaches MLflow later with `kvpipe sync`, as the one tracked from the start did
    sync.sync_one(tmp_path / "static" / "result.json", recorded["static"], uri)
    client = MlflowClient(uri)
    for strategy in recorded:
        run_id = Result.load(tmp_path / strategy / "result.json").mlflow_run_id
        assert client.get_run(run_id).data.metrics["digit_share"] == recorded[strategy].metrics["digit_share"]
        assert [p.step for p in client.get_metric_history(run_id, "digit_share/by_length")] == [3, 5]
        artifacts = {a.path for a in client.list_artifacts(run_id, "countup")}
        assert artifacts == {"countup/answers.json", "countup/countup.txt"}
    # compare: its column, from its class
    runs, _ = load_runs("kvpipe", None, uri, whole_experiment=True)
    assert "digits answered" in compare.display_table(runs).columns
    # recommend: --min-accuracy bounds its quality metric, and the answer names it
    share = runs["metrics.digit_share"].min()
    chosen, (what, _) = choose(runs, Limits(accuracy=share))
    assert f"digits answered {chosen['metrics.digit_share']:.0%} (at least {share:.0%})" in what
    excess = Limits(accuracy=0.5).excesses(runs.iloc[0])["accuracy"]  # above 0: it misses by that share
    assert excess == pytest.approx(1 - runs.iloc[0]["metrics.digit_share"] / 0.5)
    # the search: its objective is 1 - the share, named from its declaration
    assert objectives.values(runs.iloc[0], "cpu")[2] == pytest.approx(1 - runs.iloc[0]["metrics.digit_share"])
    assert objectives.axis_names("cpu", judged_by(runs))[2] == "1 - digit accuracy"


# ---- a press that scores with the prompt's hidden states: one module and its YAML ------------------

LAST_QUERY = '''"""press=last_query: a press made in a test (kvpipe's own press=tova is the real one): keep
the prompt tokens the last one attends to most, over every query head; the last token itself is kept."""

from dataclasses import dataclass

from kvpipe.cache.presses.base import Press


class LastQuery(Press):
    name = "last_query"
    needs_queries = True  # without attention weights (sdpa), the last token's query, from its hidden state

    @dataclass
    class Settings:
        ratio: float = 0.5  # the fraction of the prompt's KV removed

    def protected(self, prompt_tokens):
        return 0, 1

    def score(self, module, hidden_states, keys, values, attentions, position_embeddings):
        from kvpipe.cache.presses._attention import window_attention

        if attentions is None:
            attentions = window_attention(module, hidden_states, keys, position_embeddings, 1)
        return attentions[..., -1, :].float().mean(dim=1, keepdim=True).expand(-1, keys.shape[1], -1)
'''
LAST_QUERY_YAML = "# Keep the prompt tokens the last one attends to most.\nname: last_query\nratio: 0.5\n"


@pytest.fixture
def last_query(tmp_path, monkeypatch):
    """press=last_query, made in tmp_path: its module beside kvpipe's presses, its YAML on Hydra's search path."""
    from kvpipe.cache import presses
    from kvpipe.jobspec import register_schemas
    from kvpipe.registry import import_plugins

    (tmp_path / "last_query.py").write_text(LAST_QUERY)
    (tmp_path / "press").mkdir()
    (tmp_path / "press" / "last_query.yaml").write_text(LAST_QUERY_YAML)
    monkeypatch.setattr(presses, "__path__", [*presses.__path__, str(tmp_path)])
    monkeypatch.setattr(presses.Press.registry, "classes", dict(presses.Press.registry.classes))
    import_plugins(presses.__name__, presses.__path__)  # as the package's import does in a new process
    yield f"hydra.searchpath=[file://{tmp_path}]"
    monkeypatch.undo()
    sys.modules.pop(f"{presses.__name__}.last_query")
    del presses.last_query
    register_schemas()


@pytest.mark.slow  # a real job and kvpipe plan
def test_a_new_press_is_one_module_and_its_yaml(last_query, tmp_path):
    import torch
    from test_presses import JOB, assert_each_layer_keeps_its_protected_and_highest_scored, prefill_under

    from kvpipe import model as models
    from kvpipe.cache import accounting
    from kvpipe.job.runner import run_job
    from kvpipe.predict import bytes_plan as plan

    from conftest import spec_for

    job = ("model=tiny_random", *JOB, "workload.prompt_tokens=40", "workload.max_new_tokens=7", last_query)
    spec = spec_for(*job, "press=last_query", "press.ratio=0.75")
    assert spec.strategy.describe().startswith("cache=dynamic press=last_query press.ratio=0.75")
    layers = prefill_under(spec, 40)
    assert_each_layer_keeps_its_protected_and_highest_scored(spec.strategy.press, layers, 40)
    for layer in layers:  # the last token's attention, rebuilt from its hidden state (sdpa returns no weights)
        assert torch.allclose(layer["scores"].sum(dim=-1), torch.ones(1))
    kv = accounting.kv_shape(models.read_shape(spec.model), spec.workload.batch_size, spec.model.dtype)
    predicted = plan.predict_kv_bytes(spec, kv, 40, 7)
    assert run_job(spec).metrics["kv_cache_bytes"] == predicted == kv.full_layers * (10 + 7 - 1) * kv.token_bytes()
    planned = run_cli(["plan", "model=tiny_random", last_query], cwd=tmp_path)
    assert planned.returncode == 0 and "dynamic + last_query0.5" in planned.stdout, planned.stderr


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


@pytest.mark.slow  # a real served job: ~1.5 s
def test_a_new_load_is_one_module_and_its_yaml_and_a_served_job_uses_its_arrivals(tmp_path, monkeypatch):
    import sys

    import pytest

    from kvpipe import load
    from kvpipe.errors import ConfigError
    from kvpipe.job.runner import job_for
    from kvpipe.jobspec import register_schemas
    from kvpipe.schedule import run_rounds

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
    from kvpipe.jobspec import register_schemas
    from kvpipe.registry import import_plugins

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
    from kvpipe.jobspec import spec_from

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
