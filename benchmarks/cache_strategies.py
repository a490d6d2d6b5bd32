"""Every cache strategy on one model and workload, in one process: KV bytes, compression,
decode speed, and compile time. Writes a markdown table (and JSON) for the README.

    python benchmarks/cache_strategies.py                      # embedded model, 1,000-token prompt, 64 new
    python benchmarks/cache_strategies.py --prompt-tokens 300 --new-tokens 16 --model tiny_random
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from kvpipe.config import compose
from kvpipe.job.runner import run_job
from kvpipe.spec import make_spec
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
    parser.add_argument("--prompt-tokens", type=int, default=1000)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--only", nargs="*", help="strategy labels to run (default: all)")
    parser.add_argument("--out", type=Path, default=Path("outputs/benchmarks/cache_strategies"))
    args = parser.parse_args()

    base = [
        f"model={args.model}",
        "workload=long_context",
        f"workload.prompt_tokens={args.prompt_tokens}",
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
    rows = []
    for label, spec in specs:
        metrics = run_job(spec).metrics
        rows.append({"strategy": label, **metrics})
        print(
            f"{label:28s} kv={human_bytes(metrics['kv_cache_bytes']):>10s} "
            f"x{metrics['kv_compression']:.2f} decode={metrics['decode_tokens_per_s']:.1f} tok/s",
            flush=True,
        )

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(rows, indent=2))
    # Cells formatted as text first: to_markdown would otherwise reformat the numbers.
    table = pd.DataFrame(
        [
            {
                "strategy": row["strategy"],
                "kv_cache_bytes": f"{row['kv_cache_bytes']:,} ({human_bytes(row['kv_cache_bytes'])})",
                "kv_compression (vs fp16)": f"{row['kv_compression']:.2f}",
                "decode tok/s": f"{row['decode_tokens_per_s']:.1f} ± {row['decode_tokens_per_s_std']:.1f}",
                "TPOT ms": f"{row['tpot_ms']:.1f}",
                "compile_ms": f"{row['compile_ms']:.0f}" if "compile_ms" in row else "",
            }
            for row in rows
        ],
        columns=["strategy", "kv_cache_bytes", "kv_compression (vs fp16)", "decode tok/s", "TPOT ms", "compile_ms"],
    )
    lines = [
        f"Model `{args.model}`, prompt {args.prompt_tokens} tokens, {args.new_tokens} new tokens, batch 1, "
        f"{args.repeats} measured repeats after 1 warm-up.",
        "",
        table.to_markdown(index=False, disable_numparse=True, colalign=["left"] + ["right"] * 5),
    ]
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
