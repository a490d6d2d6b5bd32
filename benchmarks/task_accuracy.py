"""What a lossy cache does to a labelled file's answers: the example questions (examples/questions.jsonl,
28 one-word questions) answered through the full-precision dynamic cache, quanto int4 and int2 (kivi),
int2 with backend.residual_length=0 (every new token quantized too, where the default keeps the
answer's own tokens in full precision; the prompt is quantized as it is read either way), fp8, and snapkv and streaming at ratio 0.5, the jobs taking turns in interleaved rounds (as a
sweep's do). Each answer stops at end-of-sequence and is scored by workload.scorer (contains); the
quality pass makes the full-precision reference's answers to the same prompts.

Reports, per cache: task accuracy with its 95% interval (Wilson's), the answers changed against the
reference's, the flips (right → wrong, wrong → right), the output length against the reference's
(tokens before EOS, summed), KV bytes and TPOT with its interval. Writes table.md and results.json.

    python benchmarks/task_accuracy.py                   # embedded model, 1 thread: ~10 min on 2 CPU cores
    python benchmarks/task_accuracy.py --model tiny_random --limit 4 --only dynamic "quanto int2"
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from kvpipe.job.runner import measured_together
from kvpipe.jobspec import compose, make_spec
from kvpipe.units import human_bytes

INT2 = ["cache=quantized", "backend=quanto", "backend.nbits=2", "axis=kivi"]
CONFIGS = [
    ("dynamic", []),
    ("quanto int4", ["cache=quantized", "backend=quanto", "backend.nbits=4", "axis=kivi"]),
    ("quanto int2", INT2),
    ("quanto int2, residual 0", [*INT2, "backend.residual_length=0"]),
    ("fp8", ["cache=quantized", "backend=fp8"]),
    # a window of 8, not snapkv's 64: the questions' prompts are ~40 tokens, which a 64-token window keeps whole
    ("snapkv 0.5", ["press=snapkv", "press.ratio=0.5", "press.window=8"]),
    ("streaming 0.5", ["press=streaming", "press.ratio=0.5"]),
]
FIGURES = ("task_accuracy", "task_accuracy_ci_low", "task_accuracy_ci_high", "task_answers", "answers_changed",
           "flipped_to_wrong", "flipped_to_right", "output_length_ratio", "kv_cache_bytes", "tpot_ms",
           "tpot_ms_ci_low", "tpot_ms_ci_high")  # fmt: skip


def measure(base: list[str], configs: list[tuple[str, list[str]]]) -> list[dict]:
    """Each configuration's figures, the jobs prepared one by one, then measured in shuffled rounds."""
    specs = [(label, make_spec(compose(base + overrides))) for label, overrides in configs]
    jobs = measured_together(specs, on_prepared=lambda label: print(f"prepared {label}", flush=True))
    rows = []
    for (label, _), job in zip(specs, jobs):
        result = job.result({"measured_order": "interleaved"})
        rows.append({"config": label, **{name: result.metrics.get(name) for name in FIGURES},
                     "generation": result.tags.get("generation"), "answers": result.scored.rows})  # fmt: skip
    return rows


def interval(row: dict, name: str, spec: str) -> str:
    """`value [low–high]` in the figure's format."""
    value, low, high = row[name], row[f"{name}_ci_low"], row[f"{name}_ci_high"]
    return f"{value:{spec}} [{low:{spec}}–{high:{spec}}]"


def table(rows: list[dict]) -> pd.DataFrame:
    def ratio(value):
        return "–" if value is None else f"{value:.2f}×"

    return pd.DataFrame(
        [
            {
                "cache": row["config"],
                "accuracy [95% CI]": interval(row, "task_accuracy", ".0%"),
                "answers changed": f"{row['answers_changed']:.0%}",
                "right → wrong": f"{row['flipped_to_wrong']:.0f}",
                "wrong → right": f"{row['flipped_to_right']:.0f}",
                "output length vs reference": ratio(row["output_length_ratio"]),
                "KV bytes": human_bytes(row["kv_cache_bytes"]),
                "TPOT ms [95% CI]": interval(row, "tpot_ms", ".1f"),
            }
            for row in rows
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2_135m")
    parser.add_argument("--path", default="examples/questions.jsonl", help="the labelled file")
    parser.add_argument("--limit", type=int, help="a seeded sample of this many rows (default: all)")
    parser.add_argument("--new-tokens", type=int, default=32, help="at most, per answer (each stops at its EOS)")
    parser.add_argument("--repeats", type=int, default=2, help="interleaved rounds (greedy answers count once)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", nargs="*", help="cache labels to run (default: all)")
    parser.add_argument("--out", type=Path, default=Path("outputs/benchmarks/task_accuracy"))
    args = parser.parse_args()
    configs = [(label, overrides) for label, overrides in CONFIGS if not args.only or label in args.only]
    base = [
        f"model={args.model}",
        f"model.threads={args.threads}",
        "workload=dataset",
        f"workload.path={args.path}",
        *([f"workload.limit={args.limit}"] if args.limit else []),
        f"workload.max_new_tokens={args.new_tokens}",
        f"workload.repeats={args.repeats}",
        "workload.warmup=1",
        "quality=on",
        "tracking=off",
    ]
    rows = measure(base, configs)

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(rows, indent=2))
    shown = table(rows)
    markdown = shown.to_markdown(
        index=False, disable_numparse=True, colalign=["left"] + ["right"] * (shown.shape[1] - 1)
    )
    sample = f"a seeded sample of {args.limit} rows" if args.limit else "every row"
    header = (
        f"Model `{args.model}`, {args.threads} thread(s), `{args.path}` ({sample}, {rows[0]['task_answers']:.0f} "
        f"answers), scorer contains, at most {args.new_tokens} new tokens ({rows[0]['generation']}); "
        f"{args.repeats} interleaved rounds after 1 warm-up. Answers changed, flips and output length against the "
        "full-precision reference's answers to the same prompts."
    )
    (args.out / "table.md").write_text(f"{header}\n\n{markdown}\n")
    print(f"{header}\n\n{markdown}\n\nwritten: {args.out / 'table.md'}, {args.out / 'results.json'}")


if __name__ == "__main__":
    main()
