"""Can kvpipe tell two caches apart on a machine whose speed drifts? The same sweep, measured one job
after another (hydra/launcher=basic), in interleaved rounds whose turn is a job's whole pass
(hydra.launcher.turn=pass, the rounds kvpipe took before its turns were calls) and in turns by call
(the default launcher), while background processes make the machine slow for 15 s and fast for 15 s,
over and over (--neighbour drift, the default); or beside one process spinning at normal priority for
the whole sweep (--neighbour steady: a colleague's job, a CI runner's other build), or none (--neighbour none).

The sweep: cache=dynamic,quantized (quanto int2) × workload.seed=0,1, so that
  A  = dynamic, seed 0      A′ = dynamic, seed 1  (the same work: seed changes nothing greedy decoding does)
  B  = quanto int2, seed 0  B′ = quanto int2, seed 1
A′/A must read 1.00 and never "clearly" slower or faster; B/A is a real slowdown and must be ranked the
right way with an interval that excludes 1. Each ratio is what `kvpipe compare` shows
(kvpipe.decide.paired): paired call by call where the jobs took the same calls in the same turns,
round by round where they took turns by pass, else unpaired (Welch's t over each job's round means).
Beside it, the raw ratio of the two jobs' own TPOT figures (what the run's table prints).

Two settings (--settings):
  one-prompt    the benchmark's first setting: one short prompt, 16 new tokens, model.threads=1,
                two spinning processes in a busy phase, workload.repeats=16 (--repeats overrides)
  default-chat  the default chat workload as a user runs it (its 4 prompts, its max_new_tokens and
                repeats unless --repeats says otherwise), model.threads=2, one spinning process

Goals, for turns by call: A′/A's raw TPOT ratio within 5% of 1.00 in every run, its paired interval
within ±5%, and B/A clear and above 1 in every run. Then, with the drift stopped, `--cost-pairs`
idle sweeps with whole-pass turns and with turns by call, in turn: turns by call should add at most
5% to the sweep's wall time.

    python benchmarks/drift.py                    # both settings, 3 orders, 5 runs each, 2 idle pairs
    python benchmarks/drift.py --settings default-chat --orders pass call --repeats auto
    python benchmarks/drift.py --neighbour steady --settings default-chat --orders call --repeats auto
    python benchmarks/drift.py --neighbour steady --settings default-chat --orders call --repeats auto \
        --set workload.max_measure_s=1800    # any override, added to every sweep
    python benchmarks/drift.py --runs 1 --settings one-prompt --orders call --repeats 2 --cost-pairs 1 \
        --busy 3 --idle 3 --model tiny_random       # a smoke run: the script end to end, in a minute

Writes results.json and table.md in --out.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from kvpipe.decide.paired import Ratio, ratio

PROMPT = "Explain in two sentences why the sky is blue."
SWEPT = ["quality=off", "tracking=off", "cache=dynamic,quantized", "backend=quanto", "backend.nbits=2",
         "workload.seed=0,1"]  # fmt: skip
SETTINGS = {  # name: (overrides, spinning processes in a busy phase, workload.repeats unless --repeats)
    "one-prompt": (["model.threads=1", f"workload.prompts=[{PROMPT}]", "workload.max_new_tokens=16"], 2, "16"),
    "default-chat": (["model.threads=2"], 1, None),
}
ORDERS = {"sequential": ["hydra/launcher=basic"], "pass": ["hydra.launcher.turn=pass"], "call": []}
PAIRS = {"A′/A": (("dynamic", 1), ("dynamic", 0)), "B/A": (("quantized", 0), ("dynamic", 0)),
         "B′/B": (("quantized", 1), ("quantized", 0))}  # fmt: skip  # name: (run, baseline)
WITHIN = 0.05  # the goals: the identical pair's raw ratio and its paired interval within ±5%


SPIN = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"


class Drift(threading.Thread):
    """Busy for busy_s (hogs spinning processes), idle for idle_s, until stopped; each phase logged."""

    def __init__(self, hogs: int, busy_s: float, idle_s: float, log_path: Path):
        super().__init__(daemon=True)
        self.hogs, self.busy_s, self.idle_s, self.log_path = hogs, busy_s, idle_s, log_path
        self.stopped = threading.Event()
        self.spinners: list[subprocess.Popen] = []

    def run(self) -> None:
        if not self.hogs:  # --neighbour none
            return
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


def sweep(
    setting: str, order: str, repeats: str | None, model: str, sweep_dir: Path, extra: list[str] | tuple = ()
) -> tuple[dict, float]:
    """One `python -m kvpipe -m` sweep, with the `extra` overrides (--set); (its jobs' result.json by
    (strategy, seed), wall seconds)."""
    overrides, _, default_repeats = SETTINGS[setting]
    repeats = repeats or default_repeats
    shutil.rmtree(sweep_dir, ignore_errors=True)  # an earlier run's folder would be resumed, its jobs skipped
    command = [sys.executable, "-m", "kvpipe", "-m", f"model={model}", *SWEPT, *overrides,
               *([f"workload.repeats={repeats}"] if repeats else []), f"hydra.sweep.dir={sweep_dir}",
               *ORDERS[order], *extra]  # fmt: skip
    started = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode:
        sys.exit(f"the {setting} {order} sweep failed:\n{proc.stderr[-3000:]}")
    jobs = {}
    for path in sorted(sweep_dir.glob("*/result.json")):
        result = json.loads(path.read_text())
        key = (result["config"]["cache"]["strategy"], result["config"]["workload"]["seed"])
        jobs[key] = result
    return jobs, wall


def as_row(result: dict) -> dict:
    """A result.json as the row of MLflow's runs table that kvpipe.decide.paired reads."""
    return {f"tags.kvpipe.{name}": value for name, value in result["tags"].items()}


def judged(jobs: dict) -> dict[str, Ratio]:
    """Each pair's ratio as compare reads it; a NaN one where no call of the pair was kept (every turn
    ran under the drift's load), which no goal counts as met."""
    nothing = Ratio(math.nan, math.nan, math.nan, paired=False)
    return {
        name: ratio(as_row(jobs[run]), as_row(jobs[baseline])) or nothing for name, (run, baseline) in PAIRS.items()
    }


def half_width(found: Ratio) -> float:
    """The paired interval's half-width as a fraction (log scale, as ±5% reads); inf without one."""
    if math.isnan(found.low) or not found.low > 0:
        return math.inf
    return math.expm1(math.log(found.high / found.low) / 2)


def said(found: Ratio) -> str:
    return "no ratio: every call of the pair was left out as contended" if math.isnan(found.value) else found.text()


def verdict_row(setting: str, index: int, order: str, wall: float, jobs: dict) -> dict:
    ratios = judged(jobs)
    same, slower = ratios["A′/A"], ratios["B/A"]
    tpot = {key: result["metrics"]["tpot_ms"] for key, result in jobs.items()}
    raw = tpot[("dynamic", 1)] / tpot[("dynamic", 0)]
    width = half_width(same)
    return {
        "setting": setting,
        "run": index,
        "order": order,
        "A′/A raw TPOT": round(raw, 3),
        "raw holds": abs(raw - 1) <= WITHIN,
        "A′/A": said(same),
        "A′/A ±": f"±{width:.1%}" if math.isfinite(width) else "none",
        "interval holds": width <= WITHIN and not same.clear,
        "B/A": said(slower),
        "B/A holds": slower.clear and slower.value > 1,
        "rounds": int(jobs[("dynamic", 0)]["metrics"].get("rounds", 0)),
        "calls left out": int(jobs[("dynamic", 0)]["metrics"].get("calls_excluded", 0)),
        "of calls": int(jobs[("dynamic", 0)]["metrics"].get("rounds", 0)) * CALLS_PER_ROUND[setting],
        "stopped by": jobs[("dynamic", 0)]["tags"].get("rounds_stopped_by", "repeats"),
        "A TPOT ms": round(tpot[("dynamic", 0)], 1),
        "sweep s": round(wall, 1),
        "_ratios": {name: [r.value, r.low, r.high, r.paired, r.rounds] for name, r in ratios.items()},
    }


GOALS = ("raw holds", "interval holds", "B/A holds")
CALLS_PER_ROUND = {"one-prompt": 1, "default-chat": 4}  # its batches: a call each per round
NEIGHBOURS = {  # name: (spinning processes, busy s, idle s) given the drift's --busy and --idle
    "drift": lambda args, setting: (SETTINGS[setting][1], args.busy, args.idle),
    "steady": lambda args, setting: (1, 1e9, 0.0),  # one process, the whole sweep: killed when it ends
    "none": lambda args, setting: (0, 0.0, 0.0),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--orders", nargs="+", choices=list(ORDERS), default=list(ORDERS))
    parser.add_argument("--runs", type=int, default=5, help="sweeps of each setting and order under the drift")
    parser.add_argument("--repeats", help="workload.repeats for every sweep (a number or auto); default: the setting's")
    parser.add_argument(
        "--neighbour",
        choices=list(NEIGHBOURS),
        default="drift",
        help="beside the sweeps: the 15 s busy / 15 s idle drift, one steady spinning process, or none",
    )
    parser.add_argument("--busy", type=float, default=15.0)
    parser.add_argument("--idle", type=float, default=15.0)
    parser.add_argument("--cost-pairs", type=int, default=2, help="idle pass + call sweeps per setting, for the cost")
    parser.add_argument("--model", default="smollm2_135m", help="model=...: tiny_random for a smoke run")
    parser.add_argument("--out", type=Path, default=Path("outputs/benchmarks/drift"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an override for every sweep, e.g. --set workload.max_measure_s=1800 (repeatable)")  # fmt: skip
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    phases = args.out / "phases.log"
    phases.unlink(missing_ok=True)

    rows = []
    for setting in args.settings if args.runs else ():  # --runs 0: no drift, only the idle cost below
        background = Drift(*NEIGHBOURS[args.neighbour](args, setting), phases)
        background.start()
        try:
            for index in range(1, args.runs + 1):
                # rotate which order goes first, so that none always meets the same phase of a slow spell
                shift = (index - 1) % len(args.orders)
                for order in args.orders[shift:] + args.orders[:shift]:
                    run_dir = args.out / "runs" / f"{setting}-{order}-{index}"
                    jobs, wall = sweep(setting, order, args.repeats, args.model, run_dir, args.set)
                    rows.append(verdict_row(setting, index, order, wall, jobs))
                    print(json.dumps({k: v for k, v in rows[-1].items() if not k.startswith("_")}, ensure_ascii=False),
                          flush=True)  # fmt: skip
        finally:
            background.stop()

    cost = {setting: {"pass": [], "call": []} for setting in args.settings}
    for setting in args.settings:
        for index in range(args.cost_pairs):
            for order in ("pass", "call") if index % 2 == 0 else ("call", "pass"):
                run_dir = args.out / "runs" / f"idle-{setting}-{order}-{index + 1}"
                _, wall = sweep(setting, order, args.repeats, args.model, run_dir, args.set)
                cost[setting][order].append(wall)
                print(f"idle {setting} {order} sweep: {wall:.1f} s", flush=True)
    cost_ratio = {
        setting: statistics.median(walls["call"]) / statistics.median(walls["pass"])
        for setting, walls in cost.items()
        if walls["pass"]
    }
    summary = {
        f"{setting} {order}": {
            **{goal: sum(r[goal] for r in rows if (r["setting"], r["order"]) == (setting, order)) for goal in GOALS},
            "runs": sum((r["setting"], r["order"]) == (setting, order) for r in rows),
        }
        for setting in args.settings
        for order in args.orders
    }
    document = {"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows, "summary": summary,
                "idle_wall_s": cost, "call_over_pass_wall": cost_ratio}  # fmt: skip
    (args.out / "results.json").write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    write_table(args, rows, summary, cost, cost_ratio)
    print((args.out / "table.md").read_text())


def write_table(args, rows: list[dict], summary: dict, cost: dict, cost_ratio: dict) -> None:
    import pandas as pd

    command = " ".join(["python benchmarks/drift.py", *sys.argv[1:]])
    beside = {
        "drift": f"drift busy {args.busy:g} s, idle {args.idle:g} s (one-prompt: 2 spinning processes, "
        "model.threads=1; default-chat: 1, model.threads=2)",
        "steady": "one process spinning at normal priority through every sweep",
        "none": "nothing else running",
    }[args.neighbour]
    lines = [
        f"`{command}`: {beside}; each sweep 4 jobs, quality off. † not paired (measured in different rounds).",
        "",
    ]
    if rows:  # --runs 0 measures only the idle cost
        shown = pd.DataFrame([{k: v for k, v in r.items() if not k.startswith("_")} for r in rows])
        for goal in GOALS:
            shown[goal] = shown[goal].map({True: "✓", False: "✗"})
        lines += [shown.to_markdown(index=False, stralign="right"), ""]
    for name, counts in summary.items() if rows else ():
        lines.append(
            f"- {name}: A′/A raw TPOT within 5% in {counts['raw holds']} of {counts['runs']}, its paired interval "
            f"within ±5% in {counts['interval holds']}; B/A clearly slower in {counts['B/A holds']} of {counts['runs']}"
        )
    for setting, walls in cost.items():
        if setting in cost_ratio:
            shown_walls = ", ".join(f"{order} {' / '.join(f'{w:.1f}' for w in w_)} s" for order, w_ in walls.items())
            lines.append(f"- idle {setting}, sweep wall time: {shown_walls}; call / pass = {cost_ratio[setting]:.3f}")
    (args.out / "table.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
