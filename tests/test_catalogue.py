"""One metric catalogue: every figure a run reports is catalogued once (name, unit, format,
direction, label), and README's metrics table, the public contract, lists every catalogued one."""

from __future__ import annotations

import re

from kvpipe.catalogue import base_name
from kvpipe.job.runner import run_job
from kvpipe.workload import metrics

from conftest import REPO, TINY, spec_for


def readme_metrics_table() -> set[str]:
    text = (REPO / "README.md").read_text()
    section = text.split("## Metrics (a public contract)")[1].split("\n## ")[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([a-z0-9_]+)`", row)}


def test_every_catalogued_metric_is_in_the_readmes_metrics_table():
    missing = sorted(set(metrics()) - readme_metrics_table())
    assert missing == [], f"add these to README's metrics table: {missing}"


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
