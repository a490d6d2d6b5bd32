"""The same labelled questions (examples/questions.jsonl, 28 one-word questions) through llama.cpp's
own server with its KV cache in f16, q8_0 and q4_0 (keys and values alike), with prompt caching on;
through vLLM's server with its KV cache in the weights' bfloat16 and in fp8, with prefix caching on;
and through kvpipe's own transformers process with the dynamic cache, one request at a time
(load=concurrency, 1 in flight), the jobs taking turns call by call in interleaved rounds, as a
sweep's do. With --workload conversation: the bundled conversations instead (4 sessions of 4 turns,
each turn re-sending its history), one session at a time, where prefix and prompt caching matter.
Needs llama-server and vLLM's environment: `make engines`.

Reports, per configuration: task accuracy with its 95% interval, the answers that flipped against
its own engine's full-precision cache (right → wrong, wrong → right) and against transformers', TTFT
and TPOT with their intervals, KV bytes and KV bytes per token as the engine reports them (llama.cpp:
its log's `llama_kv_cache: size` over its cells; vLLM: its /metrics' KV memory over its blocks' token
slots; transformers: kvpipe's count of the cache's tensors, over the longest request, so none per
token), prompt tokens served from cache, and the server's (or kvpipe's) peak memory. A conversation
has no labelled answers: its table gives TTFT of first turns and of later ones (which re-send a
history) in place of accuracy.

    python benchmarks/engines.py                           # embedded model, 1 thread: ~6 min on 2 CPU cores
    python benchmarks/engines.py --workload conversation   # ~4 min
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from kvpipe.job.runner import measured_together
from kvpipe.jobspec import compose, make_spec
from kvpipe.units import human_bytes

CONFIGS = [
    ("transformers dynamic", ["engine=transformers", "quality=off"]),
    ("llama_cpp f16", ["engine=llama_cpp", "engine.cache_type=f16"]),
    ("llama_cpp q8_0", ["engine=llama_cpp", "engine.cache_type=q8_0"]),
    ("llama_cpp q4_0", ["engine=llama_cpp", "engine.cache_type=q4_0"]),
    ("llama_cpp f16, prompt cache", ["engine=llama_cpp", "engine.cache_type=f16", "engine.cache_prompt=true"]),
    ("vllm auto (bfloat16)", ["engine=vllm"]),
    ("vllm fp8", ["engine=vllm", "engine.kv_cache_dtype=fp8"]),
    ("vllm auto, prefix caching", ["engine=vllm", "engine.prefix_caching=true"]),
    (
        "vllm auto, prefix caching, 32-token blocks",
        ["engine=vllm", "engine.prefix_caching=true", "engine.block_size=32"],
    ),
]
# Each engine's full-precision cache, which its other caches' flips are counted against
OWN_BASELINE = {"transformers": "transformers dynamic", "llama_cpp": "llama_cpp f16", "vllm": "vllm auto (bfloat16)"}
FIGURES = ("task_accuracy", "task_accuracy_ci_low", "task_accuracy_ci_high", "ttft_ms", "ttft_ms_ci_low",
           "ttft_ms_ci_high", "tpot_ms", "tpot_ms_ci_low", "tpot_ms_ci_high", "kv_cache_bytes", "kv_bytes_per_token",
           "kv_cells", "prefix_hit_rate", "peak_memory_bytes", "prompt_tokens_max", "ttft_first_turn_p50_ms",
           "ttft_later_turns_p50_ms")  # fmt: skip


def measure(base: list[str], configs: list[tuple[str, list[str]]]) -> list[dict]:
    specs = [(label, make_spec(compose(base + overrides))) for label, overrides in configs]
    jobs = measured_together(specs, on_prepared=lambda label: print(f"prepared {label}", flush=True))
    rows = []
    try:
        for (label, _), job in zip(specs, jobs):
            result = job.result({"measured_order": "interleaved"})
            scored = result.scored.rows if result.scored else []  # a conversation: no labelled answers
            right = {r["row"]: r["score"] >= 1.0 for r in scored if r["repeat"] == 0}
            rows.append({"config": label, **{name: result.metrics.get(name) for name in FIGURES}, "right": right,
                         "server": result.tags.get("engine_command", "")})  # fmt: skip
    finally:
        for job in jobs:
            job.close()
    return rows


def flips(row: dict, against: dict) -> str:
    worse = sum(against["right"][k] and not row["right"][k] for k in row["right"])
    better = sum(row["right"][k] and not against["right"][k] for k in row["right"])
    return f"{worse} / {better}"


def interval(row: dict, name: str, spec: str) -> str:
    return f"{row[name]:{spec}} [{row[f'{name}_ci_low']:{spec}}–{row[f'{name}_ci_high']:{spec}}]"


def table(rows: list[dict]) -> pd.DataFrame:
    by = {row["config"]: row for row in rows}
    own = lambda row: by[OWN_BASELINE[row["config"].split()[0]]]  # noqa: E731
    hf = by["transformers dynamic"]
    # an engine's bytes over its cells; none for transformers, whose cache grows to what it holds
    per_token = lambda r: f"{r['kv_bytes_per_token']:,.0f}" if r["kv_bytes_per_token"] else "–"  # noqa: E731
    return pd.DataFrame(
        [
            {
                "configuration": row["config"],
                "accuracy [95% CI]": interval(row, "task_accuracy", ".0%"),
                "flips vs its engine's full precision (→wrong / →right)": flips(row, own(row)),
                "flips vs transformers": flips(row, hf),
                "TTFT ms [95% CI]": interval(row, "ttft_ms", ".1f"),
                "TPOT ms [95% CI]": interval(row, "tpot_ms", ".2f"),
                "KV bytes": human_bytes(row["kv_cache_bytes"]),
                "KV bytes per token": per_token(row),
                "prompt tokens from cache": "–" if row["prefix_hit_rate"] is None else f"{row['prefix_hit_rate']:.0%}",
                "peak memory": human_bytes(row["peak_memory_bytes"]),
            }
            for row in rows
        ]
    )


def conversation_table(rows: list[dict]) -> pd.DataFrame:
    per_token = lambda r: f"{r['kv_bytes_per_token']:,.0f}" if r["kv_bytes_per_token"] else "–"  # noqa: E731
    return pd.DataFrame(
        [
            {
                "configuration": row["config"],
                "TTFT p50 ms, first turns": f"{row['ttft_first_turn_p50_ms']:.1f}",
                "TTFT p50 ms, later turns": f"{row['ttft_later_turns_p50_ms']:.1f}",
                "TPOT ms [95% CI]": interval(row, "tpot_ms", ".2f"),
                "prompt tokens from cache": "–" if row["prefix_hit_rate"] is None else f"{row['prefix_hit_rate']:.0%}",
                "KV bytes per token": per_token(row),
                "peak memory": human_bytes(row["peak_memory_bytes"]),
            }
            for row in rows
        ]
    )


def markdown(rows: list[dict]) -> str:
    shown = table(rows) if rows[0]["right"] else conversation_table(rows)
    return shown.to_markdown(index=False, disable_numparse=True, colalign=["left"] + ["right"] * (shown.shape[1] - 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=("dataset", "conversation"), default="dataset")
    parser.add_argument("--path", default="examples/questions.jsonl", help="the labelled file (--workload dataset)")
    parser.add_argument("--new-tokens", type=int, default=32, help="at most, per answer (each stops at its EOS)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds (greedy answers count once)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="default: outputs/benchmarks/engines[-conversation]")
    parser.add_argument("--table-only", action="store_true", help="the table again from --out's results.json")
    args = parser.parse_args()
    args.out = args.out or Path(
        "outputs/benchmarks/engines" + ("-conversation" if args.workload == "conversation" else "")
    )
    if args.table_only:
        print(markdown(json.loads((args.out / "results.json").read_text())))
        return
    asked = [f"workload={args.workload}"] + (
        [f"workload.path={args.path}"] if args.workload == "dataset" else ["workload.think_time_s=0.2"]
    )
    base = ["model=smollm2_135m", f"model.threads={args.threads}", *asked, f"workload.max_new_tokens={args.new_tokens}",
            f"workload.repeats={args.repeats}", "workload.warmup=1", "load=concurrency", "load.concurrency=1",
            "tracking=off"]  # fmt: skip
    rows = measure(base, CONFIGS)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(rows, indent=2))
    asked = (
        f"`{args.path}` ({len(rows[0]['right'])} questions), scorer contains"
        if args.workload == "dataset"
        else "the bundled conversations (4 sessions of 4 turns, 0.2 s of thinking between turns)"
    )
    header = (
        f"Model `smollm2_135m` (llama.cpp: its GGUF, Q4_1 weights; transformers: the same weights converted to "
        f"float32; vLLM: that conversion in bfloat16), {args.threads} thread(s), {asked}, at most {args.new_tokens} "
        f"new tokens, one request at a time; {args.repeats} interleaved rounds after 1 warm-up, call by call."
    )
    shown = markdown(rows)
    (args.out / "table.md").write_text(f"{header}\n\n{shown}\n\nservers:\n" + "\n".join(r["server"] for r in rows))
    print(f"{header}\n\n{shown}\n\nwritten: {args.out / 'table.md'}, {args.out / 'results.json'}")


if __name__ == "__main__":
    main()
