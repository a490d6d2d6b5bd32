"""The time to an answer: the default job (`python -m kvpipe`, as `make run` starts it) as a user runs
it, twice, each in its own process: a first run, which makes the quality references, and a second run,
which finds them on disk. Per run: the process's wall time, its timed generation (warm-up plus
measured calls), the quality pass, `harness_ms` (the job's own cost less those) and the load; and the
ratio of wall time to timed generation, whose goal is at most 2x on the second run.

    python benchmarks/time_to_answer.py                      # the default job
    python benchmarks/time_to_answer.py -- cache=static      # overrides after --

Each run has its own launch folder and MLflow store. The references are kept in a folder of their
own ($KVPIPE_REFERENCE_DIR), so the first run really makes them; nothing of the user's cache is removed.
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

from kvpipe.measure import references
from kvpipe.model.embedded import embedded_folder


def one_run(launch: Path, env: dict, overrides: list[str]) -> dict:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "kvpipe", *overrides], cwd=launch, env=env, check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    wall_ms = (time.perf_counter() - started) * 1e3
    (result,) = sorted(launch.glob("outputs/runs/*/*/result.json"))
    metrics = json.loads(result.read_text())["metrics"]
    generation = metrics["warmup_ms"] + metrics["measured_ms"]
    return {
        "wall_ms": wall_ms,
        "timed_generation_ms": generation,
        "quality_ms": metrics.get("quality_ms", 0.0),
        "harness_ms": metrics["harness_ms"],
        "load_ms": metrics["load_ms"],
        "outside_job_ms": wall_ms - generation - metrics.get("quality_ms", 0.0) - metrics["harness_ms"],
        "ratio": wall_ms / generation,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("outputs/benchmarks/time_to_answer"))
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for the job")
    args = parser.parse_args()
    embedded_folder()  # converted once, before anything is timed
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        env = {**os.environ, references.FOLDER_ENV: str(scratch / "references")}
        runs = {}
        for name in ("first run", "second run"):
            launch = scratch / name.replace(" ", "_")
            launch.mkdir()
            runs[name] = one_run(launch, env, args.overrides)
            print(f"{name}: " + ", ".join(f"{k} {v:,.0f}" if k != "ratio" else f"{k} {v:.2f}x"
                                           for k, v in runs[name].items()), flush=True)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(runs, indent=2) + "\n")
    rows = ["| run | wall s | timed generation s | quality s | harness s | outside the job s | wall / generation |",
            "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for name, run in runs.items():
        rows.append(
            f"| {name} | {run['wall_ms'] / 1e3:.1f} | {run['timed_generation_ms'] / 1e3:.1f} | "
            f"{run['quality_ms'] / 1e3:.1f} | {run['harness_ms'] / 1e3:.1f} | {run['outside_job_ms'] / 1e3:.1f} | "
            f"{run['ratio']:.2f}x |"
        )
    table = "\n".join(rows)
    (args.out / "table.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
