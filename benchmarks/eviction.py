"""Fewer tokens or fewer bits, on one front: each eviction press (streaming, knorm, snapkv) at ratios
0.25, 0.5 and 0.75, quanto int4 and int2 (kivi), and snapkv 0.5 with int4, beside the full-precision
dynamic cache. Two workloads, each as one set of jobs taking turns in interleaved rounds (as a
sweep's do):

- long_context at 1,024 prompt tokens: KV bytes, TTFT, TPOT and the quality pass (KL, top-1
  agreement, perplexity against the full-precision reference);
- passkey at 1,024 and 2,048 tokens, the key at depths 0.1, 0.5 and 0.9, two prompts a cell:
  retrieval accuracy per length, with the KV bytes at that length.

Writes table.md, directions.md (the three directions the literature predicts, as measured),
front.png (quality against KV bytes, a series per family) and results.json.

    python benchmarks/eviction.py                        # embedded model, ~25 min on 2 CPU cores
    python benchmarks/eviction.py --model tiny_random --prompt-tokens 128 --lengths 128 256 --new-tokens 8
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from kvpipe import catalogue
from kvpipe.decide.plots import quality_vs_kv_bytes
from kvpipe.decide.runs import evicts, front_family
from kvpipe.job.runner import measured_together
from kvpipe.jobspec import compose, make_spec
from kvpipe.record.report import figure_text
from kvpipe.units import counted, human_bytes

RATIOS = (0.25, 0.5, 0.75)
PRESSES = ("streaming", "knorm", "snapkv")
INT4 = ["cache=quantized", "backend=quanto", "backend.nbits=4", "axis=kivi"]
CONFIGS = [
    ("dynamic", []),
    *[(f"{press} {ratio}", [f"press={press}", f"press.ratio={ratio}"]) for press in PRESSES for ratio in RATIOS],
    ("quanto int4 kivi", INT4),
    ("quanto int2 kivi", ["cache=quantized", "backend=quanto", "backend.nbits=2", "axis=kivi"]),
    ("snapkv 0.5 + int4", [*INT4, "press=snapkv", "press.ratio=0.5"]),
]


def measure(base: list[str]) -> dict[str, object]:
    """Every configuration's JobResult on one workload, the jobs taking turns in shuffled rounds."""
    specs = [(label, make_spec(compose(base + overrides))) for label, overrides in CONFIGS]
    jobs = measured_together(specs, on_prepared=lambda label: print(f"prepared {label}", flush=True))
    return {label: job.result({"measured_order": "interleaved"}) for (label, _), job in zip(specs, jobs)}


def by_length(answers: list[dict]) -> dict[int, dict[str, float]]:
    """Per passkey length: accuracy over its answers, and the KV bytes its calls held."""
    found: dict[int, list] = {}
    for row in answers:
        found.setdefault(row["context_tokens"], []).append(row)
    return {
        length: {
            "accuracy": sum(r["found"] for r in rows) / len(rows),
            "kv_cache_bytes": max(r["kv_cache_bytes"] for r in rows),
            "found": [r["found"] for r in sorted(rows, key=lambda r: (r["depth"], r["trial"]))],
        }
        for length, rows in sorted(found.items())
    }


def family_of(overrides: list[str]) -> str:
    strategy = "quantized" if "cache=quantized" in overrides else "dynamic"
    press = next((o.split("=")[1] for o in overrides if o.startswith("press=")), "none")
    return front_family(strategy, evicts(press))


def directions(rows: list[dict], lengths: list[int]) -> list[str]:
    """The three directions the literature predicts, each as these runs measured it."""
    by = {row["config"]: row for row in rows}
    lines = ["## snapkv keeps the key where streaming, at the same ratio, loses it", ""]
    for length in lengths:
        for ratio in RATIOS:
            snap, stream = by[f"snapkv {ratio}"], by[f"streaming {ratio}"]
            only_snap = sum(s and not t for s, t in zip(snap[f"found_{length}"], stream[f"found_{length}"]))
            only_stream = sum(t and not s for s, t in zip(snap[f"found_{length}"], stream[f"found_{length}"]))
            lines.append(
                f"- {length:,} tokens, ratio {ratio}: snapkv {snap[f'retrieval_{length}']:.0%} "
                f"({human_bytes(snap[f'kv_{length}'])}), streaming {stream[f'retrieval_{length}']:.0%} "
                f"({human_bytes(stream[f'kv_{length}'])}); prompts only snapkv answered {only_snap}, only streaming "
                f"{only_stream}"
            )
    lines += ["", "## KL grows with the ratio, for every press (long_context)", ""]
    for press in PRESSES:
        kls = [by[f"{press} {ratio}"]["kl_vs_reference"] for ratio in RATIOS]
        grows = all(a < b for a, b in zip(kls, kls[1:]))
        lines.append(
            f"- {press}: KL "
            + " < ".join(f"{kl:.3f}" for kl in kls)
            + (" (grows)" if grows else " (does not grow at every step)")
        )
    lines += ["", "## at about equal bytes, int4 loses less than a 0.75 press (long_context)", ""]
    int4 = by["quanto int4 kivi"]
    for press in PRESSES:
        other = by[f"{press} 0.75"]
        verdict = "int4 loses less" if int4["kl_vs_reference"] < other["kl_vs_reference"] else "the press loses less"
        lines.append(
            f"- int4 KL {int4['kl_vs_reference']:.3f} in {human_bytes(int4['kv_cache_bytes'])} vs {press} 0.75 KL "
            f"{other['kl_vs_reference']:.3f} in {human_bytes(other['kv_cache_bytes'])}: {verdict}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2_135m")
    parser.add_argument("--prompt-tokens", type=int, default=1024, help="long_context's prompt")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048], help="passkey's context lengths")
    parser.add_argument("--new-tokens", type=int, default=32, help="long_context's new tokens")
    parser.add_argument("--repeats", type=int, default=3, help="long_context's interleaved rounds")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("outputs/benchmarks/eviction"))
    args = parser.parse_args()
    common = [f"model={args.model}", f"model.threads={args.threads}", "tracking=off", "workload.warmup=1"]
    long_context = measure([*common, "workload=long_context", f"workload.prompt_tokens={args.prompt_tokens}",
                            f"workload.max_new_tokens={args.new_tokens}", f"workload.repeats={args.repeats}"])  # fmt: skip
    passkey = measure([*common, "workload=passkey", f"workload.context_tokens=[{','.join(map(str, args.lengths))}]",
                       "workload.depths=[0.1,0.5,0.9]", "workload.trials=2", "quality=off"])  # fmt: skip

    rows = []
    for label, overrides in CONFIGS:
        figures = long_context[label].metrics
        row = {"config": label, "family": family_of(overrides), **{k: figures.get(k) for k in (
            "kv_cache_bytes", "ttft_ms", "ttft_ms_ci_low", "ttft_ms_ci_high", "tpot_ms", "tpot_ms_ci_low",
            "tpot_ms_ci_high", "kl_vs_reference", "token_agreement", "ppl")}}  # fmt: skip
        row |= {f"{name}_shown": figure_text(catalogue.get(f"{name}_ms"), figures, long_context[label].tags, unit=False)
                for name in ("ttft", "tpot")}  # fmt: skip
        for length, cell in by_length(passkey[label].answers).items():
            row |= {f"retrieval_{length}": cell["accuracy"], f"kv_{length}": cell["kv_cache_bytes"],
                    f"found_{length}": cell["found"]}  # fmt: skip
        rows.append(row)
        print(f"{label:20s} kv={human_bytes(row['kv_cache_bytes']):>10s} KL={row['kl_vs_reference']:.3f} "
              + " ".join(f"{n}:{row[f'retrieval_{n}']:.0%}" for n in args.lengths), flush=True)  # fmt: skip

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(rows, indent=2))
    table = pd.DataFrame(
        [
            {
                "config": row["config"],
                "family": row["family"],
                "KV @ long_context": human_bytes(row["kv_cache_bytes"]),
                "TTFT ms": row["ttft_shown"],
                "TPOT ms": row["tpot_shown"],
                "KL (nats)": f"{row['kl_vs_reference']:.3f}",
                "agreement": f"{row['token_agreement']:.3f}",
                "ppl": f"{row['ppl']:.2f}",
                **{
                    f"passkey {n:,}": f"{row[f'retrieval_{n}']:.0%} ({human_bytes(row[f'kv_{n}'])})"
                    for n in args.lengths
                },
            }
            for row in rows
        ]
    )
    header = (
        f"Model `{args.model}`, {args.threads} threads. long_context: {args.prompt_tokens:,} prompt tokens, "
        f"{args.new_tokens} new, {counted(args.repeats, 'interleaved round')} after 1 warm-up (TTFT and TPOT with their 95% "
        f"intervals), quality against the full-precision reference. passkey: {', '.join(f'{n:,}' for n in args.lengths)} "
        "tokens, depths 0.1/0.5/0.9, 2 prompts a cell (6 a length), 12 new tokens: retrieval accuracy (KV bytes at "
        "that length)."
    )
    markdown = table.to_markdown(
        index=False, disable_numparse=True, colalign=["left"] * 2 + ["right"] * (table.shape[1] - 2)
    )
    (args.out / "table.md").write_text(f"{header}\n\n{markdown}\n")
    (args.out / "directions.md").write_text("\n".join(directions(rows, args.lengths)) + "\n")
    front = pd.DataFrame(
        [
            {
                "workload": panel,
                "family": row["family"],
                "point": row["config"],
                "metrics.kv_cache_bytes": kv,
                "quality_loss": row["kl_vs_reference"],
                "metrics.retrieval_accuracy": accuracy,
            }  # fmt: skip
            for row in rows
            for panel, kv, accuracy in [
                (f"long_context {args.prompt_tokens:,}: KL", row["kv_cache_bytes"], float("nan")),
                *[(f"passkey {n:,}: retrieval", row[f"kv_{n}"], row[f"retrieval_{n}"]) for n in args.lengths],
            ]
        ]
    )
    quality_vs_kv_bytes(front, args.out / "front.png")
    print(f"{header}\n\n{markdown}\n\n" + (args.out / "directions.md").read_text())


if __name__ == "__main__":
    main()
