"""The GPU check (benchmarks/gpu_check.sh): its reduced form runs end to end on CPU, and it fails loudly."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time

import pytest
import torch

from conftest import REPO

CHECKS = {
    "offload_cuts_peak_memory",
    "oom_fallback_under_limit",
    "quantized_cuts_kv_memory",
    "static_compile_speeds_up_decode",
    "sliding_window_plan_and_offload",
}


def load_gpu_check():
    """benchmarks/ is not a package: import the script from its path (registered, as dataclasses need)."""
    if "gpu_check" not in sys.modules:
        spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu_check.py")
        sys.modules["gpu_check"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["gpu_check"])
    return sys.modules["gpu_check"]


@pytest.fixture(scope="module")
def reduced(tmp_path_factory):
    """One reduced run for the whole module: (process, report folder, wall seconds, checks by name)."""
    out = tmp_path_factory.mktemp("gpu_check")
    started = time.monotonic()
    proc = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--reduced", "--out", str(out)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHON": sys.executable},
    )  # the script runs with this interpreter
    wall_s = time.monotonic() - started
    document = json.loads((out / "gpu_check.json").read_text()) if (out / "gpu_check.json").exists() else {}
    return proc, out, wall_s, {check["name"]: check for check in document.get("checks", [])}


@pytest.mark.slow  # reads the reduced run: a process running nine tiny_random jobs
def test_reduced_form_exits_zero_and_writes_both_reports(reduced):
    proc, out, _, _ = reduced
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (out / "gpu_check.json").is_file() and (out / "gpu_check.md").is_file()
    assert f"reports: {out}/gpu_check.md" in proc.stdout


@pytest.mark.slow  # reads the reduced run: a process running nine tiny_random jobs
def test_reduced_form_reports_the_wall_time_it_took(reduced):
    """The total it reports is its own clock's, within the test's around it (how long that is depends
    on the machine: the manual gives it, measured)."""
    proc, out, outer_s, _ = reduced
    reported_s = json.loads((out / "gpu_check.json").read_text())["wall_s"]
    assert 0 < reported_s <= outer_s
    assert f"in {reported_s:.0f} s" in proc.stdout


@pytest.mark.slow  # reads the reduced run: a process running nine tiny_random jobs
def test_report_holds_every_check_with_figures_and_detail(reduced):
    _, out, _, checks = reduced
    assert set(checks) == CHECKS
    assert all(check["figures"] and check["detail"] for check in checks.values())
    markdown = (out / "gpu_check.md").read_text()
    assert all(name in markdown for name in CHECKS) and "torch " in markdown and "total wall time" in markdown


@pytest.mark.slow  # reads the reduced run: a process running nine tiny_random jobs
def test_offload_is_not_applicable_and_records_what_ran_instead(reduced):
    offload = reduced[3]["offload_cuts_peak_memory"]
    assert offload["passed"] is None
    expected = "offloaded" if torch.cuda.is_available() else "dynamic"  # offloading is off without CUDA
    assert offload["figures"]["offloaded"]["cache.effective"] == expected


@pytest.mark.slow  # reads the reduced run: a process running nine tiny_random jobs
def test_quantized_caches_hold_fewer_kv_bytes(reduced):
    quantized = reduced[3]["quantized_cuts_kv_memory"]
    assert quantized["passed"] is True
    figures = quantized["figures"]
    for backend in ("hqq_int4", "quanto_int4"):
        assert figures[backend]["kv_cache_bytes"] < figures["dynamic"]["kv_cache_bytes"]


@pytest.mark.slow  # reads the reduced run: a process running nine tiny_random jobs
def test_fallback_passes_through_an_injected_out_of_memory(reduced):
    fallback = reduced[3]["oom_fallback_under_limit"]
    assert fallback["passed"] is True
    assert (fallback["figures"]["fallback"]["fallback_from"], fallback["figures"]["fallback"]["fallback_to"]) == (
        "dynamic",
        "offloaded",
    )
    assert "injected" in fallback["detail"]


@pytest.mark.slow  # reads the reduced run: a process running nine tiny_random jobs
def test_compile_speed_is_recorded_but_not_judged_in_the_reduced_form(reduced):
    compiled = reduced[3]["static_compile_speeds_up_decode"]
    assert compiled["passed"] is None
    assert compiled["figures"]["speed_static_compile"]["cache.effective"] == "static+compile"
    assert compiled["figures"]["speedup"] > 0


@pytest.mark.slow  # reads the reduced run: a process running nine tiny_random jobs
def test_sliding_window_predictions_are_exact_and_the_host_split_is_judged_on_cuda_only(reduced):
    sliding = reduced[3]["sliding_window_plan_and_offload"]
    assert sliding["passed"] is True, sliding["detail"]
    for figures in sliding["figures"].values():
        assert figures["kv_cache_bytes"] == figures["predicted_kv_bytes"]
    if not torch.cuda.is_available():
        assert "not applicable (offloading needs CUDA)" in sliding["detail"]


def test_sliding_verdict_fails_where_offloading_only_full_layers_moves_as_much_to_the_host():
    gpu_check = load_gpu_check()
    job = {"kv_cache_bytes": 100, "predicted_kv_bytes": 100, "predicted_sliding_bytes": 40}
    figures = {
        "sliding_offload_all": {**job, "cache.effective": "offloaded_static", "kv_cache_host_bytes": 90},
        "sliding_offload_full_only": {**job, "cache.effective": "offloaded_static", "kv_cache_host_bytes": 55},
        "sliding_offloaded_dynamic": {**job, "cache.effective": "offloaded", "kv_cache_host_bytes": 55},
        "sliding_quantized": dict(job),
    }
    assert gpu_check.sliding_verdict(figures, "cuda")[0] is True
    figures["sliding_offload_full_only"]["kv_cache_host_bytes"] = 90  # the sliding layers moved too
    assert gpu_check.sliding_verdict(figures, "cuda")[0] is False
    figures["sliding_quantized"]["kv_cache_bytes"] = 101  # and a prediction off by a byte fails anywhere
    passed, detail = gpu_check.sliding_verdict(figures, "cpu")
    assert passed is False and "sliding_quantized" in detail


def test_a_failed_check_gives_exit_status_1_and_a_fail_in_the_report(tmp_path):
    gpu_check = load_gpu_check()
    checks = [
        gpu_check.Check("offload_cuts_peak_memory", None, {}, "not applicable"),
        gpu_check.Check("quantized_cuts_kv_memory", False, {"kv_cache_bytes": 1}, "no smaller than dynamic"),
    ]
    assert gpu_check.exit_status(checks) == 1
    meta = {
        "mode": "full",
        "model": "m",
        "sizes": {},
        "torch_version": "t",
        "transformers_version": "x",
        "wall_s": 1.0,
        "device": "test",
    }
    gpu_check.write_reports(tmp_path, checks, meta)
    assert json.loads((tmp_path / "gpu_check.json").read_text())["exit_status"] == 1
    markdown = (tmp_path / "gpu_check.md").read_text()
    assert re.search(r"^\| quantized_cuts_kv_memory +\| \*\*FAIL\*\* +\|", markdown, re.MULTILINE)


def test_not_applicable_checks_alone_give_exit_status_0():
    gpu_check = load_gpu_check()
    assert gpu_check.exit_status([gpu_check.Check("a", None, {}, ""), gpu_check.Check("b", True, {}, "")]) == 0


def test_a_job_that_raises_fails_its_check():
    gpu_check = load_gpu_check()
    jobs = {
        "dynamic": {"kv_cache_bytes": 10},
        "hqq_int4": {"kv_cache_bytes": 1},
        "quanto_int4": {"error": "OSError: CUDA_HOME environment variable is not set"},
    }
    check = gpu_check.judge(
        "quantized_cuts_kv_memory",
        jobs,
        ("dynamic", "hqq_int4", "quanto_int4"),
        lambda figures: gpu_check.quantized_verdict(figures, claims=False),
    )
    assert check.passed is False and "CUDA_HOME" in check.detail
