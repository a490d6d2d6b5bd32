"""The time to an answer, as a user pays it, each command in its own process.

The default job (`python -m kvpipe`, as `make run` starts it) twice: a first run, which makes the
quality references, and a second run, which finds them on disk. Per run: the process's wall time,
its timed generation (warm-up plus measured calls), the quality pass, `harness_ms` (the job's own cost
less those) and the load; and the ratio of wall time to timed generation, whose goal is at most 2x on
the second run.

With --sweep, one sweep instead (by default three strategies on a short long_context job, quality
off), twice: the same figures summed over its jobs, and the ratio of the sweep's wall time to their
timed generation, whose goal is at most 1.3x. The first sweep in a new folder also makes its MLflow
store (MLflow's schema migrations, seconds of CPU); the second, like every later one, finds it.

    python benchmarks/time_to_answer.py                      # the default job, twice
    python benchmarks/time_to_answer.py -- cache=static      # overrides after --
    python benchmarks/time_to_answer.py --sweep              # the sweep (overrides after -- replace it)

Both commands run in one new launch folder, as a user's two commands would: the first makes the MLflow
store in it, the second finds it. The references are kept in a folder of their own
($KVPIPE_REFERENCE_DIR), so the first run really makes them; nothing of the user's cache is removed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from kvpipe import disk_cache
from kvpipe.model.embedded import embedded_folder

SWEEP = [
    "-m", "cache=dynamic,static,offloaded", "workload=long_context", "workload.prompt_tokens=16",
    "workload.max_new_tokens=50", "workload.repeats=2", "quality=off", "model.dtype=float32",
]  # fmt: skip
COLUMNS = {
    "wall_ms": "wall s",
    "timed_generation_ms": "timed generation s",
    "quality_ms": "quality s",
    "harness_ms": "harness s",
    "load_ms": "load s (once)",
    "outside_jobs_ms": "outside the jobs s",
}


def timed_command(launch: Path, env: dict, overrides: list[str]) -> dict:
    """Run kvpipe once in `launch`; its wall time and the figures summed over the jobs it ran."""

    def results() -> set[Path]:  # not the copies logged as artifacts
        return {*launch.glob("outputs/runs/*/*/result.json"), *launch.glob("outputs/multiruns/*/*/*/result.json")}

    earlier = results()
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "kvpipe", *overrides], cwd=launch, env=env, check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    wall_ms = (time.perf_counter() - started) * 1e3
    jobs = [json.loads(p.read_text())["metrics"] for p in sorted(results() - earlier)]
    if not jobs:
        sys.exit(f"kvpipe {' '.join(overrides)} wrote no result.json under {launch}/outputs")
    total = {
        key: sum(m.get(key, 0.0) for m in jobs) for key in ("warmup_ms", "measured_ms", "quality_ms", "harness_ms")
    }
    # every job reports its model's load time, which a process pays once (later jobs reuse the model)
    total["load_ms"] = max(m.get("load_ms", 0.0) for m in jobs)
    generation = total["warmup_ms"] + total["measured_ms"]
    return {
        "jobs": len(jobs),
        "wall_ms": wall_ms,
        "timed_generation_ms": generation,
        "quality_ms": total["quality_ms"],
        "harness_ms": total["harness_ms"],
        "load_ms": total["load_ms"],
        # Imports, Hydra, the bandwidth probe, MLflow logging and the closing compare: outside every job
        "outside_jobs_ms": wall_ms - generation - total["quality_ms"] - total["harness_ms"],
        "ratio": wall_ms / generation,
    }


def markdown(runs: dict[str, dict]) -> str:
    table = pd.DataFrame(
        {
            "command": list(runs),
            "jobs": [str(r["jobs"]) for r in runs.values()],
            **{title: [f"{r[key] / 1e3:.1f}" for r in runs.values()] for key, title in COLUMNS.items()},
            "wall / generation": [f"{r['ratio']:.2f}x" for r in runs.values()],
        }
    )
    return table.to_markdown(index=False, disable_numparse=True, colalign=["left"] + ["right"] * (table.shape[1] - 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("outputs/benchmarks/time_to_answer"))
    parser.add_argument(
        "--sweep", action="store_true", help="time one sweep (three strategies, or the overrides given)"
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for the job")
    args = parser.parse_args()
    embedded_folder()  # converted once, before anything is timed
    if args.sweep:
        commands = {"first sweep": args.overrides or SWEEP, "second sweep": args.overrides or SWEEP}
    else:
        commands = {"first run": args.overrides, "second run": args.overrides}
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        env = {**os.environ, disk_cache.FOLDER_ENV: str(scratch / "references")}
        runs = {}
        launch = scratch / "launch"
        launch.mkdir()
        for name, overrides in commands.items():
            runs[name] = timed_command(launch, env, overrides)
            print(f"{name} (kvpipe {' '.join(overrides)}): " + ", ".join(
                f"{k} {v:,.0f}" if k != "ratio" else f"{k} {v:.2f}x" for k, v in runs[name].items()), flush=True)  # fmt: skip
    out = args.out / ("sweep" if args.sweep else "default_job")
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(runs, indent=2) + "\n")
    table = markdown(runs)
    (out / "table.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
