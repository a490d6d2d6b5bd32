"""Does searching pay? The exhaustive grid and the search (hydra/sweeper=search) on one space and model.

All run as `python -m kvpipe -m hydra/sweeper=search ...` in launch folders of their own (own MLflow
store, own Optuna study, so a search reuses nothing of the grid): the grid with a trial budget that
covers the space (every point measured), then one search per sampler (the frontier walk, NSGA-II)
with 40% of it. The quality references are shared
(they depend on the model and workload, not the cache). Reported: the jobs each measured, the grid's
Pareto front (KV cache bytes on CPU, TPOT, KL; within the default KL limit), how many of its points the
search measured, and the hypervolume ratio. Both fronts are scored with the grid's measurements, so a
configuration counts the same in both and timing noise between the two runs does not move the ratio;
axes are normalised to the grid's range and the reference point is 1.1 on each. Goal: at least 0.95
of the front's hypervolume with at most 40% of the grid's jobs.

    python benchmarks/search_vs_grid.py                            # embedded model, reduced space (~50 min, 2 cores)
    python benchmarks/search_vs_grid.py --reuse-grid --samplers frontier   # one search again, same grid
    python benchmarks/search_vs_grid.py --reuse-grid --replay-only         # each sampler replayed: seconds
    python benchmarks/search_vs_grid.py --share 0.3 -- model=tiny_random

The launch folders (records, studies, references) are kept in --out/grid and --out/search-SAMPLER;
every point's figures go in results.json. --reuse-grid measures the searches only and scores them
against the grid measured before (same overrides required). --replay runs each sampler's search as
it runs, each trial told the grid's record of its point instead of a new job: which points the
sampler would measure, for work on the search itself; its rows are marked "replayed".
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from kvpipe.decide.runs import non_dominated
from kvpipe.measure import references
from kvpipe.model.embedded import embedded_folder
from kvpipe.orchestrate.search import objectives
from kvpipe.orchestrate.search.frontier import hypervolume
from kvpipe.orchestrate.search.space import build
from kvpipe.record.result import iter_results

# The reduced space: dense caches, and quanto and hqq at 2 and 4 bits, two layouts, two residuals
SPACE = [
    "cache=dynamic,static,quantized", "backend=quanto,hqq", "backend.nbits=2,4", "axis=kivi,per_token",
    "backend.q_group_size=64", "backend.residual_length=0,128",
]  # fmt: skip
WORKLOAD = ["workload.repeats=2", "workload.max_new_tokens=32"]


def run_search(
    launch: Path, env: dict, trials: int, overrides: list[str], settings: list[str] = ()
) -> tuple[float, dict[str, pd.Series]]:
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
        *settings,
        *overrides,
    ]
    proc = subprocess.run(command, cwd=launch, env=env, capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        sys.exit(f"{' '.join(command)} failed:\n{proc.stderr[-3000:]}")
    return time.perf_counter() - started, _measured(launch)


def _measured(launch: Path) -> dict[str, pd.Series]:
    measured = {}
    for _, result in _finished(launch):
        tags = {f"kvpipe.{k}": v for k, v in result.tags.items()}
        measured[_label(result.overrides)] = objectives.row(result.metrics, result.params, tags)
    return measured


def _run_dirs(launch: Path) -> dict[str, Path]:
    return {_label(result.overrides): path.parent for path, result in _finished(launch)}


def _finished(launch: Path):
    for path, result in iter_results(launch / "outputs" / "multiruns", recursive=True):
        if result.status == "FINISHED":
            yield path, result


def _label(overrides: list[str]) -> str:
    return " ".join(o for o in overrides if o.split("=")[0] in POINT_KEYS)


POINT_KEYS = ("cache", "backend", "backend.nbits", "axis", "backend.q_group_size", "backend.residual_length",
              "cache.compile")  # fmt: skip


def front(points: dict[str, np.ndarray]) -> list[str]:
    return [k for k, kept in zip(points, non_dominated(list(points.values()))) if kept]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--share", type=float, default=0.4, help="the search's trial budget, a share of the grid")
    parser.add_argument("--samplers", default="frontier,nsga2", help="the searches to run (hydra.sweeper.sampler)")
    parser.add_argument("--replay", action="store_true", help="also replay each sampler on the grid's records")
    parser.add_argument("--replay-only", action="store_true", help="replay each sampler; run no search")
    parser.add_argument("--out", type=Path, default=Path("outputs/benchmarks/search_vs_grid"))
    parser.add_argument("--reuse-grid", action="store_true", help="keep the grid measured in --out before")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every job (default: the embedded model)")
    args = parser.parse_args()
    embedded_folder()
    overrides = [*SPACE, *WORKLOAD, *args.overrides]
    env = {**os.environ, references.FOLDER_ENV: str((args.out / "references").resolve())}
    grid_size = _space_size(overrides)
    trials = max(1, math.floor(args.share * grid_size))
    samplers = [s for s in args.samplers.split(",") if s]
    print(f"space: {grid_size} configurations; each search may measure {trials}", flush=True)
    if args.reuse_grid:
        grid_s, grid = _kept_grid(args.out, overrides)
        print(f"grid: {len(grid)} jobs kept from {args.out / 'grid'} ({grid_s:.0f} s when measured)", flush=True)
    else:
        shutil.rmtree(args.out / "grid", ignore_errors=True)
        grid_s, grid = run_search(args.out / "grid", env, grid_size, overrides)
        (args.out / "grid" / "grid.json").write_text(json.dumps({"overrides": overrides, "grid_s": grid_s}) + "\n")
        print(f"grid: {len(grid)} jobs in {grid_s:.0f} s", flush=True)
    scorer = Scorer(grid)
    rows = [("exhaustive grid", len(grid), f"{grid_s / 60:.1f} min", *scorer.score(grid))]
    result = {"overrides": overrides, "space": grid_size, "grid_jobs": len(grid), "grid_s": grid_s,
              "grid_front": scorer.front_points, "searches": {}}  # fmt: skip
    for sampler in samplers:
        for replayed in (True,) if args.replay_only else (False, True) if args.replay else (False,):
            if replayed:
                wall, found = None, replay(args.out / f"replay-{sampler}", sampler, trials, overrides)
            else:
                shutil.rmtree(args.out / f"search-{sampler}", ignore_errors=True)
                wall, found = run_search(
                    args.out / f"search-{sampler}", env, trials, overrides, [f"hydra.sweeper.sampler={sampler}"]
                )
            found_points, ratio = scorer.score(found)
            name = f"search ({SAMPLER_NAMES.get(sampler, sampler)}{', replayed' if replayed else ''})"
            print(
                f"{name}: {len(found)} jobs" + (f" in {wall:.0f} s" if wall else "") + f", hypervolume {ratio:.2f}",
                flush=True,
            )
            rows.append((name, len(found), "" if wall is None else f"{wall / 60:.1f} min", found_points, ratio))
            result["searches"][name] = {"jobs": len(found), "wall_s": wall, "points": sorted(found),
                                        "front_points_found": sorted(set(scorer.front_points) & set(found)),
                                        "hypervolume_ratio": ratio}  # fmt: skip
    result["grid_points"] = {k: objectives.values(r, "cpu") for k, r in grid.items()}
    total = len(scorer.front_points)
    table = pd.DataFrame(
        {
            "": [r[0] for r in rows],
            "jobs": [str(r[1]) if i == 0 else f"{r[1]} ({r[1] / len(grid):.0%})" for i, r in enumerate(rows)],
            "wall": [r[2] for r in rows],
            "Pareto points": [f"{r[3]} of {total}" for r in rows],
            "hypervolume": [f"{r[4]:.2f}" for r in rows],
        }
    ).to_markdown(index=False, disable_numparse=True, colalign=["left", "right", "right", "right", "right"])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "table.md").write_text(table + "\n")
    print(table)


SAMPLER_NAMES = {"frontier": "frontier walk", "nsga2": "NSGA-II"}


class Scorer:
    """Scores a set of measured points against the grid: the grid's Pareto points it holds, and the
    hypervolume of its front over the grid's, both with the grid's figures."""

    def __init__(self, grid: dict[str, pd.Series]) -> None:
        self.feasible = {k: np.array(objectives.values(r, "cpu")) for k, r in grid.items() if r["quality_loss"] <= 0.05}
        self.front_points = front(self.feasible)
        values = np.array(list(self.feasible.values()))
        self.low, self.high = values.min(axis=0), values.max(axis=0)
        self.whole = hypervolume([self.feasible[k] for k in self.front_points], self.low, self.high)

    def score(self, found) -> tuple[int, float]:
        searched = {k: v for k, v in self.feasible.items() if k in found}
        if not searched:
            return 0, 0.0
        volume = hypervolume([searched[k] for k in front(searched)], self.low, self.high)
        return len(set(self.front_points) & set(found)), volume / self.whole


def replay(folder: Path, sampler: str, trials: int, overrides: list[str]) -> list[str]:
    """The search as it runs, each trial told the grid's record of its point instead of a new job:
    what the sampler would measure, in seconds, not minutes."""
    from types import SimpleNamespace

    from kvpipe.orchestrate.search.sweeper import SearchSettings
    from kvpipe.orchestrate.search.trials import Search

    runs = _run_dirs(folder.parent / "grid")
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "sweep").mkdir(parents=True)
    settings = SearchSettings(trials=trials, sampler=sampler, storage=f"sqlite:///{folder / 'optuna.db'}")
    search = Search.start(settings, overrides, folder, folder / "sweep")
    asked = []

    def launch(jobs, first_index):
        found = []
        for job in jobs:
            label = " ".join(o for o in job if o.split("=")[0] in POINT_KEYS)
            asked.append(label)
            found.append(
                SimpleNamespace(hydra_cfg=OmegaConf.create({"hydra": {"runtime": {"output_dir": str(runs[label])}}}))
            )
        return found

    search.run(launch, batch_size=1)
    return asked


def _kept_grid(out: Path, overrides: list[str]) -> tuple[float, dict[str, pd.Series]]:
    try:
        kept = json.loads((out / "grid" / "grid.json").read_text())
    except OSError as exc:
        sys.exit(f"--reuse-grid: no grid measured in {out / 'grid'} ({exc}); run without --reuse-grid first")
    if kept["overrides"] != overrides:
        sys.exit(f"--reuse-grid: the grid in {out} was measured with {kept['overrides']}, not {overrides}")
    return kept["grid_s"], _measured(out / "grid")


def _space_size(overrides: list[str]) -> int:
    from kvpipe import model
    from kvpipe.jobspec import spec_from
    from kvpipe.orchestrate.search.study import split_arguments

    fixed, restrict = split_arguments(overrides)
    spec = spec_from(fixed)
    return len(build(model.read_shape(spec.model).head_dim, "cpu", restrict).points)


if __name__ == "__main__":
    main()
