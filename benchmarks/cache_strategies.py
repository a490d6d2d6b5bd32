"""Every cache strategy on one model and workload, in one process, the jobs taking turns in interleaved
rounds (kvpipe.schedule, as a sweep's do): KV bytes, compression, peak memory (absolute, and over the
state before the call), decode speed and TPOT with their 95% intervals over the rounds, TPOT against
dynamic's measured in the same rounds (kvpipe.decide.paired), noise, roofline fraction and compile
time (table.md), and quality against the full-precision reference (quality.md). Writes markdown
tables (and JSON) for the manual (docs/benchmarks.md).

    python benchmarks/cache_strategies.py                      # embedded model, 1,000-token prompt, 64 new
    python benchmarks/cache_strategies.py --workload chat      # the bundled chat prompts
    python benchmarks/cache_strategies.py --prompt-tokens 300 --new-tokens 16 --model tiny_random
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from kvpipe import catalogue
from kvpipe.decide.paired import ratio
from kvpipe.job.runner import measured_together
from kvpipe.jobspec import compose, make_spec
from kvpipe.measure.round_figures import TAG_PREFIX, parse_series
from kvpipe.measure.uncertainty import interval_note
from kvpipe.units import human_bytes

STRATEGIES = [
    ("dynamic", ["cache=dynamic"]),
    ("static", ["cache=static"]),
    ("static+compile", ["cache=static", "cache.compile=true"]),
]
for backend in ("quanto", "hqq"):
    for nbits in (4, 2):
        for axis in ("per_token", "per_channel", "kivi"):
            STRATEGIES.append(
                (
                    f"{backend} int{nbits} {axis}",
                    ["cache=quantized", f"backend={backend}", f"backend.nbits={nbits}", f"axis={axis}"],
                )
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2_135m")
    parser.add_argument("--workload", choices=("long_context", "chat"), default="long_context")
    parser.add_argument("--prompt-tokens", type=int, default=1000, help="long_context only")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=6, help="interleaved rounds (workload.repeats)")
    parser.add_argument("--only", nargs="*", help="strategy labels to run (default: all)")
    parser.add_argument("--out", type=Path, default=Path("outputs/benchmarks/cache_strategies"))
    args = parser.parse_args()

    base = [
        f"model={args.model}",
        f"workload={args.workload}",
        *([f"workload.prompt_tokens={args.prompt_tokens}"] if args.workload == "long_context" else []),
        f"workload.max_new_tokens={args.new_tokens}",
        f"workload.repeats={args.repeats}",
        "workload.warmup=1",
        "tracking=off",
    ]
    # Compose every spec before measuring anything: an edit to conf/ mid-run cannot break the run.
    specs = [
        (label, make_spec(compose(base + overrides)))
        for label, overrides in STRATEGIES
        if not args.only or label in args.only
    ]
    jobs = measured_together(specs)  # each round calls every strategy once, in a shuffled order
    rows, tags = [], {}
    for (label, _), job in zip(specs, jobs):
        result = job.result({"measured_order": "interleaved", "round_group": "cache_strategies"})
        metrics, tags[label] = result.metrics, result.tags
        rows.append({"strategy": label, **metrics})
        print(
            f"{label:28s} kv={human_bytes(metrics['kv_cache_bytes']):>10s} "
            f"x{metrics['kv_compression']:.2f} decode={metrics['decode_tokens_per_s']:.1f} tok/s",
            flush=True,
        )
    baseline = {f"tags.kvpipe.{k}": v for k, v in tags.get("dynamic", {}).items()}
    for row in rows:
        against = (
            ratio({f"tags.kvpipe.{k}": v for k, v in tags[row["strategy"]].items()}, baseline) if baseline else None
        )
        row["tpot_vs_dynamic"] = None if against is None or row["strategy"] == "dynamic" else against.text()

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(rows, indent=2))
    # Cells formatted as text first: to_markdown would otherwise reformat the numbers.
    speed = pd.DataFrame(
        [
            {
                "strategy": row["strategy"],
                "kv_cache_bytes": f"{row['kv_cache_bytes']:,} ({human_bytes(row['kv_cache_bytes'])})",
                "kv_compression (vs fp16)": f"{row['kv_compression']:.2f}",
                "peak memory (absolute)": human_bytes(row["peak_memory_bytes"]),
                "over baseline": human_bytes(row["peak_over_baseline_bytes"]),
                "decode tok/s": _interval(row, "decode_tokens_per_s", tags[row["strategy"]]),
                "TPOT ms": _interval(row, "tpot_ms", tags[row["strategy"]]),
                "TPOT vs dynamic": row["tpot_vs_dynamic"] or "",
                "noise": _percent(row.get("timing_noise_cv")),
                "roofline_fraction": _fixed(row.get("roofline_fraction"), 2),
                "compile_ms": f"{row['compile_ms']:.0f}" if "compile_ms" in row else "",
            }
            for row in rows
        ]
    )
    quality = pd.DataFrame(
        [
            {
                "strategy": row["strategy"],
                "token_agreement": _spread(row, "token_agreement", "{:.3f}"),
                "first_divergence": f"{row['first_divergence']:.0f}" if "first_divergence" in row else "",
                "ppl": _spread(row, "ppl", "{:.2f}"),
                "kl_vs_reference (nats)": _spread(row, "kl_vs_reference", "{:.2e}"),
            }
            for row in rows
            if "kl_vs_reference" in row
        ]
    )
    work = f"prompt {args.prompt_tokens} tokens" if args.workload == "long_context" else "the bundled chat prompts"
    header = (
        f"Model `{args.model}`, workload `{args.workload}` ({work}), {args.new_tokens} new tokens, batch 1, "
        f"{args.repeats} interleaved rounds after 1 warm-up; figures with their 95% interval over the rounds."
    )
    for name, table in (("table.md", speed), ("quality.md", quality)):
        if table.empty:
            continue
        markdown = table.to_markdown(
            index=False, disable_numparse=True, colalign=["left"] + ["right"] * (table.shape[1] - 1)
        )
        (args.out / name).write_text(f"{header}\n\n{markdown}\n")
        print(f"{header}\n\n{markdown}\n")


def _interval(row: dict, name: str, tags: dict) -> str:
    """The figure with its interval, or the words the run's table prints in its place (too few rounds)."""
    metric = catalogue.get(name)
    interval = metric.interval_of(row)
    note = interval_note(*interval, parse_series(tags.get(TAG_PREFIX + name))) or ""
    return metric.number(row[name], None, interval, note)


def _spread(row: dict, name: str, fmt: str) -> str:
    if row.get(name) is None:
        return ""
    return f"{fmt.format(row[name])} ± {fmt.format(row.get(name + '_std') or 0)}"


def _percent(value) -> str:
    return "" if value is None else f"{value:.0%}"


def _fixed(value, digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f}"


if __name__ == "__main__":
    main()
