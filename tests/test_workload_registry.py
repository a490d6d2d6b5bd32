"""One place per workload: a workload defined here, in ~30 lines, flows through every stage with no
other module changed: validated from its own settings, run, scored its own way, recorded to
result.json and MLflow, shown by compare and weighed by recommend. And no module outside
kvpipe/workload spells a workload's kind."""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvpipe import workload
from kvpipe.catalogue import Metric
from kvpipe.decide import compare
from kvpipe.decide.limits import Limits
from kvpipe.decide.recommend import choose
from kvpipe.decide.runs import load_runs
from kvpipe.errors import ConfigError
from kvpipe.job.runner import run_job
from kvpipe.jobspec import make_spec, register_schemas
from kvpipe.record import recorder
from kvpipe.record.result import Result
from kvpipe.workload._encoding import encode
from kvpipe.workload.base import REGISTRY, Quality, Scored, Window, Workload, padded_batch

from conftest import REPO, TINY, compose_config, quoted_outside


@pytest.fixture
def countdown():
    """'5 4 3 2 1' as the prompt; its own score is how many digits the model writes back."""

    class Countdown(Workload):
        name = "countdown"
        order = 90
        metrics = (Metric("countdown_digits", "digits written", "", ".2f", False, in_run_table=True, compare=True),)

        @dataclass
        class Settings:
            start: int = 5

        def check(self):
            if self.settings.start < 1:
                raise ConfigError("workload.start", self.settings.start, "expected 1 or more")
            return super().check()

        def ids(self, tokenizer):
            return encode(tokenizer, " ".join(str(n) for n in range(self.settings.start, 0, -1)))

        def batches(self, tokenizer, device):
            return [padded_batch(tokenizer, [self.ids(tokenizer)], device, [self.settings.start])]

        def windows(self, tokenizer, count, scored_tokens):
            return [Window(self.ids(tokenizer), None)] * count

        def answers(self, tokenizer, eos_ids, batches, calls):
            return [{"digits": sum(c.isdigit() for c in tokenizer.decode(call.new_tokens[0]))} for call in calls]

        def scored(self, rows):
            return Scored({self.metrics[0]: statistics.fmean(a["digits"] for a in rows)}, rows=rows)

    register_schemas()  # the workload schema gains `start`
    yield Countdown
    del REGISTRY["countdown"]
    register_schemas()


def countdown_spec(*overrides: str):
    return make_spec(compose_config([*TINY, "workload.kind=countdown", *overrides]))


@pytest.mark.slow  # real jobs
def test_a_new_workload_is_validated_from_its_own_settings(countdown):
    assert countdown_spec("workload.start=3").bound_workload.settings.start == 3
    with pytest.raises(ConfigError, match=r"workload.start=0 .*expected 1 or more"):
        countdown_spec("workload.start=0")
    assert countdown_spec("workload.start=3").measurement_key() != countdown_spec("workload.start=4").measurement_key()
    # A chat job does not read it: the same measurement with or without it, and no param.
    chat = make_spec(compose_config([*TINY, "workload.start=3"]))
    assert chat.measurement_key() == make_spec(compose_config(list(TINY))).measurement_key()
    assert "workload.start" not in chat.params() and countdown_spec().params()["workload.start"] == "5"


def test_an_unknown_kind_names_the_registered_ones(countdown):
    with pytest.raises(
        ConfigError, match="workload.kind='nope'.*chat, long_context, passkey, ruler, dataset, .*countdown"
    ):
        make_spec(compose_config([*TINY, "workload.kind=nope"]))


@pytest.mark.slow  # an MLflow store: ~12 s
def test_a_new_workload_runs_records_and_is_compared_and_recommended(countdown, tmp_path, existing_store):
    db = existing_store(tmp_path)
    runs = []
    for strategy in ("dynamic", "static"):
        spec = countdown_spec(
            f"cache={strategy}", "workload.start=4", "tracking=sqlite", f"tracking.uri=sqlite:///{db}"
        )
        job = run_job(spec)
        assert job.metrics["countdown_digits"] == statistics.fmean(a["digits"] for a in job.answers)
        result = Result.finished(spec, job)
        path = recorder.record(spec, result, tmp_path / strategy, tmp_path)
        runs.append(Result.load(path))
    assert runs[0].answers and runs[0].mlflow_run_id  # its rows in result.json, its run in MLflow
    assert "countdown_digits" in workload.metrics()
    table, _ = load_runs("kvpipe", None, f"sqlite:///{db}", whole_experiment=True)
    assert set(table["params.workload.start"]) == {"4"}
    shown = compare.display_table(table)
    assert "digits written" in shown.columns  # its own metric, from its class, in compare's table
    chosen, (what, why) = choose(table, Limits())
    assert chosen is not None and chosen["strategy"] in ("dynamic", "static")


OWNERS = ("kvpipe/workload/",)


def test_no_module_outside_the_workload_stage_names_a_kind():
    offenders = quoted_outside(OWNERS, workload.names())
    assert offenders == [], "\n".join(offenders)


def test_measure_imports_nothing_from_the_stages_before_it():
    for path in sorted((REPO / "kvpipe" / "measure").glob("*.py")):
        text = path.read_text()
        assert not re.search(r"from kvpipe\.(job|workload)|import kvpipe\.(job|workload)", text), path.name


def test_every_workload_option_file_names_a_registered_kind():
    for option in sorted(Path(REPO / "conf" / "workload").glob("*.yaml")):
        match = re.search(r"^kind: (\w+)", option.read_text(), re.MULTILINE)
        assert match and match.group(1) == option.stem and match.group(1) in workload.names(), option


def test_a_quality_metric_must_be_one_of_the_workloads_own_with_a_direction():
    count = Metric("echo_count", "echoes", "", ".0f")  # neither higher nor lower is better
    with pytest.raises(TypeError, match="Echo.quality: expected one of its own metrics, with a direction"):

        class Echo(Workload):
            metrics = (count,)
            quality = Quality(count, term="echo", axis="echoes")

    assert "echo" not in REGISTRY


def test_each_workload_that_judges_its_answers_declares_it_on_its_class():
    for kind in workload.registered():
        judged = workload.quality_metrics().get(kind.name)
        assert judged is kind.quality and (judged is None or judged.metric in kind.metrics)


def test_a_workload_scores_only_the_metrics_it_declares():
    declared = Metric("echo_words", "words echoed", "", ".0f", False)
    stray = Metric("echo_chars", "characters echoed", "", ".0f", False)

    class Echo(Workload):  # no `name`: not registered
        metrics = (declared,)

        def answers(self, tokenizer, eos_ids, batches, calls):
            return [{"words": 2, "chars": 9}]

        def scored(self, rows):
            return Scored({declared: 2.0, stray: 9.0}, rows=rows)

    with pytest.raises(TypeError, match=r"Echo scored \['echo_chars'\], which its `metrics` do not declare"):
        Echo({}).score(None, set(), [], [])
