"""A Gemma-3-style model (sliding-window layers with a few full-attention ones), in one process: what
each cache holds against what `kvpipe plan` predicts and what a dense count of every layer says,
compression against a 16-bit DynamicCache, KL against the full-precision reference, and TPOT with its
95% interval over interleaved rounds (the jobs take turns, as a sweep's do), for dynamic, static,
and quantized caches that quantize the full-attention layers only or every layer.

    python benchmarks/sliding_window.py                          # 2,000-token prompt, 32 new tokens
    python benchmarks/sliding_window.py --prompt-tokens 400 --new-tokens 8 --repeats 1

The model is a seeded random-weight config (no Gemma weights can be downloaded here): bytes and
timings are real; KL compares outputs of random weights, so it shows relative damage only.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from kvpipe import catalogue
from kvpipe import model as models
from kvpipe.cache.accounting import dense_bytes, kv_shape
from kvpipe.job.runner import measured_together
from kvpipe.jobspec import compose, make_spec
from kvpipe.record.report import figure_text
from kvpipe.units import counted, human_bytes

LAYERS, FULL_EVERY, WINDOW = 12, 6, 512  # Gemma 3's pattern: five sliding layers, then one full
MODEL = [
    "model=tiny_random",
    f"model.num_hidden_layers={LAYERS}",
    "model.layer_types=["
    + ",".join("full_attention" if (i + 1) % FULL_EVERY == 0 else "sliding_attention" for i in range(LAYERS))
    + "]",
    f"model.sliding_window={WINDOW}",
    "model.hidden_size=256",
    "model.intermediate_size=512",
    "model.num_attention_heads=4",
    "model.num_key_value_heads=1",
    "model.head_dim=64",
    "model.max_position_embeddings=8192",
]
QUANTIZED = ["cache=quantized", "backend.nbits=4", "axis=kivi"]
STRATEGIES = [
    ("dynamic", ["cache=dynamic"]),
    ("static", ["cache=static"]),
    ("quanto int4, full layers", [*QUANTIZED, "backend=quanto"]),
    ("quanto int4, all layers", [*QUANTIZED, "backend=quanto", "cache.quantize_sliding=true"]),
    ("hqq int4, full layers", [*QUANTIZED, "backend=hqq"]),
    ("hqq int4, all layers", [*QUANTIZED, "backend=hqq", "cache.quantize_sliding=true"]),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=6, help="interleaved rounds (workload.repeats)")
    parser.add_argument("--out", type=Path, default=Path("outputs/benchmarks/sliding_window"))
    args = parser.parse_args()
    base = [
        *MODEL,
        "workload=long_context",
        f"workload.prompt_tokens={args.prompt_tokens}",
        f"workload.max_new_tokens={args.new_tokens}",
        f"workload.repeats={args.repeats}",
        "workload.warmup=1",
        "tracking=off",
    ]
    specs = [(label, make_spec(compose(base + overrides))) for label, overrides in STRATEGIES]
    shape = models.read_shape(specs[0][1].model)
    print(f"{shape.layer_summary()}; prompt {args.prompt_tokens} + {args.new_tokens} new", flush=True)
    jobs = measured_together(specs)
    rows = []
    for (label, spec), job in zip(specs, jobs):
        result = job.result({"measured_order": "interleaved"})
        metrics = result.metrics
        kv = kv_shape(shape, 1, result.tags["dtype"])
        prompt, new = args.prompt_tokens, metrics["kv_cache_tokens"] - args.prompt_tokens + 1
        rows.append(
            {
                "strategy": label,
                "quantized layers": result.params.get("cache.quantized_layers", "none"),
                "kv_cache_bytes": metrics["kv_cache_bytes"],
                "plan": spec.strategy.predict_kv_bytes(kv, prompt, new),
                "dense count": dense_bytes(kv, metrics["kv_cache_tokens"]),
                "vs fp16": metrics["kv_compression"],
                "kl": metrics.get("kl_vs_reference"),
                "tpot_ms": metrics["tpot_ms"],
                "tpot_ms_ci": (metrics.get("tpot_ms_ci_low"), metrics.get("tpot_ms_ci_high")),
                "tpot_shown": figure_text(catalogue.get("tpot_ms"), metrics, result.tags, unit=False),
            }
        )
        print(
            f"{label:26s} kv={human_bytes(metrics['kv_cache_bytes']):>10s} tpot={metrics['tpot_ms']:.1f} ms", flush=True
        )

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(rows, indent=2))
    table = pd.DataFrame(
        [
            {
                "strategy": row["strategy"],
                "quantized layers": row["quantized layers"],
                "kv_cache_bytes": f"{row['kv_cache_bytes']:,} ({human_bytes(row['kv_cache_bytes'])})",
                "plan predicts": "= measured" if row["plan"] == row["kv_cache_bytes"] else f"{row['plan']:,}",
                "dense count of every layer": human_bytes(row["dense count"]),
                "vs fp16": f"{row['vs fp16']:.2f}",
                "KL nats": "" if row["kl"] is None else f"{row['kl']:.2e}",
                "TPOT ms": row["tpot_shown"],
            }
            for row in rows
        ]
    )
    title = (
        f"Model: seeded random Gemma-3-style config, {shape.layer_summary()}, 1 KV head x head_dim 64, "
        f"float32; workload long_context, prompt {args.prompt_tokens} tokens, {args.new_tokens} new, "
        f"{counted(args.repeats, 'interleaved round')} after 1 warm-up; TPOT with its 95% interval over the rounds."
    )
    markdown = f"{title}\n\n{table.to_markdown(index=False, disable_numparse=True)}\n"
    (args.out / "table.md").write_text(markdown)
    print(markdown)


if __name__ == "__main__":
    main()
