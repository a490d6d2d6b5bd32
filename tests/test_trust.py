"""Numbers a user decides from mean what their names say: peak memory counted once, noise and mixed
machines said out loud in compare and recommend, and a peak that does not depend on warm-up."""

from __future__ import annotations

import pandas as pd
import pytest

from kvpipe.decide import compare
from kvpipe.decide import runs as recorded
from kvpipe.decide.limits import Limits
from kvpipe.decide.recommend import choose
from kvpipe.job.runner import run_job
from kvpipe.model import loading

from conftest import spec_for

MIB = 2**20


def runs(*rows: dict) -> pd.DataFrame:
    """Runs as MLflow returns them: cache label, TPOT, absolute peak, and any extra tags."""
    records = []
    for i, row in enumerate(rows):
        cache = row.get("cache", "dynamic")
        record = {
            "run_id": f"run{i:05d}xyz",
            "start_time": pd.Timestamp(2026, 1, 1) + pd.Timedelta(seconds=i),
            "params.cache.strategy": cache.split(":")[0].split("+")[0],
            "tags.kvpipe.cache.effective": cache,
            "tags.kvpipe.peak_memory_source": row.get("source", "linux_vmhwm"),
            "tags.kvpipe.host": "box",
            "tags.kvpipe.cpu_model": "cpu",
            "metrics.tpot_ms": row.get("tpot_ms", 40.0),
            "metrics.tpot_ms_std": 1.0,
            "metrics.peak_memory_bytes": row.get("peak_mib", 700) * MIB,
            "metrics.weights_bytes": 500 * MIB,
        }
        record.update({f"tags.kvpipe.{k}": v for k, v in row.get("tags", {}).items()})
        record.update({f"metrics.{k}": v for k, v in row.get("metrics", {}).items()})
        records.append(record)
    return recorded.with_derived(pd.DataFrame(records))


def test_an_absolute_cpu_peak_is_never_given_the_weights_a_second_time():
    table = runs({"peak_mib": 700, "source": "linux_vmhwm"}, {"peak_mib": 700, "source": "rss_sampler"})
    assert list(table["memory_bytes"]) == [700 * MIB, 700 * MIB]
    assert list(compare.display_table(table)["peak memory"]) == ["700.0 MiB", "700.0 MiB"]


def test_a_noisy_run_on_the_front_is_marked_in_compare():
    table = runs(
        {"cache": "dynamic", "tpot_ms": 40.0, "tags": {"noisy": "false"}, "metrics": {"timing_noise_cv": 0.02}},
        {"cache": "static", "tpot_ms": 3.0, "tags": {"noisy": "true"}, "metrics": {"timing_noise_cv": 0.35}},
    )
    shown = compare.display_table(table)
    assert list(shown["★"]) == ["", "★ ⚠"]
    assert list(shown["timing noise"]) == ["2%", "35%"]
    assert "⚠ noisy" in compare.FOOTNOTE


def test_a_noisy_recommendation_says_it_is_noisy():
    table = runs(
        {"cache": "dynamic", "tpot_ms": 40.0, "tags": {"noisy": "false"}},
        {"cache": "static", "tpot_ms": 3.0, "tags": {"noisy": "true"}, "metrics": {"timing_noise_cv": 0.35}},
    )
    chosen, (what, _) = choose(table, Limits())
    assert chosen["label"] == "static" and "NOISY: TTFT or TPOT varied by 35% between calls of one shape" in what


def test_a_table_from_two_machines_says_so():
    table = runs({"tags": {"host": "laptop"}}, {"tags": {"host": "server"}})
    warning = compare.mixed_environments(table)
    assert warning.startswith("⚠ these runs come from 2 environments") and "laptop" in warning and "server" in warning
    assert compare.mixed_environments(runs({}, {})) is None


def test_every_run_says_where_it_ran_and_how_loaded_the_machine_was():
    result = run_job(spec_for("model=tiny_random", "tracking=off", "quality=off", "workload.max_new_tokens=3",
                              "workload.warmup=0", "workload.repeats=2"))  # fmt: skip
    for tag in ("host", "cpu_model", "physical_cores", "torch_threads", "torch_version", "transformers_version"):
        assert result.tags[tag], tag
    assert result.metrics["load_average_start"] >= 0 and result.metrics["load_average_end"] >= 0
    assert result.tags["noisy"] in ("true", "false")
    assert result.metrics["timing_noise_cv"] >= 0
    assert result.metrics["peak_memory_bytes"] > result.metrics["weights_bytes"]  # absolute: weights included
    assert 0 < result.metrics["peak_over_baseline_bytes"] < result.metrics["peak_memory_bytes"]


@pytest.mark.slow
def test_peak_memory_is_the_same_with_and_without_warm_up_on_the_embedded_model():
    peaks = {}
    for warmup in (0, 1):
        loading._LOADED.clear()  # a fresh load each time: a cold first call is what warm-up hides
        spec = spec_for("tracking=off", "quality=off", "workload.max_new_tokens=4", "workload.repeats=1",
                        f"workload.warmup={warmup}", "workload.prompts=[Hi.]")  # fmt: skip
        peaks[warmup] = run_job(spec).metrics["peak_memory_bytes"]
    assert abs(peaks[0] - peaks[1]) <= 0.05 * peaks[1], peaks
