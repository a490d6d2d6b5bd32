"""The metric catalogue: every figure a run reports, once, with its unit, format, direction and label.

The run's terminal table, `compare` and `recommend` all read it, so a figure reads the same
everywhere. A workload's own scoring declares its metrics on its class (`Workload.metrics`), above
this module: `kvpipe.workload.metrics()` is this catalogue with every registered workload's added.
The manual's metrics page is the public contract: docs/metrics.yaml says what each name here means, and
its build (and a test) fails where one is missing.
Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from kvpipe.units import human_bytes

# A metric's column among recorded runs (MLflow's runs table; kvpipe.record.table names the others)
METRICS_COLUMN = "metrics."


@dataclass(frozen=True)
class Metric:
    """One reported figure. `format` is a format spec for the value ('bytes': human_bytes); `unit` is
    what follows it in running text; `lower_is_better` None where neither is (a count, a setting)."""

    name: str
    label: str
    unit: str = ""
    format: str = ".1f"
    lower_is_better: bool | None = None
    in_run_table: bool = False  # a row of the run's terminal table (kvpipe.record.report)
    compare: bool = False  # a column of compare's table (where some run has it)

    @property
    def is_share(self) -> bool:
        """A proportion (shown as a percentage: an accuracy, a share of requests)."""
        return self.format.endswith("%")

    @property
    def column(self) -> str:
        """Its column among recorded runs (MLflow's runs frame, kvpipe.record.read_back): metrics.NAME."""
        return METRICS_COLUMN + self.name

    def companion(self, suffix: str) -> str:
        """The column of one of its companions (_std, _ci_low, _ci_high): metrics.tpot_ms_std."""
        return f"{METRICS_COLUMN}{self.name}_{suffix}"

    def number(self, value: float, std: float | None = None, interval: tuple | None = None, note: str = "") -> str:
        """The value and its 95% interval (`51.1 (49.8–52.6)`) where it has one, else ± std where
        there is a spread, without the unit: a table cell under a header that names the unit. A
        note says why the interval is not printed, in its place: `173.1 (1 round, no interval)`."""
        if value is None or value != value:
            return "–"
        if self.format == "bytes":
            return human_bytes(value)
        text = format(value, self.format)
        if note:
            text += f" ({note})"
        elif interval and all(bound is not None and bound == bound for bound in interval):
            text += f" ({format(interval[0], self.format)}–{format(interval[1], self.format)})"
        elif std and self.format.endswith("f"):
            text += f" ± {format(std, self.format)}"
        return text

    def interval_of(self, metrics: dict) -> tuple:
        """(low, high) of its 95% interval among a run's metrics (None where it has none)."""
        return metrics.get(f"{self.name}_ci_low"), metrics.get(f"{self.name}_ci_high")

    def show(self, value: float, std: float | None = None, interval: tuple | None = None, note: str = "") -> str:
        """The value with its unit, for running text and the run's table: `51.1 (49.8–52.6) ms`, or
        with a note, `51.1 ms (1 round, no interval)`, the note in place of the interval."""
        text = self.number(value) if note else self.number(value, std, interval)
        if text == "–" or not self.unit or self.format == "bytes":
            unit = ""
        else:
            unit = ("" if self.unit == "×" else " ") + self.unit  # 1.95×, but 51.1 ms
        return text + unit + (f" ({note})" if note and text != "–" else "")

    def header(self) -> str:
        """A table column's title: the label, and a unit that is a word (ms, tok/s, nats)."""
        return f"{self.label} {self.unit}" if self._unit_in_header() else self.label

    def cell(self, value: float, std: float | None = None, interval: tuple | None = None, note: str = "") -> str:
        """A table cell under `header()`: the unit only where the header leaves it out (1.95×)."""
        if self._unit_in_header():
            return self.number(value, std, interval, note)
        return self.show(value, std, interval, note)

    def _unit_in_header(self) -> bool:
        return bool(self.unit) and self.unit != "×" and self.format != "bytes"


def _m(name, label, unit="", value_format=".1f", lower=None, in_run_table=False, compare=False) -> Metric:
    return Metric(name, label, unit, value_format, lower, in_run_table, compare)


LOWER, HIGHER = True, False
# In table order: the run's terminal table and compare's columns follow it.
CORE = (
    _m("ttft_ms", "TTFT", "ms", lower=LOWER, in_run_table=True),
    _m("tpot_ms", "TPOT", "ms", lower=LOWER, in_run_table=True, compare=True),
    _m("timing_noise_cv", "timing noise", "", ".0%", LOWER, in_run_table=True, compare=True),
    _m("decode_tokens_per_s", "decode", "tok/s", lower=HIGHER, in_run_table=True, compare=True),
    _m("e2e_ms", "end-to-end", "ms", lower=LOWER, in_run_table=True),
    _m("prefill_tokens_per_s", "prefill", "tok/s", lower=HIGHER),
    _m("itl_p50_ms", "ITL p50", "ms", lower=LOWER),
    _m("itl_p90_ms", "ITL p90", "ms", lower=LOWER),
    _m("itl_p99_ms", "ITL p99", "ms", lower=LOWER),
    _m("rounds", "rounds", "", ".0f", in_run_table=True),  # rounds measured (kvpipe.schedule)
    _m("rounds_converged", "TPOT interval within target", "", ".0f"),  # repeats=auto: 1 where it was reached
    _m("rounds_decided", "paired ratios decided", "", ".0f"),  # a sweep on repeats=auto: 1 where they were
    _m("calls_excluded", "calls under others' load", "", ".0f"),  # turn=call: left out of the paired ratios
    _m("itl_ms", "ITL", "ms", lower=LOWER),  # its mean is not reported: its interval, itl_ms_ci_low/_ci_high, is
    # a serving run (load=...): per request, from its arrival (kvpipe.measure.request_figures)
    _m("ttft_p50_ms", "TTFT p50", "ms", lower=LOWER),
    _m("ttft_p90_ms", "TTFT p90", "ms", lower=LOWER, in_run_table=True, compare=True),
    _m("ttft_p99_ms", "TTFT p99", "ms", lower=LOWER),
    _m("tpot_p50_ms", "TPOT p50", "ms", lower=LOWER),
    _m("tpot_p90_ms", "TPOT p90", "ms", lower=LOWER, in_run_table=True, compare=True),
    _m("tpot_p99_ms", "TPOT p99", "ms", lower=LOWER),
    _m("e2e_p50_ms", "end-to-end p50", "ms", lower=LOWER),
    _m("e2e_p90_ms", "end-to-end p90", "ms", lower=LOWER),
    _m("e2e_p99_ms", "end-to-end p99", "ms", lower=LOWER),
    _m("queue_ms", "queueing", "ms", lower=LOWER, in_run_table=True),
    _m("queue_p50_ms", "queueing p50", "ms", lower=LOWER),
    _m("queue_p90_ms", "queueing p90", "ms", lower=LOWER),
    _m("queue_p99_ms", "queueing p99", "ms", lower=LOWER),
    _m("output_tokens_per_s", "output", "tok/s", lower=HIGHER, in_run_table=True, compare=True),
    _m("requests_per_s", "requests", "req/s", ".2f", HIGHER, in_run_table=True, compare=True),
    _m("goodput_requests_per_s", "goodput", "req/s", ".2f", HIGHER, in_run_table=True, compare=True),
    _m("within_targets", "within latency targets", "", ".0%", HIGHER),
    # where the workload judges answers: goodput that counts a request only if its answer was also right
    _m("goodput_correct_requests_per_s", "goodput, right answers", "req/s", ".2f", HIGHER, True, True),
    _m("correct_within_targets", "right and within latency targets", "", ".0%", HIGHER),
    _m("max_in_flight", "most in flight", "", ".0f", in_run_table=True),
    _m("kv_held_bytes", "KV held at peak", value_format="bytes", lower=LOWER, in_run_table=True),
    _m("served_requests", "requests served", "", ".0f"),
    # the offered load as scheduled (an open loop's arrivals): the gaps' spread, and the rate they realise
    _m("arrival_gap_cv", "arrival gaps' CV", "", ".2f", in_run_table=True),
    _m("arrival_rate_per_s", "offered rate", "req/s", ".2f", in_run_table=True),
    # sessions of turns (a workload in sessions: kvpipe.job.served_sessions)
    _m("prefix_hit_rate", "prefix hit rate", "", ".0%", HIGHER, in_run_table=True),
    _m("session_kv_held_bytes", "KV kept between turns at peak", value_format="bytes", lower=LOWER, in_run_table=True),
    _m("ttft_first_turn_p50_ms", "TTFT p50, first turns", "ms", lower=LOWER, in_run_table=True),
    _m("ttft_later_turns_p50_ms", "TTFT p50, later turns", "ms", lower=LOWER, in_run_table=True),
    _m("serve_span_ms", "first arrival to last token", "ms"),
    _m("peak_memory_bytes", "peak memory", value_format="bytes", lower=LOWER, in_run_table=True, compare=True),
    _m("peak_over_baseline_bytes", "peak over baseline", value_format="bytes", lower=LOWER, in_run_table=True),
    _m("peak_reserved_bytes", "peak reserved", value_format="bytes", lower=LOWER),
    _m("kv_cache_bytes", "KV cache", value_format="bytes", lower=LOWER, in_run_table=True, compare=True),
    _m("kv_cache_host_bytes", "KV cache in host memory", value_format="bytes"),
    _m("kv_cache_tokens", "KV cache tokens", "tokens", ".0f"),
    _m("kv_cache_bytes_fp16", "KV cache at fp16", value_format="bytes"),
    # the cache's size as a multiple of fp16's: 2.00× reads as "twice fp16's bytes" (a float32 cache),
    # where kv_compression's 0.50× read as "half of fp16"; kv_compression stays for older runs and scripts
    _m("kv_size_vs_fp16", "KV size vs fp16", "×", ".2f", LOWER, in_run_table=True, compare=True),
    _m("kv_compression", "fp16 KV ÷ KV", "×", ".2f", HIGHER),
    _m("compile_ms", "compile", "ms", lower=LOWER, in_run_table=True),
    # press.protocol=query_agnostic: the context read and compressed alone, before the question (part of TTFT)
    _m("context_prefill_ms", "context prefill", "ms", lower=LOWER, in_run_table=True),
    _m("roofline_fraction", "of memory roofline", "", ".2f", HIGHER, in_run_table=True),
    _m("weights_bytes", "weights", value_format="bytes"),
    _m("weights_read_bytes_per_step", "weight bytes read per step", value_format="bytes"),
    _m("kv_read_bytes_per_step", "KV bytes read per step", value_format="bytes"),
    _m("decode_bytes_per_step", "bytes read per step", value_format="bytes"),
    _m("memory_bandwidth_bytes_per_s", "memory bandwidth", "B/s", ".3g"),
    _m("token_agreement", "token agreement", "", ".2f", HIGHER, in_run_table=True, compare=True),
    _m("kl_vs_reference", "KL", "nats", ".2g", LOWER, in_run_table=True, compare=True),
    _m("ppl", "perplexity", "", ".2f", LOWER, in_run_table=True),
    _m("first_divergence", "first divergence", "step", ".0f"),
    _m("quality_windows", "quality windows", "", ".0f"),
    _m("quality_scored_tokens", "scored tokens", "tokens", ".0f"),
    _m("quality_ms", "quality pass", "ms", lower=LOWER),
    # the quality pass's full-precision answers to the same prompts, judged as the run's are
    _m("reference_accuracy", "accuracy at full precision", "", ".0%", HIGHER),
    _m("load_ms", "load", "ms"),
    _m("warmup_ms", "warm-up", "ms"),
    _m("measured_ms", "measured calls", "ms"),
    _m("harness_ms", "harness", "ms", lower=LOWER),
    _m("prompt_tokens", "prompt tokens", "tokens", ".0f"),
    _m("prompt_count", "prompts", "", ".0f"),
    _m("prompt_tokens_mean", "prompt tokens, mean", "tokens", ".1f"),
    _m("prompt_tokens_p50", "prompt tokens, p50", "tokens", ".0f"),
    _m("prompt_tokens_p90", "prompt tokens, p90", "tokens", ".0f"),
    _m("prompt_tokens_max", "prompt tokens, max", "tokens", ".0f"),
    _m("new_tokens", "new tokens", "tokens", ".0f"),
    _m("batch_size", "batch", "", ".0f"),
    _m("load_average_start", "load average at start", "", ".2f"),
    _m("load_average_end", "load average at end", "", ".2f"),
    _m("other_cpu_cores", "cores other processes held", "cores", ".2f"),
    _m("job_cpu_cores", "cores the job ran on", "cores", ".2f"),
)


def catalogue(extra: Iterable[Metric] = ()) -> dict[str, Metric]:
    """Every metric by name: the core ones, then `extra` (the workloads' own, which
    kvpipe.workload.metrics() passes), a name's first kept."""
    found = {metric.name: metric for metric in CORE}
    for metric in extra:
        found.setdefault(metric.name, metric)
    return found


def get(name: str) -> Metric:
    """A core metric."""
    return catalogue()[name]


def column(name: str) -> str:
    """A core metric's column among recorded runs (`metrics.tpot_ms`); a name not in the catalogue
    fails here, not as a column that silently reads NaN."""
    return get(name).column


def base_name(name: str, known: Mapping[str, Metric] | None = None) -> str:
    """A companion's metric: tpot_ms_std, tpot_ms_cv and tpot_ms_ci_low/_ci_high belong to tpot_ms
    (among `known`, by default the core metrics)."""
    known = catalogue() if known is None else known
    for suffix in ("_std", "_cv", "_ci_low", "_ci_high"):
        if name.endswith(suffix) and name.removesuffix(suffix) in known:
            return name.removesuffix(suffix)
    return name
