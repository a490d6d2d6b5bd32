"""Does kvpipe disturb what it measures? kvpipe's measured generation (A) against a bare
model.generate (B), same model, cache and prompt, in one process, alternating A B A B.

B has no per-token hook, so its decode rate comes from two bare calls of N and N/2 new tokens:
(N - N/2) / (e2e(N) - e2e(N/2)), which cancels prefill and per-call costs; A's rate is taken over
the same tokens (N/2 to N) from its own per-token timestamps. The target ratio A/B is >= 0.97.

    python benchmarks/overhead.py                       # embedded model: dynamic, static, static+compile
    python benchmarks/overhead.py --model tiny_random --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import pandas as pd

from kvpipe import model
from kvpipe.job.generate import measured_generate
from kvpipe.jobspec import compose, make_spec

STRATEGIES = {
    "dynamic": ["cache=dynamic"],
    "static": ["cache=static"],
    "static+compile": ["cache=static", "cache.compile=true"],
}


def bare_e2e_s(loaded, setup, batch, new_tokens: int) -> float:
    import torch

    cache = setup.make_cache()
    started = time.perf_counter()
    with torch.inference_mode():
        loaded.model.generate(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            cache=cache,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=loaded.tokenizer.pad_token_id,
            **setup.generate_kwargs,
        )
    if loaded.device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started


def compare(label: str, spec, rounds: int) -> dict:
    loaded = model.load(spec.model)
    batch = spec.bound_workload.batches(model.load_tokenizer(spec.model), loaded.device)[0]
    setup = spec.strategy.setup(loaded, batch.prompt_tokens)
    new = spec.workload.max_new_tokens
    for _ in range(2):  # warm-up both paths (and compile, for static+compile)
        measured_generate(spec, loaded, setup, batch)
        bare_e2e_s(loaded, setup, batch, new)
    half = new // 2
    kvpipe_tps, bare_tps, kvpipe_e2e, bare_e2e = [], [], [], []
    for round_index in range(rounds):
        # A B and B A on alternate rounds, so slow drift of the machine hits both sides alike
        for side in "AB" if round_index % 2 == 0 else "BA":
            if side == "A":
                call = measured_generate(spec, loaded, setup, batch)
                kvpipe_tps.append((new - half) / (sum(call.timing.itl_ms[half - 1 :]) / 1e3))
                kvpipe_e2e.append(call.timing.e2e_ms / 1e3)
            else:
                full, part = bare_e2e_s(loaded, setup, batch, new), bare_e2e_s(loaded, setup, batch, half)
                bare_tps.append((new - half) / (full - part))
                bare_e2e.append(full)
    row = {
        "strategy": label,
        "kvpipe_decode_tokens_per_s": statistics.median(kvpipe_tps),
        "bare_decode_tokens_per_s": statistics.median(bare_tps),
    }
    row["ratio"] = row["kvpipe_decode_tokens_per_s"] / row["bare_decode_tokens_per_s"]
    # The same whole call with and without kvpipe's hooks: no estimation method in between.
    row["e2e_ratio"] = statistics.median(bare_e2e) / statistics.median(kvpipe_e2e)
    print(
        f"{label:16s} kvpipe {row['kvpipe_decode_tokens_per_s']:.2f} tok/s  bare "
        f"{row['bare_decode_tokens_per_s']:.2f} tok/s  ratio {row['ratio']:.3f}  e2e ratio {row['e2e_ratio']:.3f}",
        flush=True,
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2_135m")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--only", nargs="*", choices=list(STRATEGIES))
    parser.add_argument("--out", type=Path, default=Path("outputs/benchmarks/overhead"))
    args = parser.parse_args()
    base = [
        f"model={args.model}",
        f"workload.max_new_tokens={args.new_tokens}",
        "workload.warmup=1",
        "workload.repeats=3",
        "tracking=off",
        "quality=off",
        "workload.prompts=[Tell me about the history of Rome.]",
    ]
    # Compose every spec before measuring anything: an edit to conf/ mid-run cannot break the run.
    specs = {
        label: make_spec(compose(base + overrides))
        for label, overrides in STRATEGIES.items()
        if not args.only or label in args.only
    }
    rows = [compare(label, spec, args.rounds) for label, spec in specs.items()]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(rows, indent=2))
    # Cells formatted as text first: to_markdown would otherwise reformat the numbers.
    table = pd.DataFrame(
        [
            {
                "strategy": r["strategy"],
                "kvpipe decode tok/s": f"{r['kvpipe_decode_tokens_per_s']:.2f}",
                "bare generate tok/s": f"{r['bare_decode_tokens_per_s']:.2f}",
                "decode ratio": f"{r['ratio']:.3f}",
                "e2e ratio (bare/kvpipe time)": f"{r['e2e_ratio']:.3f}",
            }
            for r in rows
        ],
        columns=[
            "strategy",
            "kvpipe decode tok/s",
            "bare generate tok/s",
            "decode ratio",
            "e2e ratio (bare/kvpipe time)",
        ],
    )
    markdown = table.to_markdown(index=False, disable_numparse=True, colalign=["left"] + ["right"] * 4)
    (args.out / "table.md").write_text(markdown + "\n")
    print(markdown)


if __name__ == "__main__":
    main()
