"""Many requests at once: continuous batching (cache=paged) against static batches of the dynamic and
a quantized cache, and against requests one at a time, at several concurrencies, in one process.

The requests are a dataset of chat prompts whose output lengths vary (seeded, between --min-new and
--max-new tokens): where static batches hold every row to the longest one, continuous batching lets
a short answer leave and the next request in. Reports, per cache and concurrency: output tok/s,
goodput (requests within --max-ttft-ms and --max-tpot-ms), p50/p90 TTFT and TPOT, the most in
flight, KV bytes, and where the time went (steps, and for static batches the padded and the
finished-but-held rows' share of the rows decoded). Then kvpipe's own cost on the paged path: the
same requests through kvpipe's server and through a bare `generate_batch`, alternated.

    OMP_NUM_THREADS=2 python benchmarks/serving.py                  # embedded model, 32 requests
    OMP_NUM_THREADS=2 python benchmarks/serving.py --model tiny_random --requests 8 --concurrency 1,4
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import pandas as pd

from kvpipe.job.runner import run_job
from kvpipe.jobspec import spec_from

PROMPTS = [
    "What is a KV cache?", "Explain in two sentences why the sky is blue.", "Write a haiku about memory.",
    "Give three tips for readable Python.", "What is the capital of France?", "Summarise what a compiler does.",
    "Name four planets.", "Why do leaves change colour in autumn?", "Describe a cat in one sentence.",
    "How does a hash map work?", "What is 17 times 23?", "Suggest a name for a bakery.",
    "What does HTTP stand for?", "Explain recursion to a child.", "List three uses of a paper clip.",
    "What is the boiling point of water?",
]  # fmt: skip
CACHES = {
    "paged": ["cache=paged"],
    "dynamic": ["cache=dynamic"],
    "quantized": ["cache=quantized", "backend=quanto", "backend.nbits=4", "axis=kivi"],
}


def dataset(path: Path, count: int, min_new: int, max_new: int, seed: int) -> Path:
    """count chat requests, each with its own max_new_tokens drawn from the seed."""
    draw = random.Random(seed)
    rows = [{"prompt": PROMPTS[i % len(PROMPTS)], "max_new_tokens": draw.randint(min_new, max_new)}
            for i in range(count)]  # fmt: skip
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def served(args, data: Path, cache: list[str], concurrency: int) -> dict:
    overrides = [
        f"model={args.model}", "workload=dataset", f"workload.path={data}", "quality=off", "tracking=off",
        "load=concurrency", f"load.concurrency={concurrency}", f"load.max_ttft_ms={args.max_ttft_ms}",
        f"load.max_tpot_ms={args.max_tpot_ms}", *cache,
    ]  # fmt: skip
    return run_job(spec_from(overrides)).metrics


def bare_span_s(args, data: Path) -> float:
    """The same requests, all at once, through transformers' manager with kvpipe's pool and settings,
    and nothing else: added together, their answers awaited, first add to last answer."""
    from kvpipe import model
    from kvpipe.job.servers import requests_of

    spec = spec_from(offline_overrides(args, data, CACHES["paged"]))
    loaded = model.load(spec.model)
    requests = spec.bound_load.requests(requests_of(spec.bound_workload.batches(loaded.tokenizer, "cpu"), 32))
    manager = spec.strategy.start_manager(loaded, max(len(r.ids) for r in requests),
                                          max(r.new_tokens for r in requests), len(requests))  # fmt: skip
    try:
        started = time.perf_counter()
        for index, request in enumerate(requests):
            manager.add_request(request.ids, request_id=f"r{index}", max_new_tokens=request.new_tokens)
        for _ in requests:
            while manager.get_result(timeout=1) is None:
                pass
        return time.perf_counter() - started
    finally:
        spec.strategy.stop_manager(manager)


def offline_overrides(args, data: Path, cache: list[str]) -> list[str]:
    return [f"model={args.model}", "workload=dataset", f"workload.path={data}", "quality=off", "tracking=off",
            "workload.warmup=0", "load=offline", *cache]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2_135m")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--min-new", type=int, default=8)
    parser.add_argument("--max-new", type=int, default=96)
    parser.add_argument("--max-ttft-ms", type=float, default=2000.0)
    parser.add_argument("--max-tpot-ms", type=float, default=200.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overhead-rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("outputs/benchmarks/serving"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    data = dataset(Path(tempfile.mkdtemp()) / "requests.jsonl", args.requests, args.min_new, args.max_new, args.seed)
    rows = []
    for concurrency in [int(c) for c in args.concurrency.split(",")]:
        for label, cache in CACHES.items():
            figures = served(args, data, cache, concurrency)
            rows.append({
                "cache": label, "concurrency": concurrency,
                "output tok/s": round(figures["output_tokens_per_s"], 1),
                "goodput req/s": round(figures.get("goodput_requests_per_s", float("nan")), 3),
                "TTFT p50 ms": round(figures["ttft_p50_ms"]), "TTFT p90 ms": round(figures["ttft_p90_ms"]),
                "TPOT p50 ms": round(figures["tpot_p50_ms"], 1), "TPOT p90 ms": round(figures["tpot_p90_ms"], 1),
                "most in flight": int(figures["max_in_flight"]), "KV MiB": round(figures["kv_cache_bytes"] / 2**20, 2),
            })  # fmt: skip
            print(rows[-1], flush=True)
    table = pd.DataFrame(rows)
    ours, bare = [], []
    for _ in range(args.overhead_rounds):  # alternated, so a drifting machine moves both alike
        ours.append(run_job(spec_from(offline_overrides(args, data, CACHES["paged"]))).metrics["serve_span_ms"] / 1e3)
        bare.append(bare_span_s(args, data))
    ratio = statistics.median(b / o for b, o in zip(bare, ours))
    text = table.to_markdown(index=False) + (
        f"\n\nkvpipe's paged server (load=offline) against transformers' manager alone, the same {args.requests} "
        f"requests all at once, alternated over {args.overhead_rounds} rounds: throughput ratio kvpipe / bare "
        f"{ratio:.2f} (bare s: {', '.join(f'{s:.2f}' for s in bare)}; kvpipe s: {', '.join(f'{s:.2f}' for s in ours)})\n"
    )
    (args.out / "serving.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
