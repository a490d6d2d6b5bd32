"""The cache_shootout preset as one sweep against the same jobs as separate processes.

A sweep imports torch, transformers and MLflow, loads the model and compiles graphs once; separate
processes pay for them every time. The quality references are kept on disk (kvpipe.disk_cache),
so the first separate process makes them and the rest read them, as the sweep's first job makes them
and its later jobs reuse them: each side starts with a reference folder of its own, empty, so that
neither finds the other's. Both write to their own throwaway MLflow store. Target: >= 1.5x.

    python benchmarks/sweep_vs_processes.py                      # embedded model, default workload
    python benchmarks/sweep_vs_processes.py model=tiny_random    # extra overrides go to every job
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvpipe import disk_cache
from kvpipe.jobspec import compose

PRESET = "cache_shootout"


def timed(args: list[str], cwd: Path) -> float:
    env = {**os.environ, disk_cache.FOLDER_ENV: str(cwd / "references")}  # this side's own, made empty
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "kvpipe", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"kvpipe {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return time.perf_counter() - started


def main() -> None:
    extra = sys.argv[1:]
    caches = str(compose([f"+experiment={PRESET}"], with_hydra=True).hydra.sweeper.params.cache).split(",")
    with tempfile.TemporaryDirectory() as scratch:
        sweep_dir, single_dir = Path(scratch, "sweep"), Path(scratch, "single")
        sweep_dir.mkdir(), single_dir.mkdir()
        sweep_s = timed([f"+experiment={PRESET}", "-m", *extra], sweep_dir)
        print(f"one sweep of {len(caches)} jobs: {sweep_s:.1f} s", flush=True)
        single_s = []
        for cache in caches:
            single_s.append(timed([f"cache={cache}", *extra], single_dir))
            print(f"  separate process cache={cache}: {single_s[-1]:.1f} s", flush=True)
    result = {
        "jobs": caches,
        "overrides": extra,
        "sweep_s": sweep_s,
        "separate_processes_s": sum(single_s),
        "per_process_s": dict(zip(caches, single_s, strict=True)),
        "speedup": sum(single_s) / sweep_s,
    }
    print(f"separate processes: {sum(single_s):.1f} s · sweep: {sweep_s:.1f} s · speed-up {result['speedup']:.2f}x")
    out = Path("outputs/benchmarks/sweep_vs_processes")
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
