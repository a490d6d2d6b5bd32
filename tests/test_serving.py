"""Many requests at once: loads (how requests arrive), the serving job's two servers, and what a
serving run records, with the definitions of vLLM's bench serve, GuideLLM and AIPerf."""

from __future__ import annotations

import json
import statistics
from types import SimpleNamespace

import pytest

from kvpipe import load as loads
from kvpipe.errors import ConfigError, KvpipeError
from kvpipe.measure.request_figures import Served, pass_figures, percentile, serving_metrics

from conftest import REPO, TINY, run_cli, spec_for

SERVE = (*TINY, "workload.max_new_tokens=6", "workload.repeats=1")


def load_of(*overrides: str):
    return spec_for(*SERVE, *overrides).bound_load


def untimed(count: int) -> list:
    """`count` requests as a load receives them, carrying no arrival times of their own."""
    return [SimpleNamespace(arrival_s=None)] * count


def gaps(arrivals: list[float]) -> list[float]:
    return [b - a for a, b in zip(arrivals, arrivals[1:])]


def test_rate_arrivals_are_poisson_from_the_seed_and_start_at_zero():
    arrivals = load_of("load=rate", "load.rate=4", "load.seed=3").arrivals(untimed(4000))
    assert arrivals[0] == 0.0 and all(gap > 0 for gap in gaps(arrivals))
    assert statistics.fmean(gaps(arrivals)) == pytest.approx(0.25, rel=0.05)  # mean 1/rate
    assert statistics.stdev(gaps(arrivals)) == pytest.approx(0.25, rel=0.1)  # exponential: stdev = mean
    assert load_of("load=rate", "load.rate=4", "load.seed=3").arrivals(untimed(10)) == arrivals[:10]
    assert load_of("load=rate", "load.rate=4", "load.seed=4").arrivals(untimed(10)) != arrivals[:10]
    assert (
        load_of("load=rate", "load.rate=4", "load.seed=3", "load.burstiness=1").arrivals(untimed(10)) == arrivals[:10]
    )


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_burstiness_draws_gamma_gaps_with_the_rates_mean(burstiness):
    arrivals = load_of("load=rate", "load.rate=4", f"load.burstiness={burstiness}").arrivals(untimed(8000))
    assert statistics.fmean(gaps(arrivals)) == pytest.approx(0.25, rel=0.08)  # the rate's mean, whatever the shape
    cv = statistics.stdev(gaps(arrivals)) / statistics.fmean(gaps(arrivals))
    assert cv == pytest.approx(burstiness**-0.5, rel=0.1)  # a gamma of shape k: cv 1/sqrt(k)
    assert load_of("load=rate", f"load.burstiness={burstiness}").label() == f"rate(1/s, burstiness {burstiness:g})"


def test_burstiness_unset_leaves_a_rate_runs_key_and_params_as_they_were():
    poisson = spec_for(*SERVE, "load=rate")
    assert "load.burstiness" not in poisson.params()
    assert spec_for(*SERVE, "load=rate", "load.burstiness=1").measurement_key() == poisson.measurement_key()
    bursty = spec_for(*SERVE, "load=rate", "load.burstiness=0.5")
    assert bursty.params()["load.burstiness"] == "0.5" and bursty.measurement_key() != poisson.measurement_key()


def test_a_duration_sets_how_many_requests_arrive_within_it():
    load = load_of("load=rate", "load.rate=10", "load.duration_s=3")
    requests = load.requests(untimed(4))
    assert 15 < len(requests) < 50 and max(load.arrivals(requests)) < 3.0


def test_each_load_says_how_many_are_in_flight_and_whether_its_loop_is_closed():
    seven = untimed(7)
    assert (load_of("load=offline").in_flight(seven), load_of("load=offline").closed) == (7, False)
    concurrency = load_of("load=concurrency", "load.concurrency=3")
    assert (concurrency.in_flight(seven), concurrency.closed) == (3, True)
    assert load_of("load=concurrency", "load.concurrency=16").in_flight(seven) == 7
    assert len(load_of("load=offline", "load.requests=9").requests(untimed(4))) == 9


@pytest.mark.parametrize(
    "overrides, says",
    [
        (("load=concurrency", "load.concurrency=0"), "load.concurrency=0 is not valid: expected 1 or more"),
        (("load=rate", "load.rate=0"), "load.rate=0.0 is not valid: expected requests per second above 0"),
        (("load=rate", "load.rate=-2"), "load.rate=-2.0 is not valid"),
        (
            ("load=rate", "load.burstiness=0"),
            r"load.burstiness=0.0 is not valid: expected a number above 0 \(1: Poisson",
        ),
        (("load=rate", "load.burstiness=-1"), "load.burstiness=-1.0 is not valid"),
        (("load=offline", "load.requests=0"), "load.requests=0 is not valid"),
        (("load=offline", "load.max_tpot_ms=0"), "load.max_tpot_ms=0.0 is not valid"),
        (("load=rate", "load.duration_s=5", "load.requests=3"), "give load.requests or load.duration_s, not both"),
        (("load=concurrency", "workload.batch_size=4"), "workload.batch_size=4 is not valid: under load=concurrency"),
    ],
)
def test_bad_load_settings_are_one_line_naming_the_field(overrides, says):
    with pytest.raises(ConfigError, match=says) as refused:
        spec_for(*SERVE, *overrides)
    assert "\n" not in str(refused.value)


def test_an_unknown_load_names_the_known_ones():
    from kvpipe.jobspec import spec_from

    known = ", ".join(sorted(loads.names()))  # as Hydra lists a group's options
    with pytest.raises(KvpipeError, match=f"load=nope is not a known option; expected one of: {known}"):
        spec_from([*SERVE, "load=nope"])


def test_a_load_is_keyed_and_logged_with_what_its_kind_reads_and_no_load_leaves_the_key_alone():
    plain, served = spec_for(*SERVE), spec_for(*SERVE, "load=concurrency", "load.concurrency=2")
    assert "load" not in plain.as_dict() and not any(name.startswith("load.") for name in plain.params())
    assert served.measurement_key() != plain.measurement_key()
    assert {k: v for k, v in served.params().items() if k.startswith("load.")} == {
        "load.kind": "concurrency", "load.concurrency": "2"
    }  # fmt: skip
    other_rate = spec_for(*SERVE, "load=concurrency", "load.concurrency=2", "load.rate=9")  # a rate it ignores
    assert other_rate.measurement_key() == served.measurement_key()


@pytest.mark.parametrize("kind", loads.registered(), ids=lambda kind: kind.name)
def test_each_load_serves_a_quick_job_of_the_requests_it_picks_when_it_says(kind, monkeypatch):
    """Every registered load, with its own test_overrides: the requests it picks are served, none
    before it says it arrives, and at most as many at once as it lets in."""
    from kvpipe.job.runner import job_for
    from kvpipe.schedule import run_rounds

    monkeypatch.chdir(REPO)  # a load's overrides may name the repository's example files
    job = job_for(spec_for(*SERVE, f"load={kind.name}", *kind.test_overrides))
    job.prepare()
    run_rounds([job], seed=0, shuffle=False)
    picked = job.load.requests(job.prompts)
    assert [r.ids for r in job.requests] == [r.ids for r in picked] and job.arrivals == job.load.arrivals(picked)
    (served,) = [outcome.served for outcome in job.passes]
    start = min(s.arrival_s for s in served)
    if not kind.closed:  # a closed loop's request arrives when one in flight is answered, whenever that is
        assert [s.arrival_s - start for s in served] == pytest.approx(job.arrivals)
    assert all(s.started_s >= s.arrival_s - 1e-6 for s in served)
    result = job.result({})
    assert result.metrics["served_requests"] == len(picked) and result.tags["load"] == job.load.label()
    assert result.metrics["max_in_flight"] <= job.load.in_flight(picked)
    assert result.metrics["serve_span_ms"] >= job.arrivals[-1] * 1e3  # it lasts at least until its last arrival


def served(arrival, tokens_at, finished=None, started=None):
    return Served(arrival, arrival if started is None else started, list(tokens_at), finished or tokens_at[-1], 10,
                  list(range(len(tokens_at))))  # fmt: skip


def test_serving_figures_follow_the_field_definitions():
    runs = [served(0.0, [0.1, 0.2, 0.3]), served(0.5, [0.9, 1.0], started=0.7), served(1.0, [1.2, 1.6, 2.0])]
    figures = serving_metrics([runs], max_in_flight=2, max_ttft_ms=250, max_tpot_ms=150)
    assert figures["ttft_ms"] == pytest.approx((100 + 400 + 200) / 3)  # from each request's arrival
    assert figures["tpot_ms"] == pytest.approx((100 + 100 + 400) / 3)  # its own tokens after the first
    assert figures["itl_p90_ms"] == pytest.approx(400)  # gaps pooled: 100, 100, 100, 400, 400
    assert figures["queue_ms"] == pytest.approx(200 / 3)
    assert figures["output_tokens_per_s"] == pytest.approx(8 / 2.0)  # first arrival to last token
    assert figures["requests_per_s"] == pytest.approx(3 / 2.0)
    assert figures["goodput_requests_per_s"] == pytest.approx(1 / 2.0)  # only the first meets both targets
    assert figures["within_targets"] == pytest.approx(1 / 3)
    assert "goodput_requests_per_s" not in serving_metrics([runs], 2, None, None)


def test_passes_pool_their_requests_and_count_requests_tokens_and_span_per_pass():
    first = [served(0.0, [0.1, 0.2, 0.3]), served(0.5, [0.9, 1.0])]  # first arrival to last token: 1 s
    second = [served(10.0, [10.2, 10.4, 10.6]), served(10.0, [10.5, 12.0])]  # 2 s
    figures = serving_metrics([first, second], max_in_flight=2, max_ttft_ms=None, max_tpot_ms=None)
    assert figures["served_requests"] == 2 and figures["new_tokens"] == 5  # per pass, as one pass gives them
    assert figures["serve_span_ms"] == pytest.approx(1500)  # the mean pass
    assert figures["output_tokens_per_s"] == pytest.approx(10 / 3.0)  # both passes' tokens over both spans
    assert figures["ttft_ms"] == pytest.approx((100 + 400 + 200 + 500) / 4)  # over every request of both
    assert pass_figures(second) == pytest.approx({"ttft_ms": 350.0, "tpot_ms": 850.0, "output_tokens_per_s": 2.5})


def test_percentiles_are_nearest_rank():
    values = list(range(1, 101))
    assert (percentile(values, 0.5), percentile(values, 0.9), percentile(values, 0.99)) == (50, 90, 99)
    assert percentile([7.0], 0.99) == 7.0 and percentile([], 0.5) != percentile([], 0.5)  # NaN


def test_static_batches_serve_every_request_at_most_the_limit_at_once():
    from kvpipe.job.runner import run_job

    job = run_job(spec_for(*SERVE, "load=concurrency", "load.concurrency=2", "load.requests=5", "workload.warmup=0"))
    assert job.metrics["served_requests"] == 5 and job.metrics["max_in_flight"] == 2
    assert job.metrics["new_tokens"] == 5 * 6
    assert job.tags["load"] == "concurrency(2)" and job.tags["cache.effective"] == "dynamic"
    assert job.metrics["ttft_p90_ms"] >= job.metrics["ttft_p50_ms"] > 0


def test_a_serving_run_records_its_load_and_figures(tmp_path):
    done = run_cli([*SERVE, "load=offline", "load.requests=3", "load.max_tpot_ms=1000"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    (path,) = tmp_path.glob("outputs/runs/*/*/result.json")
    result = json.loads(path.read_text())
    assert result["config"]["load"]["kind"] == "offline" and result["params"]["load.kind"] == "offline"
    assert result["metrics"]["served_requests"] == 3 and result["metrics"]["within_targets"] == 1.0
    assert "load=offline" in done.stdout


@pytest.mark.slow  # real served jobs, then compare's plots: ~2 s
def test_compare_draws_the_serving_curve_when_runs_served_a_load(tmp_path):
    from kvpipe.decide.compare import write_outputs

    from test_compare import fake_runs

    rows = []
    for cache in ("dynamic", "quantized:quanto:int4:kivi"):
        for concurrency in (1, 4, 16):
            rows.append({"cache": cache, "params": {"load.kind": "concurrency", "load.concurrency": concurrency}})
    runs = fake_runs(*rows)
    runs["metrics.output_tokens_per_s"] = [20.0 * c * s for s in (1.0, 0.8) for c in (1, 3, 8)]
    runs["metrics.tpot_p90_ms"] = [40.0 * c for _ in range(2) for c in (1, 1.5, 3)]
    runs["tags.kvpipe.load"] = [f"concurrency({c})" for _ in range(2) for c in (1, 4, 16)]
    written = write_outputs(runs, tmp_path, "serving")
    assert tmp_path / "serving_curve.png" in written and (tmp_path / "serving_curve.png").stat().st_size > 10_000
    assert "load.concurrency" in (tmp_path / "compare.md").read_text()  # what varies is a column
    without = write_outputs(fake_runs({"cache": "dynamic"}, {"cache": "static"}), tmp_path / "batch", "batch")
    assert not any(path.name == "serving_curve.png" for path in without)


def serving_fake_runs():
    from test_compare import fake_runs

    rows = [{"cache": cache, "peak_mib": mib, "params": {"load.kind": "concurrency", "load.concurrency": c}}
            for cache, mib in (("dynamic", 1000), ("quantized:quanto:int4:kivi", 700)) for c in (1, 4, 16)]  # fmt: skip
    runs = fake_runs(*rows)
    runs["metrics.output_tokens_per_s"] = [20.0, 60.0, 160.0, 16.0, 48.0, 150.0]
    runs["metrics.tpot_ms"] = [40.0, 60.0, 120.0, 40.0, 58.0, 110.0]
    runs["metrics.requests_per_s"] = runs["metrics.output_tokens_per_s"] / 20
    runs["tags.kvpipe.load"] = [f"concurrency({c})" for _ in range(2) for c in (1, 4, 16)]
    runs["quality_loss"] = [0.0, 0.0, 0.0, 0.01, 0.01, 0.01]
    return runs


def test_the_service_answer_is_the_most_throughput_within_the_limits():
    from kvpipe.decide.limits import Limits
    from kvpipe.decide.service import choose_for_service

    runs = serving_fake_runs()
    chosen, (what, why) = choose_for_service(runs, Limits(tpot_ms=100.0), "throughput")
    assert (chosen["label"], chosen["tags.kvpipe.load"]) == ("dynamic", "concurrency(4)")  # 16 misses TPOT
    assert what.startswith("dynamic at concurrency(4): 60.0 tok/s") and "of the 4 serving runs within limits" in why
    chosen, _ = choose_for_service(runs, Limits(memory_bytes=800 * 2**20, tpot_ms=115.0), "throughput")
    assert (chosen["label"], chosen["tags.kvpipe.load"]) == ("quantized:quanto:int4:kivi", "concurrency(16)")
    none, (what, why) = choose_for_service(runs, Limits(tpot_ms=10.0), "throughput")
    assert none is None and what == "no serving run meets the limits" and "misses TPOT by 300%" in why
    none, (what, why) = choose_for_service(runs, Limits(), "goodput")  # no run had latency targets
    assert none is None and what == "no serving run measured goodput" and "load.max_tpot_ms" in why


def test_runs_of_one_batch_at_a_time_are_no_service_answer():
    from kvpipe.decide.limits import Limits
    from kvpipe.decide.service import choose_for_service

    from test_compare import fake_runs

    chosen, (what, why) = choose_for_service(fake_runs({"cache": "dynamic"}), Limits(), "goodput")
    assert chosen is None and what == "no run served a load" and "load=concurrency" in why


def test_paged_serving_answers_each_request_as_the_dynamic_cache_does():
    from kvpipe.job.runner import run_job

    common = (*SERVE, "load.requests=6", "workload.warmup=0", "workload.ignore_eos=false")
    paged = run_job(spec_for(*common, "cache=paged", "load=concurrency", "load.concurrency=4"))
    dynamic = run_job(spec_for(*common, "cache=dynamic", "load=concurrency", "load.concurrency=1"))
    assert [t["completion"] for t in paged.texts] == [t["completion"] for t in dynamic.texts]
    assert paged.metrics["max_in_flight"] == 4 and paged.metrics["served_requests"] == 6
    assert 0 < paged.metrics["kv_held_bytes"] <= paged.metrics["kv_cache_bytes"]  # held within the pool
    assert paged.tags["cache.effective"] == "paged" and "kv_held_bytes" not in dynamic.metrics


def test_a_continuous_server_says_why_it_has_no_quality_pass():
    from kvpipe.job.runner import run_job

    on = [o for o in SERVE if o != "quality=off"]
    job = run_job(spec_for(*on, "cache=paged", "load=offline", "load.requests=2"))
    assert "kl_vs_reference" not in job.metrics and "quality_reference" not in job.tags
    assert any("builds its cache inside its server" in note and "no quality pass" in note for note in job.notes)


def test_a_served_job_and_a_batch_job_take_turns_in_shared_rounds():
    from kvpipe.job.runner import measured_together

    common = (*TINY, "workload.prompts=[Hi.]", "workload.repeats=2")
    labelled = [("batch", spec_for(*common)), ("served", spec_for(*common, "load=offline", "load.requests=2"))]
    batch, served = measured_together(labelled, seed=1)
    assert (batch.label, served.label) == ("batch", "served") and batch.rounds_done() == served.rounds_done() == 2
    served_result, batch_result = served.result({}), batch.result({})
    assert served_result.metrics["rounds"] == batch_result.metrics["rounds"] == 2
    assert "round_output_tokens_per_s" in served_result.tags and "round_decode_tokens_per_s" in batch_result.tags


def test_paged_without_a_load_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="cache=paged serves many requests at once by continuous batching"):
        spec_for(*SERVE, "cache=paged")


def traffic(tmp_path, times):
    path = tmp_path / "traffic.jsonl"
    rows = [{"prompt": f"Question {i}: what is {i} plus {i}?", "max_new_tokens": 4, "timestamp": t}
            for i, t in enumerate(times)]  # fmt: skip
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return ("workload=dataset", f"workload.path={path}")


def test_a_replay_load_serves_a_datasets_requests_when_its_rows_say(tmp_path):
    from kvpipe.job.runner import run_job

    job = run_job(spec_for(*SERVE, *traffic(tmp_path, [100.0, 100.2, 100.2, 100.5]), "load=replay"))
    assert job.metrics["served_requests"] == 4 and job.tags["load"] == "replay"
    assert job.metrics["serve_span_ms"] >= 500  # the last request arrives 0.5 s after the first


def test_a_rate_load_draws_its_own_arrivals_whatever_the_dataset_carries(tmp_path):
    from kvpipe.job.runner import job_for

    job = job_for(spec_for(*SERVE, *traffic(tmp_path, [100.0, 100.2, 100.2, 100.5]), "load=rate", "load.rate=3"))
    job.prepare()
    assert [r.arrival_s for r in job.requests] == pytest.approx([0.0, 0.2, 0.2, 0.5])  # carried, not used
    assert job.arrivals == job.load.arrivals(untimed(4)) != pytest.approx([0.0, 0.2, 0.2, 0.5])


def test_replay_on_prompts_without_arrival_times_is_one_line_before_the_model_loads(monkeypatch):
    from kvpipe import model
    from kvpipe.job.runner import run_job

    monkeypatch.setattr(model, "load", lambda *args: pytest.fail("the model loaded"))
    with pytest.raises(ConfigError) as refused:
        run_job(spec_for(*SERVE, "load=replay"))
    assert str(refused.value).startswith(
        "load.kind='replay' is not valid: the workload's prompts carry no arrival times"
    )
    assert "workload=dataset with a timestamp or arrival_s column" in str(refused.value)


def test_a_served_job_measures_its_rounds_and_judges_noise_from_them():
    from kvpipe.job.runner import run_job

    job = run_job(spec_for(*TINY, "load=concurrency", "load.concurrency=2", "load.requests=3", "workload.repeats=3"))
    assert job.metrics["rounds"] == 3 and job.tags["interval_over"] == "rounds"
    assert job.metrics["served_requests"] == 3 and job.metrics["new_tokens"] == 3 * 6  # per pass, as before
    assert job.metrics["prompt_tokens"] == job.metrics["prompt_tokens_mean"]  # the length compare matches runs at
    for figure in ("ttft_ms", "tpot_ms", "output_tokens_per_s"):
        series = json.loads(job.tags[f"round_{figure}"])
        assert len(series) == 3 and job.metrics[f"{figure}_ci_low"] <= statistics.fmean(series) * 1.001
    assert job.metrics["timing_noise_cv"] == job.metrics["timing_noise_cv"]  # not NaN: rounds to compare
    assert job.tags["noisy"] in ("true", "false")
    single = run_job(spec_for(*SERVE, "load=offline", "load.requests=2"))
    assert single.metrics["rounds"] == 1 and single.tags["noisy"] in ("unknown", "true")  # true only if contended


@pytest.mark.slow  # a real served job with its quality pass: ~2 s
def test_a_lossless_served_cache_gets_the_quality_pass_a_batch_job_gets():
    from kvpipe.job.runner import run_job

    on = [o for o in SERVE if o != "quality=off"]
    job = run_job(spec_for(*on, "load=offline", "load.requests=2", "quality.windows=1"))
    assert job.metrics["kl_vs_reference"] == 0.0 and job.tags["quality_reference"].startswith("DynamicCache")
    assert job.params["quality.scored_tokens"] == str(int(job.metrics["quality_scored_tokens"]))


def test_arrival_times_that_go_backwards_are_one_line_before_anything_loads(tmp_path):
    with pytest.raises(
        ConfigError, match=r"row 3 has timestamp=3, before row 2's 5; expected arrival times that never"
    ):
        spec_for(*SERVE, *traffic(tmp_path, [1.0, 5.0, 3.0]), "load=rate")


@pytest.mark.slow  # six tiny serving jobs through advise's sweep, recorded in MLflow
def test_advise_for_a_service_answers_with_a_cache_and_a_concurrency(tmp_path, existing_store):
    existing_store(tmp_path)
    job = [o for o in SERVE if o != "tracking=off"]
    said = run_cli(["advise", *job, "--objective", "throughput", "--max-tpot-ms", "50",
                    "--memory-budget", "4GiB", "--concurrency", "1,4"], cwd=tmp_path)  # fmt: skip
    assert said.returncode == 0, said.stderr[-2000:]
    assert "6 jobs (dynamic, paged, quantized at concurrency 1, 4)" in said.stdout
    answer = next(line for line in said.stdout.splitlines() if line.startswith("recommend: "))
    assert " at concurrency(" in answer and "tok/s" in answer
    assert "load.concurrency=" in said.stdout.split("use: ")[1]


def test_advise_for_a_service_refuses_a_bad_concurrency_and_too_few_trials(tmp_path):
    job = [o for o in SERVE if o != "tracking=off"]
    said = run_cli(["advise", *job, "--objective", "throughput", "--concurrency", "0,4"], cwd=tmp_path)
    assert said.returncode == 2 and "--concurrency='0,4' is not valid" in said.stderr
    said = run_cli(["advise", *job, "--objective", "goodput", "--trials", "2"], cwd=tmp_path)
    assert said.returncode == 2 and "3 caches x 3 concurrencies is 9 jobs; expected --trials 9 or more" in said.stderr


def test_goodput_of_right_answers_counts_a_request_only_if_it_met_the_targets_and_answered_right():
    runs = [served(0.0, [0.1, 0.2, 0.3]), served(0.5, [0.55, 0.6]), served(1.0, [1.2, 1.6, 2.0])]
    # met the targets: the first two (the third's TPOT is 400 ms); right: the first and the third
    figures = serving_metrics([runs], 2, max_ttft_ms=250, max_tpot_ms=150, verdicts=[[True, False, True]])
    assert figures["goodput_requests_per_s"] == pytest.approx(2 / 2.0)
    assert figures["goodput_correct_requests_per_s"] == pytest.approx(1 / 2.0)  # only the first is both
    assert figures["correct_within_targets"] == pytest.approx(1 / 3)
    # no verdicts (a workload that judges no answers), or no targets: no such figure
    assert "goodput_correct_requests_per_s" not in serving_metrics([runs], 2, 250, 150)
    assert "goodput_correct_requests_per_s" not in serving_metrics([runs], 2, None, None, [[True] * 3])


def test_each_request_is_kept_as_served_and_its_rows_give_back_the_runs_percentiles():
    from kvpipe.measure.request_figures import request_rows

    first = [served(10.0, [10.1, 10.2, 10.3]), served(10.5, [10.9, 11.0], started=10.7)]
    second = [served(20.0, [20.2, 20.4, 20.6]), served(20.0, [20.5, 22.0])]
    figures = serving_metrics([first, second], 2, max_ttft_ms=250, max_tpot_ms=None)
    rows = request_rows([first, second], [[True, False], [False, True]], 250, None)
    assert [(r["pass"], r["request"]) for r in rows] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    late = rows[1]  # from its pass's first arrival: arrived at 0.5 s, taken at 0.7 s, first token at 0.9 s
    assert (late["arrival_ms"], late["admitted_ms"], late["first_token_ms"], late["end_ms"]) == (500, 700, 900, 1000)
    assert late["ttft_ms"] == 400 and late["queue_ms"] == 200 and late["itl_ms"] == [100]
    assert late["within_targets"] is False and late["correct"] is False and late["output_tokens"] == 2
    assert rows[0]["within_targets"] is True and rows[2]["correct"] is False
    for name in ("ttft", "tpot", "e2e", "queue"):
        for share in (50, 90, 99):
            kept = [r[f"{name}_ms"] for r in rows if r[f"{name}_ms"] is not None]
            assert percentile(kept, share / 100) == pytest.approx(figures[f"{name}_p{share}_ms"], abs=1e-3)
    gaps = [gap for r in rows for gap in r["itl_ms"]]
    assert percentile(gaps, 0.9) == pytest.approx(figures["itl_p90_ms"], abs=1e-3)
    assert all(r["correct"] is None for r in request_rows([first], None, None, None))


def test_a_served_runs_requests_make_a_chrome_trace_and_a_timeline(tmp_path):
    from kvpipe.measure.request_figures import request_rows
    from kvpipe.record import requests

    one_pass = [served(0.0, [0.1, 0.2, 0.3]), served(0.5, [0.9, 1.0], started=0.7)]
    rows = request_rows([one_pass, one_pass], [[True, False], [True, True]], 250, 150)
    trace_path, timeline = requests.write_files(rows, tmp_path, "dynamic · tiny_random")
    trace = json.loads(trace_path.read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == 3 * len(rows)  # wait, prefill and decode of each request
    late = {e["name"]: e for e in spans if (e["pid"], e["tid"]) == (0, 1)}
    assert (late["wait"]["ts"], late["wait"]["dur"]) == (500_000, 200_000)  # microseconds
    assert (late["prefill"]["ts"], late["prefill"]["dur"]) == (700_000, 200_000)
    assert (late["decode"]["ts"], late["decode"]["dur"]) == (900_000, 100_000)
    assert late["decode"]["args"]["correct"] is False
    passes = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}  # a process per pass, titled
    assert passes == {"dynamic · tiny_random · pass 1", "dynamic · tiny_random · pass 2"}
    assert timeline.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
