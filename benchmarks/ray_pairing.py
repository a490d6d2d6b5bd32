"""A sweep on a Ray cluster, each job paired on its node (pair_on_node), against the same sweep
interleaved in one process: does the Ray sweep's quantized/dynamic TPOT ratio agree with the
interleaved one, and what does it cost in wall time? Target: within 5% in every run.

A local Ray cluster is started for the run (`ray start --head` on loopback, two CPU slots) and stopped
afterwards; each Ray job asks for both slots (hydra.launcher.ray.remote.num_cpus=2), so jobs run one at
a time, each beside its copy of the baseline, as each would on a node of its own. Each sweep writes to
a throwaway folder and MLflow store of its own. Needs `make ray`.

    python benchmarks/ray_pairing.py                           # embedded model, default chat workload
    python benchmarks/ray_pairing.py --runs 1 model=tiny_random # extra overrides go to both sweeps
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the cluster helper tests/test_ray.py uses

from ray_cluster import ray_cluster  # noqa: E402

SWEEP = ["-m", "cache=dynamic,quantized", "quality=off", "model.threads=2"]
ON_RAY = ["hydra/launcher=ray_cluster", "hydra.launcher.ray.remote.num_cpus=2"]


def sweep(args: list[str], env: dict) -> tuple[float, object]:
    """(wall seconds, quantized's TPOT ratio against dynamic as compare reads it) of one sweep."""
    from kvpipe.decide import paired
    from kvpipe.decide.runs import load_runs

    folder = Path(tempfile.mkdtemp(prefix="kvpipe-ray-pairing-"))
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "kvpipe", *args], cwd=folder, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"kvpipe {' '.join(args)} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    runs = paired.with_ratios(load_runs("kvpipe", None, f"sqlite:///{folder}/outputs/mlflow.db")[0])
    (quantized,) = [ratio for label, ratio in zip(runs["label"], runs["ratio_tpot_ms"]) if label != "dynamic"]
    return wall, quantized


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    known, extra = parser.parse_known_args()
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    rows = []
    with ray_cluster(cpus=2) as address:
        env["RAY_ADDRESS"] = address
        for run in range(1, known.runs + 1):
            sides = [("interleaved", [*SWEEP, *extra]), ("ray", [*SWEEP, *ON_RAY, *extra])]
            if run % 2 == 0:  # alternate which goes first
                sides.reverse()
            measured = {name: sweep(args, env) for name, args in sides}
            (one_wall, one), (ray_wall, ray) = measured["interleaved"], measured["ray"]
            gap = abs(ray.value / one.value - 1)
            rows.append({"run": run, "interleaved": one.text(), "ray, paired on node": ray.text(),
                         "ray paired": ray.paired, "gap": f"{gap:.1%}", "within 5%": gap <= 0.05,
                         "interleaved s": round(one_wall, 1), "ray s": round(ray_wall, 1)})  # fmt: skip
            print(pd.DataFrame(rows[-1:]).to_string(index=False), flush=True)
    print()
    print(pd.DataFrame(rows).to_markdown(index=False))


if __name__ == "__main__":
    main()
