"""One metric catalogue: every figure a run reports is catalogued once (name, unit, format,
direction, label), and the manual's metrics page, the public contract, says what every catalogued
one means (docs/metrics.yaml, from which docs/hooks/generate.py builds the page's table)."""

from __future__ import annotations

import yaml

from kvpipe.catalogue import base_name
from kvpipe.job.runner import run_job
from kvpipe.workload import metrics

from conftest import REPO, TINY, spec_for


def described_metrics() -> list[str]:
    return [name for entry in yaml.safe_load((REPO / "docs" / "metrics.yaml").read_text()) for name in entry["metrics"]]


def test_every_catalogued_metric_has_one_meaning_on_the_metrics_page():
    described = described_metrics()
    assert sorted(set(metrics()) - set(described)) == [], "add these to docs/metrics.yaml"
    assert sorted(set(described) - set(metrics())) == [], "docs/metrics.yaml describes metrics kvpipe does not report"
    assert len(described) == len(set(described))


def test_every_metric_a_run_reports_is_catalogued():
    reported = set()
    for workload in ("workload=long_context", "workload=passkey"):
        job = run_job(
            spec_for(
                *TINY, workload, "workload.prompt_tokens=30", "workload.context_tokens=120", "workload.trials=1",
                "workload.repeats=2", "quality=on", "quality.windows=1", "quality.scored_tokens=4",
            )
        )  # fmt: skip
        reported |= {name for name in job.metrics if "/" not in name}  # stepped: per context length
    assert sorted(name for name in reported if base_name(name, metrics()) not in metrics()) == []


def test_lower_is_better_is_said_for_every_figure_recommend_and_the_front_weigh():
    for name in ("peak_memory_bytes", "tpot_ms", "kl_vs_reference", "kv_cache_bytes"):
        assert metrics()[name].lower_is_better is True
    assert metrics()["retrieval_accuracy"].lower_is_better is False


def test_a_metric_shows_the_same_in_the_run_table_and_in_compare():
    tpot = metrics()["tpot_ms"]
    assert tpot.show(51.13, 2.46) == "51.1 ± 2.5 ms"
    assert (tpot.header(), tpot.cell(51.13, 2.46)) == ("TPOT ms", "51.1 ± 2.5")
    assert metrics()["kv_compression"].cell(1.954) == metrics()["kv_compression"].show(1.954) == "1.95×"
    assert metrics()["peak_memory_bytes"].show(700 * 2**20) == "700.0 MiB"
    assert metrics()["retrieval_accuracy"].show(0.5) == "50%"
    assert metrics()["kl_vs_reference"].show(0.006) == "0.006 nats"


def test_the_catalogue_imports_no_workload_and_takes_theirs_from_kvpipe_workload():
    from kvpipe import catalogue

    assert "retrieval_accuracy" not in catalogue.catalogue() and "retrieval_accuracy" in metrics()
    assert list(metrics())[: len(catalogue.CORE)] == [metric.name for metric in catalogue.CORE]  # core first
    assert (
        base_name("retrieval_accuracy_std", metrics()) == "retrieval_accuracy" and base_name("tpot_ms_cv") == "tpot_ms"
    )
