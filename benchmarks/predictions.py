"""Do calibrated predictions hold? `kvpipe plan --hardware local`, calibrated on two prompt lengths per
strategy, against measurements at other lengths.

Per strategy (dynamic, and quantized with quanto int4 kivi) on the embedded model, one sweep of every
job: both strategies at the two calibration prompt lengths and at the evaluated ones (shorter than,
between and longer than the calibrated ones, so extrapolation is included), measured in interleaved
rounds, so that a slow spell of the machine falls on calibration and evaluation runs alike. Then
`kvpipe plan --hardware local --calibrate-on CALIBRATION --json` for the evaluated lengths: calibrated
on the calibration lengths' runs alone (each weighted by its interval), the evaluated ones held out.
Each prediction's error is (predicted - measured) / measured; the measured figure's 95% interval
(over its rounds) is reported beside it, as what this machine's noise alone leaves uncertain. Goal:
median |error| at most 10% and every |error| at most 20%, for TPOT and for TTFT.

    python benchmarks/predictions.py                  # the embedded model (about 10 min, 2 cores)
    python benchmarks/predictions.py --quick          # shorter lengths, fewer tokens
    python benchmarks/predictions.py --model tiny_random --calibrate 16,64 --lengths 8,32,128 --new-tokens 8

Everything runs as `python -m kvpipe` processes in one launch folder (--out/launch, made afresh) with
its own MLflow store (experiment "predictions"). The jobs use OMP_NUM_THREADS torch threads (default
2, as on the 2-core machine the other benchmarks were measured on; plan measures the local bandwidth
with the same threads). Contended runs are not calibrated on (kvpipe.predict.calibration), so run it
on an idle machine. Writes results.json and table.md in --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from kvpipe.model.embedded import embedded_folder
from kvpipe.record.result import iter_results

# plan's row label -> the overrides that measure it (plan's quantized row for the default backend settings)
STRATEGIES = {
    "dynamic": ["cache=dynamic"],
    "quanto int4 kivi": ["cache=quantized", "backend=quanto", "backend.nbits=4", "axis=kivi"],
}
BY_STRATEGY = {"dynamic": "dynamic", "quantized": "quanto int4 kivi"}  # a job's cache.strategy -> plan's row
SIZES = {  # (calibration prompt lengths, evaluated prompt lengths, new tokens, rounds)
    "full": ([512, 2048], [256, 1024, 4096], 32, 6),
    "quick": ([256, 1024], [128, 512, 2048], 16, 4),
}
GOAL_MEDIAN, GOAL_MAX = 0.10, 0.20
EXPERIMENT = "predictions"
SWEEP_DIR = "outputs/multiruns/predictions"


def kvpipe(launch: Path, env: dict, args: list[str], capture: bool = False) -> str:
    """Run `python -m kvpipe ARGS` in the launch folder; its stdout when captured."""
    proc = subprocess.run([sys.executable, "-m", "kvpipe", *args], cwd=launch, env=env, text=True,
                          stdout=subprocess.PIPE if capture else subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    if proc.returncode != 0:
        sys.exit(f"kvpipe {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout or ""


def sweep(launch: Path, env: dict, common: list[str], lengths: list[int]) -> None:
    """Both strategies at every prompt length, as one sweep whose jobs take turns in rounds."""
    caches = ["cache=dynamic,quantized", "backend=quanto", "backend.nbits=4", "axis=kivi"]
    print(f"one interleaved sweep: {', '.join(STRATEGIES)} at {', '.join(map(str, lengths))} prompt tokens", flush=True)
    kvpipe(launch, env, ["-m", *common, *caches, f"workload.prompt_tokens={','.join(map(str, lengths))}",
                         f"tracking.experiment={EXPERIMENT}", f"hydra.sweep.dir={SWEEP_DIR}"])  # fmt: skip


def measured(launch: Path, lengths: list[int]) -> dict[tuple[str, int], dict]:
    """(strategy label, prompt tokens) -> that job's figures over its rounds, and their intervals."""
    summary = {}
    for _, result in iter_results(launch / SWEEP_DIR):
        prompt = round(result.metrics.get("prompt_tokens") or 0)
        if result.status != "FINISHED" or prompt not in lengths:
            continue
        m = result.metrics
        figures = {"rounds": m.get("rounds"), "contended": result.tags.get("contended") == "true",
                   "noisy": result.tags.get("noisy") == "true"}  # fmt: skip
        for figure in ("tpot_ms", "ttft_ms"):
            figures[figure] = m[figure]
            figures[f"{figure}_half"] = (m[f"{figure}_ci_high"] - m[f"{figure}_ci_low"]) / 2 / m[figure]
        summary[(BY_STRATEGY[result.config["cache"]["strategy"]], prompt)] = figures
    return summary


def compare(plan: dict, truth: dict, calibrated: list[int], new_tokens: int) -> list[dict]:
    """One row per strategy and evaluated length: measured, predicted, error."""
    rows = []
    by_label = {row["strategy"]: row for row in plan["rows"]}
    for (label, prompt), figures in sorted(truth.items()):
        at = next((c for c in by_label[label]["contexts"] if c["context"] == prompt + new_tokens), None)
        row = {"strategy": label, "prompt_tokens": prompt, "contended": figures["contended"], "noisy": figures["noisy"],
               "where": "between" if calibrated[0] <= prompt <= calibrated[-1] else "extrapolated"}  # fmt: skip
        row["rounds"] = figures["rounds"]
        for name in ("tpot_ms", "ttft_ms"):
            predicted = at[name] if at and at["basis"] == "calibrated" else None
            row[f"{name}_measured"], row[f"{name}_predicted"] = figures[name], predicted
            row[f"{name}_half"] = figures[f"{name}_half"]
            row[f"{name}_error"] = None if predicted is None else (predicted - figures[name]) / figures[name]
        rows.append(row)
    return rows


def summary(rows: list[dict]) -> dict:
    found = {}
    for name in ("tpot_ms", "ttft_ms"):
        errors = [abs(r[f"{name}_error"]) for r in rows if r[f"{name}_error"] is not None]
        found[name] = {
            "predicted": len(errors),
            "of": len(rows),
            "median_abs_error": statistics.median(errors) if errors else None,
            "max_abs_error": max(errors) if errors else None,
            "goal_met": bool(errors) and len(errors) == len(rows)
            and statistics.median(errors) <= GOAL_MEDIAN and max(errors) <= GOAL_MAX,
        }  # fmt: skip
    return found


def markdown(rows: list[dict], totals: dict) -> str:
    def pct(value):
        return "–" if value is None else f"{value:+.1%}"

    def number(value):
        return "–" if value is None else f"{value:.1f}"

    table = pd.DataFrame(
        {
            "strategy": [r["strategy"] for r in rows],
            "prompt tokens": [f"{r['prompt_tokens']:,}" for r in rows],
            "range": [r["where"] + (" ⚠ contended" if r["contended"] else "") for r in rows],
            "TPOT ms measured": [number(r["tpot_ms_measured"]) for r in rows],
            "TPOT ±": [f"{r['tpot_ms_half']:.1%}" for r in rows],
            "TPOT ms predicted": [number(r["tpot_ms_predicted"]) for r in rows],
            "TPOT error": [pct(r["tpot_ms_error"]) for r in rows],
            "TTFT ms measured": [number(r["ttft_ms_measured"]) for r in rows],
            "TTFT ±": [f"{r['ttft_ms_half']:.1%}" for r in rows],
            "TTFT ms predicted": [number(r["ttft_ms_predicted"]) for r in rows],
            "TTFT error": [pct(r["ttft_ms_error"]) for r in rows],
        }
    )
    text = table.to_markdown(index=False, disable_numparse=True, colalign=["left", "right", "left"] + ["right"] * 8)
    for name, title in (("tpot_ms", "TPOT"), ("ttft_ms", "TTFT")):
        t = totals[name]
        if t["predicted"]:
            text += (f"\n\n{title}: median |error| {t['median_abs_error']:.1%}, max {t['max_abs_error']:.1%} over "
                     f"{t['predicted']} of {t['of']} predictions; goal (median <= {GOAL_MEDIAN:.0%}, every one <= "
                     f"{GOAL_MAX:.0%}) {'met' if t['goal_met'] else 'NOT met'}")  # fmt: skip
        else:
            text += f"\n\n{title}: nothing was predicted (see the calibration in results.json)"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2_135m", help="a conf/model preset (default: the embedded model)")
    parser.add_argument("--quick", action="store_true", help="shorter lengths and fewer tokens")
    parser.add_argument("--calibrate", help="the two (or more) calibration prompt lengths, e.g. 512,2048")
    parser.add_argument("--lengths", help="the evaluated prompt lengths (three or more), e.g. 256,1024,4096,6144")
    parser.add_argument("--new-tokens", type=int, help="workload.max_new_tokens of every job")
    parser.add_argument("--rounds", type=int, help="workload.repeats: the interleaved rounds each job is measured in")
    parser.add_argument("--out", type=Path, default=Path("outputs/benchmarks/predictions"))
    parser.add_argument("--reuse", action="store_true",
                        help="measure nothing: predict again from the runs already in --out/launch (after a change "
                             "to the calibration; the same measurements, so the errors compare)")  # fmt: skip
    args = parser.parse_args()
    calibrate, lengths, new_tokens, rounds = SIZES["quick" if args.quick else "full"]
    calibrate = sorted(int(n) for n in args.calibrate.split(",")) if args.calibrate else calibrate
    lengths = sorted(int(n) for n in args.lengths.split(",")) if args.lengths else lengths
    new_tokens, rounds = args.new_tokens or new_tokens, args.rounds or rounds
    embedded_folder()  # converted once, before anything is timed
    launch = (args.out / "launch").resolve()
    if not args.reuse:
        shutil.rmtree(launch, ignore_errors=True)
        launch.mkdir(parents=True)
    elif not (launch / SWEEP_DIR).is_dir():
        sys.exit(f"--reuse: {launch} holds no sweep; run without --reuse first")
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    common = [f"model={args.model}", "workload=long_context", f"workload.max_new_tokens={new_tokens}",
              f"workload.repeats={rounds}", "workload.warmup=1", "quality=off"]  # fmt: skip
    started = time.perf_counter()
    if not args.reuse:
        sweep(launch, env, common, sorted({*calibrate, *lengths}))
    contexts = ",".join(str(n + new_tokens) for n in lengths)
    plan_args = ["plan", *common[:3], f"tracking.experiment={EXPERIMENT}", "--hardware", "local",
                 "--calibrate-on", ",".join(map(str, calibrate)), "--context", contexts, "--json"]  # fmt: skip
    plan = json.loads(kvpipe(launch, env, plan_args, capture=True))
    rows = compare(plan, measured(launch, lengths), calibrate, new_tokens)
    totals = summary(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    document = {
        "model": args.model, "calibrate": calibrate, "lengths": lengths, "new_tokens": new_tokens,
        "rounds": rounds, "omp_num_threads": env["OMP_NUM_THREADS"],
        "wall_s": time.perf_counter() - started, "reused": args.reuse,
        "plan_command": "kvpipe " + " ".join(plan_args), "calibration": plan["calibration"],
        "hardware": plan["hardware"], "rows": rows, "summary": totals,
        "calibration_runs": [{"strategy": k[0], "prompt_tokens": k[1], **v}
                             for k, v in sorted(measured(launch, calibrate).items())],
    }  # fmt: skip
    (args.out / "results.json").write_text(json.dumps(document, indent=2) + "\n")
    table = markdown(rows, totals)
    (args.out / "table.md").write_text(table + "\n")
    print(table)
    print(f"\n{document['wall_s']:.0f} s; wrote {args.out / 'results.json'} and {args.out / 'table.md'}")


if __name__ == "__main__":
    main()
