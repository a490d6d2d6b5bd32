"""Does searching pay? The exhaustive grid and the search (hydra/sweeper=search) on one space and model.

Both run as `python -m kvpipe -m hydra/sweeper=search ...` in launch folders of their own (own MLflow
store, own Optuna study, so the search reuses nothing of the grid): the grid with a trial budget that
covers the space (every point measured), the search with 40% of it. The quality references are shared
(they depend on the model and workload, not the cache). Reported: the jobs each measured, the grid's
Pareto front (KV cache bytes on CPU, TPOT, KL; within the default KL limit), how many of its points the
search measured, and the hypervolume ratio. Both fronts are scored with the grid's measurements, so a
configuration counts the same in both and timing noise between the two runs does not move the ratio;
axes are normalised to the grid's range and the reference point is 1.1 on each. Goal: at least 0.95
of the front's hypervolume with at most 40% of the grid's jobs.

    python benchmarks/search_vs_grid.py                            # embedded model, reduced space (~25 min, 2 cores)
    python benchmarks/search_vs_grid.py --share 0.3 -- model=tiny_random
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from kvpipe.decide.runs import non_dominated
from kvpipe.measure import references
from kvpipe.model.embedded import embedded_folder
from kvpipe.record.result import iter_results
from kvpipe.search import objectives
from kvpipe.search.space import build

# The reduced space: dense caches, and quanto and hqq at 2 and 4 bits, two layouts, two residuals
SPACE = [
    "cache=dynamic,static,quantized", "backend=quanto,hqq", "backend.nbits=2,4", "axis=kivi,per_token",
    "backend.q_group_size=64", "backend.residual_length=0,128",
]  # fmt: skip
WORKLOAD = ["workload.repeats=2", "workload.max_new_tokens=32"]


def run_search(launch: Path, env: dict, trials: int, overrides: list[str]) -> tuple[float, dict[str, pd.Series]]:
    """(wall seconds, each measured point's run as compare sees it, by its overrides)."""
    launch.mkdir(parents=True)
    started = time.perf_counter()
    command = [
        sys.executable,
        "-m",
        "kvpipe",
        "-m",
        "hydra/sweeper=search",
        f"hydra.sweeper.trials={trials}",
        *overrides,
    ]
    proc = subprocess.run(command, cwd=launch, env=env, capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        sys.exit(f"{' '.join(command)} failed:\n{proc.stderr[-3000:]}")
    wall = time.perf_counter() - started
    measured = {}
    for _, result in iter_results(launch / "outputs" / "multiruns", recursive=True):
        if result.status == "FINISHED":
            point = " ".join(o for o in result.overrides if o.split("=")[0] in POINT_KEYS)
            tags = {f"kvpipe.{k}": v for k, v in result.tags.items()}
            measured[point] = objectives.row(result.metrics, result.params, tags)
    return wall, measured


POINT_KEYS = ("cache", "backend", "backend.nbits", "axis", "backend.q_group_size", "backend.residual_length",
              "cache.compile")  # fmt: skip


def front(points: dict[str, np.ndarray]) -> list[str]:
    return [k for k, kept in zip(points, non_dominated(list(points.values()))) if kept]


def hypervolume(points: list[np.ndarray], low: np.ndarray, high: np.ndarray) -> float:
    from optuna._hypervolume import compute_hypervolume  # Optuna's WFG implementation

    scaled = np.array([(p - low) / np.where(high > low, high - low, 1.0) for p in points])
    return float(compute_hypervolume(scaled, np.full(scaled.shape[1], 1.1)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--share", type=float, default=0.4, help="the search's trial budget, a share of the grid")
    parser.add_argument("--out", type=Path, default=Path("outputs/benchmarks/search_vs_grid"))
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every job (default: the embedded model)")
    args = parser.parse_args()
    embedded_folder()
    overrides = [*SPACE, *WORKLOAD, *args.overrides]
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        env = {**os.environ, references.FOLDER_ENV: str(scratch / "references")}
        grid_size = _space_size(overrides)
        trials = max(1, math.floor(args.share * grid_size))
        print(f"space: {grid_size} configurations; the search may measure {trials}", flush=True)
        grid_s, grid = run_search(scratch / "grid", env, grid_size, overrides)
        print(f"grid: {len(grid)} jobs in {grid_s:.0f} s", flush=True)
        search_s, found = run_search(scratch / "search", env, trials, overrides)
        print(f"search: {len(found)} jobs in {search_s:.0f} s", flush=True)
    device = "cpu"
    feasible = {k: np.array(objectives.values(r, device)) for k, r in grid.items() if r["quality_loss"] <= 0.05}
    grid_front = front(feasible)
    searched = {k: v for k, v in feasible.items() if k in found}  # the search's points, as the grid measured them
    search_front = front(searched)
    values = np.array(list(feasible.values()))
    low, high = values.min(axis=0), values.max(axis=0)
    ratio = hypervolume([searched[k] for k in search_front], low, high) / hypervolume(
        [feasible[k] for k in grid_front], low, high
    ) if search_front else 0.0  # fmt: skip
    result = {
        "overrides": overrides,
        "space": grid_size,
        "grid_jobs": len(grid),
        "grid_s": grid_s,
        "search_jobs": len(found),
        "search_s": search_s,
        "job_share": len(found) / len(grid),
        "grid_front": grid_front,
        "front_points_found": sorted(set(grid_front) & set(found)),
        "hypervolume_ratio": ratio,
    }
    table = pd.DataFrame(
        {
            "": ["exhaustive grid", "search (NSGA-II)"],
            "jobs": [str(len(grid)), f"{len(found)} ({len(found) / len(grid):.0%})"],
            "wall": [f"{grid_s / 60:.1f} min", f"{search_s / 60:.1f} min"],
            "Pareto points": [str(len(grid_front)), f"{len(result['front_points_found'])} of {len(grid_front)}"],
            "hypervolume": ["1.00", f"{ratio:.2f}"],
        }
    ).to_markdown(index=False, disable_numparse=True, colalign=["left", "right", "right", "right", "right"])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "table.md").write_text(table + "\n")
    print(table)


def _space_size(overrides: list[str]) -> int:
    from kvpipe import model
    from kvpipe.config import compose
    from kvpipe.search.search import split_arguments
    from kvpipe.spec import make_spec

    fixed, restrict = split_arguments(overrides)
    spec = make_spec(compose(fixed), fixed)
    return len(build(model.describe(spec.model).head_dim, "cpu", restrict).points)


if __name__ == "__main__":
    main()
