"""Is the noise flag right? The default job, N times on the idle machine and N times beside busy
processes (--hogs spinning processes, default 1), in one process: TPOT, the noise figure, whether each run
was flagged noisy or contended, and how many cores other processes held.

    python benchmarks/noise_and_contention.py                 # 5 + 5 default jobs, quality off
    python benchmarks/noise_and_contention.py --jobs 3 -- workload=long_context

The quality pass is off (it times nothing); everything else is the default job's.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time
from pathlib import Path

from kvpipe.job.runner import run_job
from kvpipe.jobspec import compose, make_spec
from kvpipe.measure import contention


def spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def one(spec, label: str = "") -> dict:
    result = run_job(spec)
    m, t = result.metrics, result.tags
    print(f"{label} TPOT {m['tpot_ms']:.1f} ms, noise {m['timing_noise_cv']:.3f}, noisy {t['noisy']}, "
          f"contended {t['contended']}, others {m.get('other_cpu_cores', float('nan')):.2f}", flush=True)  # fmt: skip
    return {
        "tpot_ms": m["tpot_ms"],
        "timing_noise_cv": m["timing_noise_cv"],
        "noisy": t["noisy"] == "true",
        "contended": t["contended"] == "true",
        "other_cpu_cores": m.get("other_cpu_cores"),
        "job_cpu_cores": m.get("job_cpu_cores"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=5)
    parser.add_argument("--hogs", type=int, default=1, help="spinning processes beside the contended jobs")
    parser.add_argument("--out", type=Path, default=Path("outputs/benchmarks/noise_and_contention"))
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    spec = make_spec(compose(["tracking=off", "quality=off", *args.overrides]))
    one(spec)  # load the model, convert nothing later: every counted job starts alike
    rows = {"idle": [one(spec, f"idle {i + 1}") for i in range(args.jobs)], "contended": []}
    for _ in range(args.jobs):
        hogs = [
            multiprocessing.get_context("spawn").Process(target=spin, args=(600,)) for _ in range(contention.cores())
        ]
        for hog in hogs:
            hog.start()
        try:
            time.sleep(1.0)
            rows["contended"].append(one(spec, f"contended {len(rows['contended']) + 1}"))
        finally:
            for hog in hogs:
                hog.terminate()
                hog.join()
        time.sleep(2.0)  # the load average settles a little before the next
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(rows, indent=2) + "\n")
    lines = ["| machine | job | TPOT ms | timing_noise_cv | other processes' cores | job's cores | noisy | contended |",
             "|---|---:|---:|---:|---:|---:|---|---|"]  # fmt: skip
    for machine, runs in rows.items():
        for index, run in enumerate(runs, 1):
            lines.append(
                f"| {machine} | {index} | {run['tpot_ms']:.1f} | {run['timing_noise_cv']:.3f} | "
                f"{run['other_cpu_cores']:.2f} | {run['job_cpu_cores']:.2f} | {run['noisy']} | {run['contended']} |"
            )
    flagged = {machine: sum(run["noisy"] for run in runs) for machine, runs in rows.items()}
    lines.append("")
    lines.append(
        f"flagged noisy: idle {flagged['idle']} of {args.jobs}, contended {flagged['contended']} of {args.jobs}"
    )
    table = "\n".join(lines)
    (args.out / "table.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
