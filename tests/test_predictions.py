"""kvpipe plan --hardware: accelerators as data, floors worked by hand, calibrated predictions from
runs, the JSON document, and compare's predicted columns. Synthetic shapes and run records: no jobs."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from dataclasses import replace

import pandas as pd
import pytest

from kvpipe import cli
from kvpipe import model as models
from kvpipe.decide import compare
from kvpipe.decide import runs as recorded
from kvpipe.jobspec import compose, make_spec
from kvpipe.model import compute
from kvpipe.model.shape import Layer, ModelShape
from kvpipe.predict import bytes_plan as plan
from kvpipe.predict import calibration, hardware, local_runs, predicted_runs
from kvpipe.predict.floors import ModelCosts

from conftest import REPO, spec_for

REQUIRED = ("h100_sxm", "h100_pcie", "h200", "a100_40gb", "a100_80gb", "l4", "l40s", "a10g", "rtx4090", "mi300x")
# A toy model, small enough to work its floors by hand: 2 layers, 4 heads of 16 (2 KV heads), hidden
# 64, MLP 128, vocabulary 1,000 untied, 100,000 decoder weights; float32, batch 1.
SHAPE = ModelShape(num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, max_positions=4096)
DIMS = compute.Dimensions(hidden_size=64, intermediate_size=128, vocab_size=1000, num_heads=4, head_dim=16,
                          windows=(None, None), tied=False, matmul_parameters=100_000)  # fmt: skip
WEIGHTS = 4 * (100_000 + 2 * 64_000)  # decoder weights, input embeddings and head, 4 bytes each
TOY = hardware.Hardware("toy", "a toy accelerator", "cuda", 10**9, 1e9, {"float32": 1e12}, {})


def costs(shape=SHAPE, dims=DIMS, device="cuda") -> ModelCosts:
    return ModelCosts(shape, dims, WEIGHTS, "float32", 1, device)


@pytest.fixture(scope="module")
def specs():
    return {
        "dynamic": spec_for("model=tiny_random", "cache=dynamic"),
        "quantized": spec_for(
            "model=tiny_random",
            "cache=quantized",
            "backend=quanto",
            "backend.q_group_size=16",
            "backend.residual_length=4",
        ),  # fmt: skip
    }


# ---- hardware as data ---------------------------------------------------------------------------


def test_every_required_accelerator_loads_with_a_datasheet_source_for_each_figure():
    assert set(REQUIRED) <= set(hardware.names()) and hardware.names()[-1] == "local"
    for name in REQUIRED:
        entry = hardware.get(name)
        assert entry.name == name and entry.device == "cuda"
        assert entry.memory_bytes >= 24 * 10**9 and entry.memory_bandwidth_bytes_per_s >= 300e9
        assert {"bfloat16", "float16", "float32"} <= set(entry.peak_dense_flops_per_s)
        assert all("http" in entry.sources[key] for key in ("memory_gb", "memory_bandwidth_gb_per_s",
                                                              "peak_dense_tflops"))  # fmt: skip
    h100 = hardware.get("h100_sxm")
    assert (h100.memory_bandwidth_bytes_per_s, h100.peak_flops("bfloat16")) == (3.35e12, 989.4e12)  # dense, not 1,979


def test_a_gpu_is_found_by_the_name_torch_gives_it():
    assert hardware.for_device_name("NVIDIA H100 80GB HBM3").name == "h100_sxm"
    assert hardware.for_device_name("NVIDIA H200").name == "h200"
    assert hardware.for_device_name("NVIDIA H200 NVL") is None  # another card: not taken for the SXM one


def test_unknown_hardware_is_one_line_naming_the_choices_and_exit_2(capsys):
    assert cli.subcommand(["plan", "model=tiny_random", "--hardware", "h900"]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0
    assert "--hardware='h900'" in err and "h100_sxm" in err and "local" in err


@pytest.mark.parametrize(
    "args, named",
    [(["--calibrate-on", "512,2048"], "use it with --hardware local"),
     (["--hardware", "local", "--calibrate-on", "512,lots"], "comma-separated token counts")],
)  # fmt: skip
def test_calibrate_on_without_a_calibration_or_lengths_is_one_line_and_exit_2(capsys, args, named):
    assert cli.subcommand(["plan", "model=tiny_random", *args]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "--calibrate-on=" in err and named in err


# ---- floors, worked by hand ---------------------------------------------------------------------


def test_the_floors_of_a_small_config_are_the_ones_worked_by_hand(specs):
    cost = costs().at(specs["dynamic"].strategy, 100, 28)  # context 128: the cache holds 127 tokens
    token = 2 * 2 * 16 * 4  # keys and values of 2 KV heads of 16, float32: 256 bytes a layer
    assert cost.kv_cache_bytes == cost.kv_read_bytes_per_step == 2 * 127 * token == 65_024
    # every weight but the untied input embeddings (256,000 bytes), of which one row (256)
    assert cost.weights_read_bytes_per_step == WEIGHTS - 256_000 + 256 == 656_256
    assert cost.tpot_floor_ms(TOY) == pytest.approx((656_256 + 65_024) / 1e9 * 1e3)  # 0.72128 ms at 1 GB/s
    # 2 x 100,000 x 100 tokens + the head for the last token (2 x 64,000) + attention: 2 products x 2
    # FLOPs x 4 heads x 16 x 5,050 causal pairs x 2 layers
    assert cost.prefill_flops == 20_000_000 + 128_000 + 2 * 2 * 4 * 16 * 5050 * 2 == 22_713_600
    # prefill bytes: the weights with 100 embedding rows, and the prompt's keys and values written
    assert cost.prefill_bytes == WEIGHTS - 256_000 + 100 * 256 + 2 * 100 * token == 732_800
    assert cost.ttft_floor_ms(TOY, "float32") == pytest.approx(0.7328)  # memory-bound: 22.7 MFLOP is 0.023 ms
    slow = replace(TOY, peak_dense_flops_per_s={"float32": 1e9})
    assert cost.ttft_floor_ms(slow, "float32") == pytest.approx(22.7136)  # compute-bound
    assert cost.activation_bytes == 3 * 100 * 128 * 4  # act(gate), up and their product
    assert cost.memory_bytes == WEIGHTS + 65_024 + 153_600


def test_the_quantized_floor_counts_the_dequantized_copy(specs):
    dense = costs().at(specs["dynamic"].strategy, 100, 28)
    quantized = costs().at(specs["quantized"].strategy, 100, 28)
    # residual_length=4: 27 decode steps flush 6 times, so 124 tokens are quantized and 3 wait in the
    # residual; each step dequantizes all 127 to float32 (256 bytes a token a layer), writes them and reads them
    copy = 127 * 256
    assert quantized.dequantized_copy_bytes == copy  # one layer at a time
    assert quantized.kv_read_bytes_per_step == quantized.kv_cache_bytes + 2 * 2 * copy
    assert quantized.kv_cache_bytes < dense.kv_cache_bytes < quantized.kv_read_bytes_per_step
    assert dense.dequantized_copy_bytes == 0


def test_a_sliding_window_models_floor_reads_only_the_window(specs):
    sliding = replace(SHAPE, layers=(Layer("sliding_attention", 16),) * 2)
    toy = costs(sliding, replace(DIMS, windows=(16, 16)))
    short, long = (toy.at(specs["dynamic"].strategy, prompt, 10) for prompt in (1000, 2000))
    assert short.kv_read_bytes_per_step == long.kv_read_bytes_per_step == 2 * 16 * 256  # the window, each layer
    assert compute.attended_pairs(16, 1000) == 16 * 17 // 2 + 984 * 16  # each query sees at most 16 keys
    assert compute.attended_pairs(None, 1000) == 1000 * 1001 // 2


def test_offloading_on_cuda_has_no_tpot_floor_and_says_why():
    strategy = spec_for("model=tiny_random", "cache=offloaded").strategy
    cost = costs().at(strategy, 100, 28)
    assert cost.kv_read_bytes_per_step is None and cost.tpot_floor_ms(TOY) is None
    assert cost.ttft_floor_ms(TOY, "float32") > 0  # the prefill still computes what it computes
    assert "interconnect" in strategy.traffic_unknown_reason("cuda")


# ---- calibration --------------------------------------------------------------------------------


def synthetic_points(strategy, prompts, tpot=(2.0, 5e-6), ttft=(4e-7, 9e-7)) -> list[calibration.Sample]:
    """Runs whose TPOT is an exact line in its decode bytes, and whose TTFT is a decode step without
    KV plus each kind of FLOPs at its own rate (ms per weight FLOP, ms per attention FLOP)."""
    found = []
    for prompt in prompts:
        cost = costs().at(strategy, prompt, 28)
        base = tpot[0] + tpot[1] * cost.weights_read_bytes_per_step
        attention = cost.prefill_attention_flops
        found.append(calibration.Sample.of(f"run{prompt}", cost, tpot[0] + tpot[1] * cost.decode_bytes_per_step,
                                          base + ttft[0] * (cost.prefill_flops - attention) + ttft[1] * attention))  # fmt: skip
    return found


def test_calibration_on_exact_costs_recovers_them_and_predicts_a_third_context(specs):
    strategy = specs["dynamic"].strategy
    fitted = calibration.calibrate("dynamic", synthetic_points(strategy, [100, 400]))
    assert fitted.tpot.intercept_ms == pytest.approx(2.0) and fitted.tpot.slope_ms == pytest.approx(5e-6)
    third = costs().at(strategy, 1600, 28)
    assert fitted.ttft.base_ms == pytest.approx(2.0 + 5e-6 * third.weights_read_bytes_per_step)
    assert fitted.ttft.linear_ms == pytest.approx(4e-7) and fitted.ttft.attention_ms == pytest.approx(9e-7)
    assert fitted.tpot_ms(third) == pytest.approx(2.0 + 5e-6 * third.decode_bytes_per_step)
    (expected,) = [p.ttft_ms for p in synthetic_points(strategy, [1600])]
    assert fitted.ttft_ms(third) == pytest.approx(expected)
    assert fitted.extrapolated(1600) and not fitted.extrapolated(200)
    assert all(abs(r["tpot_residual_pct"]) < 1e-9 and abs(r["ttft_residual_pct"]) < 1e-6 for r in fitted.residuals())
    assert "attention FLOPs /" in fitted.formulas()[1]


def test_one_slow_run_among_repeats_does_not_tilt_the_fit(specs):
    strategy = specs["dynamic"].strategy
    clean = synthetic_points(strategy, [100, 100, 100, 400, 400, 400])
    slow = replace(clean[0], tpot_ms=clean[0].tpot_ms * 1.5, ttft_ms=clean[0].ttft_ms * 1.5)
    fitted = calibration.calibrate("dynamic", [slow, *clean[1:]])  # each length at the median of its three runs
    assert fitted.tpot.slope_ms == pytest.approx(5e-6) and fitted.ttft.attention_ms == pytest.approx(9e-7)
    assert fitted.residuals()[0]["ttft_residual_pct"] == pytest.approx(-100 / 3)  # the slow run is shown as it was


def test_a_negative_throughput_falls_back_to_one_rate_for_all_flops():
    # the longer prompt pays less per attention FLOP than the shorter one: noise, fitted with one rate
    fitted = calibration.fit_prefill(1.0, [10.0, 20.0], [1.0, 8.0], [12.0, 21.0])
    assert fitted.linear_ms == fitted.attention_ms > 0
    assert calibration.fit_prefill(1.0, [10.0, 20.0], [1.0, 2.0], [0.5, 0.6]).linear_ms == 0.0  # below base: none


def test_a_time_that_falls_as_the_work_grows_is_fitted_flat():
    flat = calibration.fit_line([1.0, 2.0], [5.0, 4.0])  # noise, not a law
    assert flat.slope_ms == 0.0 and flat.intercept_ms == pytest.approx((1 / 5 + 1 / 4) / (1 / 25 + 1 / 16))


def test_the_fit_weighs_each_run_by_its_relative_error_as_predictions_are_judged():
    # a short prefill, a medium one and a long one that runs a little slower per FLOP
    xs, ys = [1.0, 10.0, 100.0], [1.0, 10.0, 120.0]
    line = calibration.fit_line(xs, ys)
    relative = [abs(line.at(x) - y) / y for x, y in zip(xs, ys)]
    assert max(relative) < 0.25  # plain least squares: intercept -1.1, the short one 90% off


def test_a_length_measured_tightly_pulls_the_line_harder_than_one_a_slow_spell_widened():
    xs, ys = [1.0, 2.0, 3.0], [10.0, 20.0, 45.0]  # the third is off the line through the first two
    unweighted = calibration.fit_line(xs, ys)
    weighted = calibration.fit_line(xs, ys, [0.1, 0.1, 10.0])  # ±0.1 ms, ±0.1 ms and ±10 ms
    assert abs(weighted.at(3.0) - 30.0) < 0.5 < abs(unweighted.at(3.0) - 30.0)
    assert weighted.slope_ms == pytest.approx(10.0, rel=0.02)
    missing = calibration.fit_line(xs, ys, [0.1, None, 10.0])  # a run without an interval weighs as the typical one
    assert missing.slope_ms > 0
    assert calibration.point_weights([10.0, 20.0]) == pytest.approx([1 / 100, 1 / 400])  # none: relative residuals


def test_one_prompt_length_is_no_calibration(specs):
    assert calibration.calibrate("dynamic", synthetic_points(specs["dynamic"].strategy, [100, 100])) is None


def recorded_runs(*rows: dict) -> pd.DataFrame:
    """Runs as load_runs returns them: each row its cache params, prompt tokens and timings."""
    records = []
    for i, row in enumerate(rows):
        params = row["params"]
        records.append({
            "run_id": f"run{i:03d}", "start_time": pd.Timestamp(2026, 1, 1) + pd.Timedelta(seconds=i),
            **{f"params.{k}": v for k, v in params.items()}, "params.model.name": "tiny_random",
            "params.model.dtype": "float32", "tags.kvpipe.device": "cpu", "tags.kvpipe.host": "here",
            "tags.kvpipe.torch_threads": "2", "tags.kvpipe.overrides": row.get("overrides", ""),
            "tags.kvpipe.cache.effective": params["cache.strategy"], "metrics.peak_memory_bytes": 1e9,
            "metrics.prompt_tokens": float(row["prompt"]), "metrics.new_tokens": 28.0, "metrics.batch_size": 1.0,
            "metrics.tpot_ms": row["tpot_ms"], "metrics.ttft_ms": row["ttft_ms"],
        })  # fmt: skip
    return recorded.with_derived(pd.DataFrame(records))


def test_a_calibration_reads_only_the_runs_of_the_rows_own_cache_settings(specs):
    quantized = specs["quantized"].params()
    runs = recorded_runs(
        {"params": specs["dynamic"].params(), "prompt": 100, "tpot_ms": 5.0, "ttft_ms": 9.0},
        {"params": quantized, "prompt": 100, "tpot_ms": 7.0, "ttft_ms": 12.0},
        {"params": {**quantized, "backend.residual_length": "128"}, "prompt": 400, "tpot_ms": 8.0, "ttft_ms": 30.0},
    )
    assert list(local_runs.matching(runs, specs["dynamic"])["run_id"]) == ["run000"]
    assert list(local_runs.matching(runs, specs["quantized"])["run_id"]) == ["run001"]  # not residual 128's


def test_calibrate_on_holds_the_other_prompt_lengths_out_of_the_fit(specs, monkeypatch):
    from kvpipe.record import read_back as record_runs

    runs = recorded_runs(*({"params": specs["dynamic"].params(), "prompt": n, "tpot_ms": 5.0, "ttft_ms": 9.0}
                           for n in (100, 400, 1600)))  # fmt: skip
    monkeypatch.setattr(record_runs, "read_runs", lambda *a, **k: (runs, None))
    monkeypatch.setattr(local_runs.socket, "gethostname", lambda: "here")
    spec = specs["dynamic"]
    every = local_runs.read_local_runs(spec, "float32", "cpu", 2)
    held_out = local_runs.read_local_runs(spec, "float32", "cpu", 2, [100, 400])
    assert sorted(every.runs["metrics.prompt_tokens"]) == [100, 400, 1600]
    assert sorted(held_out.runs["metrics.prompt_tokens"]) == [100, 400]
    assert "at 100, 400 prompt tokens" in held_out.said


def test_too_few_runs_show_the_floor_and_the_command_that_would_calibrate(specs, monkeypatch, capsys):
    from kvpipe.job import threads as job_threads

    runs = recorded_runs({"params": specs["dynamic"].params(), "prompt": 100, "tpot_ms": 5.0, "ttft_ms": 9.0},
                         {"params": specs["dynamic"].params(), "prompt": 400, "tpot_ms": 6.0, "ttft_ms": 20.0},
                         {"params": specs["quantized"].params(), "prompt": 100, "tpot_ms": 7.0, "ttft_ms": 12.0})  # fmt: skip
    local = replace(TOY, name="local", device="cpu", measured=True)
    monkeypatch.setattr(hardware, "local", lambda device, dtype: local)
    monkeypatch.setattr(models, "resolve_device", lambda device: "cpu")
    monkeypatch.setattr(job_threads, "use_threads", lambda model_cfg, device: 2)
    monkeypatch.setattr(local_runs, "read_local_runs", lambda *a: local_runs.LocalRuns(runs, "3 runs"))
    overrides = ["model=tiny_random", "backend.q_group_size=16", "backend.residual_length=4",
                 "workload.max_new_tokens=28"]  # fmt: skip
    document = plan.make_plan(make_spec(compose(overrides), overrides), None, [128, 528], "cpu", "local").as_dict()
    fitted = {row["strategy"]: row for row in document["calibration"]["strategies"]}
    assert set(fitted) == {"dynamic"}  # measured at two prompt lengths; quantized at one
    assert fitted["dynamic"]["prompt_lengths"] == [100, 400]
    dynamic = next(row for row in document["rows"] if row["strategy"] == "dynamic")
    assert [c["basis"] for c in dynamic["contexts"]] == ["calibrated", "calibrated"]
    assert dynamic["contexts"][0]["tpot_ms"] == pytest.approx(5.0)  # the run at prompt 100 (+ 28 new) itself
    waiting = {row["strategy"]: row for row in document["calibration"]["uncalibrated"]}
    quantized = waiting["quanto int4 kivi"]
    assert quantized["measured_prompt_tokens"] == [100]
    assert quantized["command"].startswith("kvpipe -m model=tiny_random")
    assert "cache=quantized backend=quanto backend.nbits=4 axis=kivi" in quantized["command"]
    assert "workload=long_context workload.prompt_tokens=100,400" in quantized["command"]
    row = next(row for row in document["rows"] if row["strategy"] == "quanto int4 kivi")
    assert [c["basis"] for c in row["contexts"]] == ["floor", "floor"]


# ---- the JSON document and compare --------------------------------------------------------------


def test_json_holds_each_rows_contexts_with_their_floors_and_nothing_else_is_printed(capsys):
    assert cli.subcommand(["plan", "model=tiny_random", "--hardware", "h100_sxm", "--context", "64,256", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)  # the whole of stdout
    assert document["hardware"]["name"] == "h100_sxm" and document["calibration"] is None
    assert document["device"] == "cuda" and document["dtype"] == "float32"  # tiny_random's own dtype
    labels = [row["strategy"] for row in document["rows"]]
    assert labels[0] == "dynamic" and "quanto int4 kivi" in labels
    for row in document["rows"]:
        assert [c["context"] for c in row["contexts"]] == [64, 256]
        for context in row["contexts"]:
            assert {"context", "kv_cache_bytes", "tpot_ms", "ttft_ms", "fits"} <= set(context)
            assert context["fits"] is True and context["ttft_ms"] > 0
    dynamic = document["rows"][0]["contexts"][0]
    assert dynamic["basis"] == "floor" and dynamic["tpot_ms"] == pytest.approx(
        dynamic["decode_bytes_per_step"] / 3.35e12 * 1e3
    )


def test_compare_predicted_shows_what_a_calibration_on_the_runs_predicts(specs, monkeypatch):
    monkeypatch.setattr(predicted_runs, "job_spec", lambda overrides: specs["dynamic"])
    runs = recorded_runs(*({"params": specs["dynamic"].params(), "prompt": p, "tpot_ms": t, "ttft_ms": f}
                           for p, t, f in ((100, 5.0, 9.0), (400, 6.0, 20.0), (1600, 9.0, 80.0))))  # fmt: skip
    table = compare.display_table(predicted_runs.with_predictions(runs))
    assert list(table.columns[-3:]) == ["TPOT predicted ms", "TTFT ms", "TTFT predicted ms"]
    predicted = [float(v) for v in table["TPOT predicted ms"]]
    assert predicted != [5.0, 6.0, 9.0] and sum(predicted) == pytest.approx(20.0, abs=0.2)  # least squares
    assert "TPOT predicted ms" not in compare.display_table(runs).columns  # only when asked


def test_gpu_check_holds_each_tpot_against_the_floor_of_the_gpu_it_ran_on():
    # benchmarks/ is not a package: the script is imported from its path (registered, for its dataclasses)
    if "gpu_check" not in sys.modules:
        spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu_check.py")
        sys.modules["gpu_check"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["gpu_check"])
    gpu_check = sys.modules["gpu_check"]
    jobs = {"speed_dynamic": {"tpot_ms": 2.0, "decode_bytes_per_step": 4.8e9, "memory_bandwidth_bytes_per_s": 4e12},
            "offloaded": {"tpot_ms": 9.0}}  # fmt: skip
    floors = gpu_check.tpot_floors(jobs, "NVIDIA H200")
    (row,) = floors["jobs"]  # offloading has no counted traffic: no floor
    assert floors["hardware"] == "h200" and row["tpot_floor_ms"] == pytest.approx(1.0)  # 4.8 GB at 4.8 TB/s
    assert row["mbu"] == pytest.approx(0.5)
    unknown = gpu_check.tpot_floors(jobs, "NVIDIA B200")  # not in the table: the job's own measured bandwidth
    assert unknown["hardware"] is None and unknown["jobs"][0]["tpot_floor_ms"] == pytest.approx(1.2)


@pytest.mark.slow  # a kvpipe process that measures this machine's bandwidth and matmul throughput (~5 s)
def test_plan_on_local_hardware_measures_this_machine_from_the_command_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "kvpipe", "plan", "model=tiny_random", "--hardware", "local", "--context", "64", "--json"],
        cwd=tmp_path, text=True, capture_output=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    local = document["hardware"]
    assert local["measured"] and local["memory_bandwidth_bytes_per_s"] > 1e8 and local["peak_dense_flops_per_s"]
    assert "no MLflow store there" in document["calibration"]["runs"]  # a fresh folder: nothing to calibrate on
    assert document["calibration"]["uncalibrated"][0]["command"].startswith("kvpipe -m")
    assert document["rows"][0]["contexts"][0]["basis"] == "floor"


@pytest.mark.slow  # an MLflow store (a migrated one, copied)
def test_a_calibration_reads_every_repeat_of_a_measurement_where_compare_shows_the_latest(tmp_path, existing_store):
    # compare shows a job run twice once; a calibration takes both, as two samples of its length
    from mlflow.tracking import MlflowClient

    from kvpipe.decide.runs import load_runs
    from kvpipe.record.read_back import read_runs

    uri = f"sqlite:///{existing_store(tmp_path)}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("repeats")
    for tpot in (5.0, 6.0):
        run = client.create_run(experiment, tags={"kvpipe.measurement_key": "same-job", "kvpipe.status": "FINISHED"})
        client.log_metric(run.info.run_id, "tpot_ms", tpot)
        client.set_terminated(run.info.run_id)
    latest, _ = load_runs("repeats", None, uri, whole_experiment=True)
    every, _ = read_runs("repeats", None, uri, whole_experiment=True, every_repeat=True)
    assert list(latest["metrics.tpot_ms"]) == [6.0]
    assert sorted(every["metrics.tpot_ms"]) == [5.0, 6.0]
