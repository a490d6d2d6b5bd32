"""Can kvpipe tell two caches apart on a machine whose speed drifts? The same sweep, measured one job
after another (hydra/launcher=basic) and in interleaved rounds (the default launcher), while
background processes make the machine slow for 15 s and fast for 15 s, over and over.

The sweep: cache=dynamic,quantized (quanto int2) × workload.seed=0,1, so that
  A  = dynamic, seed 0      A′ = dynamic, seed 1  (the same work: seed changes nothing greedy decoding does)
  B  = quanto int2, seed 0  B′ = quanto int2, seed 1
A′/A and B′/B must read 1.00 and never "clearly" slower or faster; B/A is a real slowdown and must be ranked
the right way with an interval that excludes 1. Each ratio is what `kvpipe compare` shows
(kvpipe.decide.paired): paired round by round where the jobs took turns in the same rounds, else
unpaired (Welch's t over each job's round means).

Goals: interleaved, A′/A within 5% of 1.00 and not clearly different in every run, and B/A clear and
above 1 in every run. Then, with the drift stopped, `--cost-pairs` sequential and interleaved sweeps
in turn on the idle machine: interleaving should add at most 5% to the sweep's wall time.

    python benchmarks/drift.py                     # 5 runs of each order, 2 idle pairs (about 25 min, 2 cores)
    python benchmarks/drift.py --runs 2 --repeats 6 --cost-pairs 1

The jobs use one torch thread (model.threads=1) and the drift two spinning processes, so that on a
2-core machine a busy phase gives each of the three runnable threads two thirds of a core: the
job's calls take about half as long again. Writes results.json and table.md in --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from kvpipe.decide.paired import Ratio, ratio

PROMPT = "Explain in two sentences why the sky is blue."
SWEEP = [
    "quality=off", "tracking=off", "model.threads=1", f"workload.prompts=[{PROMPT}]",
    "workload.max_new_tokens=16", "cache=dynamic,quantized", "backend=quanto", "backend.nbits=2", "workload.seed=0,1",
]  # fmt: skip
ORDERS = {"sequential": ["hydra/launcher=basic"], "interleaved": []}
PAIRS = {"A′/A": (("dynamic", 0), ("dynamic", 1)), "B/A": (("quantized", 0), ("dynamic", 0)),
         "B′/B": (("quantized", 1), ("quantized", 0))}  # fmt: skip  # name: (run, baseline)


SPIN = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"


class Drift(threading.Thread):
    """Busy for busy_s (hogs spinning processes), idle for idle_s, until stopped; each phase logged."""

    def __init__(self, hogs: int, busy_s: float, idle_s: float, log_path: Path):
        super().__init__(daemon=True)
        self.hogs, self.busy_s, self.idle_s, self.log_path = hogs, busy_s, idle_s, log_path
        self.stopped = threading.Event()
        self.spinners: list[subprocess.Popen] = []

    def run(self) -> None:
        with self.log_path.open("a") as log:
            while not self.stopped.is_set():
                log.write(f"{time.time():.1f} busy\n")
                log.flush()
                code = SPIN.format(seconds=self.busy_s)
                self.spinners = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(self.hogs)]
                for spinner in self.spinners:
                    spinner.wait()
                log.write(f"{time.time():.1f} idle\n")
                log.flush()
                self.stopped.wait(self.idle_s)

    def stop(self) -> None:
        self.stopped.set()
        for spinner in self.spinners:
            spinner.kill()
        self.join()


def sweep(order: str, repeats: int, sweep_dir: Path) -> tuple[dict, float]:
    """One `python -m kvpipe -m` sweep; (its jobs' result.json by (strategy, seed), wall seconds)."""
    command = [sys.executable, "-m", "kvpipe", "-m", *SWEEP, f"workload.repeats={repeats}",
               f"hydra.sweep.dir={sweep_dir}", *ORDERS[order]]  # fmt: skip
    started = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode:
        sys.exit(f"the {order} sweep failed:\n{proc.stderr[-3000:]}")
    jobs = {}
    for path in sorted(sweep_dir.glob("*/result.json")):
        result = json.loads(path.read_text())
        key = (result["config"]["cache"]["strategy"], result["config"]["workload"]["seed"])
        jobs[key] = result
    return jobs, wall


def as_row(result: dict) -> dict:
    """A result.json as the row of MLflow's runs table that kvpipe.decide.paired reads."""
    return {f"tags.kvpipe.{name}": value for name, value in result["tags"].items()}


def judged(jobs: dict) -> dict:
    out = {}
    for name, (run, baseline) in PAIRS.items():
        found = ratio(as_row(jobs[run]), as_row(jobs[baseline]))
        out[name] = found
    return out


def verdict_row(index: int, order: str, wall: float, ratios: dict[str, Ratio], tpot: dict) -> dict:
    same, slower = ratios["A′/A"], ratios["B/A"]
    return {
        "run": index,
        "order": order,
        "A′/A": same.text(),
        "A′/A holds": abs(same.value - 1) <= 0.05 and not same.clear,
        "B/A": slower.text(),
        "B/A holds": slower.clear and slower.value > 1,
        "B′/B": ratios["B′/B"].text(),
        "A TPOT ms": f"{tpot['A']:.1f}",
        "sweep s": round(wall, 1),
        "_ratios": {name: [r.value, r.low, r.high, r.paired] for name, r in ratios.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="sweeps of each order under the drift")
    parser.add_argument("--repeats", type=int, default=16, help="workload.repeats: each job's rounds")
    parser.add_argument("--hogs", type=int, default=2, help="spinning processes in a busy phase")
    parser.add_argument("--busy", type=float, default=15.0)
    parser.add_argument("--idle", type=float, default=15.0)
    parser.add_argument("--cost-pairs", type=int, default=2, help="idle sequential + interleaved sweeps for the cost")
    parser.add_argument("--out", type=Path, default=Path("outputs/benchmarks/drift"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    phases = args.out / "phases.log"
    phases.unlink(missing_ok=True)

    rows = []
    background = Drift(args.hogs, args.busy, args.idle, phases)
    background.start()
    try:
        for index in range(1, args.runs + 1):
            # alternate which order goes first, so that neither always meets the same phase of a slow spell
            orders = list(ORDERS) if index % 2 else list(reversed(ORDERS))
            for order in orders:
                jobs, wall = sweep(order, args.repeats, args.out / "runs" / f"{order}-{index}")
                tpot = {"A": jobs[("dynamic", 0)]["metrics"]["tpot_ms"]}
                rows.append(verdict_row(index, order, wall, judged(jobs), tpot))
                shown = {k: v for k, v in rows[-1].items() if not k.startswith("_")}
                print(json.dumps(shown, ensure_ascii=False), flush=True)
    finally:
        background.stop()

    cost = {"sequential": [], "interleaved": []}
    for index in range(args.cost_pairs):
        for order in ORDERS:
            _, wall = sweep(order, args.repeats, args.out / "runs" / f"idle-{order}-{index + 1}")
            cost[order].append(wall)
            print(f"idle {order} sweep: {wall:.1f} s", flush=True)
    cost_ratio = (
        statistics.median(cost["interleaved"]) / statistics.median(cost["sequential"]) if cost["sequential"] else None
    )

    summary = {
        order: {
            "A′/A holds": sum(r["A′/A holds"] for r in rows if r["order"] == order),
            "B/A holds": sum(r["B/A holds"] for r in rows if r["order"] == order),
            "runs": sum(r["order"] == order for r in rows),
        }
        for order in ORDERS
    }
    document = {"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows, "summary": summary,
                "idle_wall_s": cost, "interleaved_over_sequential_wall": cost_ratio}  # fmt: skip
    (args.out / "results.json").write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    write_table(args, rows, summary, cost, cost_ratio)
    print((args.out / "table.md").read_text())


def write_table(args, rows: list[dict], summary: dict, cost: dict, cost_ratio: float | None) -> None:
    import pandas as pd

    shown = pd.DataFrame([{k: v for k, v in r.items() if not k.startswith("_")} for r in rows])
    shown["A′/A holds"] = shown["A′/A holds"].map({True: "✓", False: "✗"})
    shown["B/A holds"] = shown["B/A holds"].map({True: "✓", False: "✗"})
    lines = [
        f"Drift: {args.hogs} spinning processes busy {args.busy:g} s, idle {args.idle:g} s; each sweep 4 jobs × "
        f"workload.repeats={args.repeats}, model.threads=1, quality off. † not paired (measured in different rounds).",
        "",
        shown.to_markdown(index=False, stralign="right"),
        "",
    ]
    for order, counts in summary.items():
        lines.append(
            f"- {order}: A′/A within 5% of 1.00 and not clearly different in {counts['A′/A holds']} of {counts['runs']}; "
            f"B/A clearly slower in {counts['B/A holds']} of {counts['runs']}"
        )
    if cost_ratio is not None:
        walls = ", ".join(f"{order} {' / '.join(f'{w:.1f}' for w in walls)} s" for order, walls in cost.items())
        lines.append(f"- idle machine, wall time of the sweep: {walls}; interleaved / sequential = {cost_ratio:.3f}")
    (args.out / "table.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
