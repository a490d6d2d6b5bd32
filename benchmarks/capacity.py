"""How much traffic each cache carries within latency targets (`kvpipe capacity`), and what the search
saves against measuring the same rates as a grid.

Runs `python -m kvpipe capacity` on the embedded model for dynamic, paged and quanto int4
(`cache=quantized backend=quanto backend.nbits=4`) in a launch folder of its own (its own MLflow store,
so nothing is reused), then, with --grid, measures every rate the search visited for any cache, for
every cache, as one interleaved sweep in another fresh folder (the ceilings are the search's alone:
the grid is given the rates, which favours it). Prints the table `kvpipe capacity` prints, and the
wall time of both; writes results.json in --out.

    python benchmarks/capacity.py --grid                                   # embedded model (smollm2_135m), 2 threads
    python benchmarks/capacity.py --threads 1 --max-ttft-ms 5000 --max-tpot-ms 500 --grid
    python benchmarks/capacity.py --model tiny_random --requests 4 --max-tpot-ms 50
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CACHES = "cache=dynamic,paged,quantized"
QUANTO_INT4 = ["backend=quanto", "backend.nbits=4"]  # read by the quantized cache, ignored by the others


def kvpipe(args: list[str], launch: Path, threads: int) -> tuple[float, subprocess.CompletedProcess]:
    """`python -m kvpipe ARGS` in `launch` with `threads` OpenMP threads: (wall seconds, the process)."""
    launch.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "kvpipe", *args], cwd=launch, env=env, text=True, capture_output=True)
    return time.monotonic() - started, done


def search_arguments(name: str, threads: int, requests: int, resolution: float) -> argparse.ArgumentParser:
    """The options a capacity benchmark takes (the model, its threads, the latency targets, a point's
    requests, the resolution, where results go), with its own defaults."""
    parser = argparse.ArgumentParser(description=sys.modules["__main__"].__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default="smollm2_135m", help="a conf/model option: the embedded SmolLM2-135M-Instruct"
    )
    parser.add_argument("--threads", type=int, default=threads, help="OMP_NUM_THREADS and model.threads")
    parser.add_argument("--max-ttft-ms", type=float, default=2000)
    parser.add_argument("--max-tpot-ms", type=float, default=150)
    parser.add_argument("--requests", type=int, default=requests, help="requests per rate point")
    parser.add_argument("--resolution", type=float, default=resolution)
    parser.add_argument("--out", type=Path, default=Path("outputs/benchmarks") / name)
    return parser


def main() -> int:
    parser = search_arguments("capacity", threads=2, requests=8, resolution=0.2)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--grid", action="store_true", help="measure the visited rates as a grid too")
    args = parser.parse_args()

    fixed = [f"model={args.model}", f"model.threads={args.threads}", f"workload.max_new_tokens={args.new_tokens}",
             "workload.repeats=1", "quality=off", *QUANTO_INT4]  # fmt: skip
    targets = ["--max-ttft-ms", f"{args.max_ttft_ms:g}", "--max-tpot-ms", f"{args.max_tpot_ms:g}"]
    search = ["capacity", *fixed, CACHES, *targets, "--requests", str(args.requests),
              "--resolution", str(args.resolution)]  # fmt: skip
    print(f"search: kvpipe {' '.join(search)}", flush=True)
    search_s, done = kvpipe(search, args.out / "search", args.threads)
    print(done.stdout)
    if done.returncode not in (0, 1):
        print(done.stderr[-4000:], file=sys.stderr)
        return done.returncode
    (found_path,) = sorted((args.out / "search" / "outputs" / "capacity").glob("*/*/capacity.json"))[-1:]
    found = json.loads(found_path.read_text())
    rates = sorted({rate for cache in found["caches"] for rate in cache["rates"]})
    results = {"search_s": search_s, "search_jobs": found["jobs"], "caches": found["caches"], "rates": rates,
               "fixed": fixed, "targets": targets, "requests": args.requests}  # fmt: skip
    print(f"search: {found['jobs']} jobs ({len(found['caches'])} ceilings, then rates) in {search_s:.0f} s")
    if args.grid:
        grid = ["-m", *fixed, CACHES, "load=rate", f"load.rate={','.join(f'{r:g}' for r in rates)}",
                f"load.requests={args.requests}", f"load.max_ttft_ms={args.max_ttft_ms:g}",
                f"load.max_tpot_ms={args.max_tpot_ms:g}"]  # fmt: skip
        print(f"grid: kvpipe {' '.join(grid)}", flush=True)
        grid_s, done = kvpipe(grid, args.out / "grid", args.threads)
        jobs = 3 * len(rates)
        print(f"grid: {jobs} jobs ({len(rates)} rates x 3 caches) in {grid_s:.0f} s (exit {done.returncode}); "
              f"search/grid wall time {search_s / grid_s:.2f}")  # fmt: skip
        results.update(grid_s=grid_s, grid_jobs=jobs)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
