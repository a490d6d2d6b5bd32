"""The most traffic each cache carries while its answers stay right: `kvpipe capacity` with an accuracy
floor against full precision (--max-accuracy-drop), on labelled questions, for five caches.

A capacity search walks one setting's values (cache=, or an engine's), and every other override holds
for each of them; the five caches differ in more than one setting, so they are four searches, each in
a launch folder of its own (its own MLflow store, nothing reused): dynamic and paged together, quanto
int4, quanto int2 with no full-precision residual, and SnapKV keeping half of the prompt. Each search's
ceilings judge full precision's answers (the quality pass), so each lossy cache is held to the same
floor. Prints one verdict table (what `kvpipe capacity` prints, the five caches together), each
search's wall time and where a timeline picture of each cache's last point is; writes results.json
in --out.

    python benchmarks/capacity_answers.py                                       # embedded model, 1 thread
    python benchmarks/capacity_answers.py --requests 8 --resolution 0.25        # coarser, sooner
    python benchmarks/capacity_answers.py --model tiny_random --requests 4      # a quick look
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from capacity import kvpipe, search_arguments

from kvpipe.commands.capacity import verdict_cells, verdict_columns

# (what the table calls it, the overrides that choose it): one search per entry, caches= walked within
SEARCHES = {
    "dynamic, paged": ["cache=dynamic,paged"],
    "quanto int4": ["cache=quantized", "backend=quanto", "backend.nbits=4"],
    "quanto int2, residual 0": ["cache=quantized", "backend=quanto", "backend.nbits=2", "backend.residual_length=0"],
    # its observation window (kvpress's default, 64) must be shorter than the shortest question (~40 tokens)
    "snapkv 0.5": ["cache=dynamic", "press=snapkv", "press.ratio=0.5", "press.window=16"],
}
WORKLOAD = ["workload=dataset", f"workload.path={Path(__file__).resolve().parents[1] / 'examples' / 'questions.jsonl'}"]


def row(name: str, found: dict) -> str:
    """One cache's verdict as a markdown row: the cells `kvpipe capacity` prints, and why it binds."""
    return "| " + " | ".join([name, *verdict_cells(found, right=True, judged=True), found["why"]]) + " |"


def main() -> int:
    # capacity's own defaults: 16 requests a point, a resolution of 10%
    parser = search_arguments("capacity_answers", threads=1, requests=16, resolution=0.1)
    parser.add_argument("--max-accuracy-drop", type=float, default=0.1)
    args = parser.parse_args()

    fixed = [f"model={args.model}", f"model.threads={args.threads}", *WORKLOAD]
    flags = ["--max-ttft-ms", f"{args.max_ttft_ms:g}", "--max-tpot-ms", f"{args.max_tpot_ms:g}",
             "--max-accuracy-drop", f"{args.max_accuracy_drop:g}", "--requests", str(args.requests),
             "--resolution", f"{args.resolution:g}"]  # fmt: skip
    columns = ["cache", *verdict_columns(right=True, judged=True), "why"]
    header = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns)
    rows, results, started = [], {"searches": {}, "flags": flags, "fixed": fixed}, time.monotonic()
    for index, (name, chosen) in enumerate(SEARCHES.items()):
        command = ["capacity", *fixed, *chosen, *flags]
        print(f"search {index + 1}/{len(SEARCHES)} ({name}): kvpipe {' '.join(command)}", flush=True)
        launch = args.out / f"search{index}"
        wall_s, done = kvpipe(command, launch, args.threads)
        print(done.stdout[-3000:], flush=True)
        if done.returncode not in (0, 1):
            print(done.stderr[-4000:], file=sys.stderr)
            return done.returncode
        (found_path,) = sorted((launch / "outputs" / "capacity").glob("*/*/capacity.json"))[-1:]
        found = json.loads(found_path.read_text())
        pictures = sorted(found_path.parent.glob("*/requests_timeline.png"), key=lambda p: int(p.parent.name))
        for cache in found["caches"]:
            label = name if len(found["caches"]) == 1 else cache["cache"]
            rows.append(row(label, cache))
        results["searches"][name] = {"command": command, "wall_s": wall_s, "jobs": found["jobs"],
                                     "caches": found["caches"], "timeline": str(pictures[-1]) if pictures else None}  # fmt: skip
        print(
            f"{name}: {found['jobs']} jobs in {wall_s / 60:.1f} min; last timeline: {pictures[-1] if pictures else '-'}"
        )
    total_s = time.monotonic() - started
    results["wall_s"] = total_s
    print(f"\n{header}\n" + "\n".join(rows))
    print(f"\nfour searches in {total_s / 60:.1f} min: " + ", ".join(
        f"{name} {s['wall_s'] / 60:.1f} min ({s['jobs']} jobs)" for name, s in results["searches"].items()))  # fmt: skip
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
