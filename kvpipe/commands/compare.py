"""`kvpipe compare`: a sweep's runs as one table of what varies, a Pareto front and plots."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvpipe.commands._source import add_source_arguments
from kvpipe.record import tags as mlflow_tags

HELP = "a sweep's runs as one table, a Pareto front and plots"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)
    parser.add_argument("--out", type=Path, metavar="DIR", help="where to write (default: the sweep's dir)")
    parser.add_argument(
        "--baseline",
        metavar="NAME",
        help="the configuration TPOT and TTFT are shown as a ratio to, with its interval: a cache label as the table "
        "shows it, a run name or a run id (default: dynamic, where the runs have one)",
    )
    parser.add_argument(
        "--predicted",
        action="store_true",
        help="beside each run, the TPOT and TTFT a calibration on its strategy's runs predicts (as kvpipe plan "
        "--hardware local does): its runs at two or more prompt lengths on one machine",
    )


def run(args: argparse.Namespace) -> int:
    """Print the latest (or a named) sweep's table; write and log its files."""
    from kvpipe.decide.compare import publish
    from kvpipe.decide.paired import with_ratios
    from kvpipe.decide.runs import load_runs
    from kvpipe.decide.shown import print_shown

    runs, parent_run = load_runs(args.experiment, args.parent, args.tracking_uri, spelled=args.uri_spelling)
    runs = with_ratios(runs, args.baseline)  # a --baseline that names no run stops here, in one line
    if args.predicted:
        from kvpipe.predict.predicted_runs import with_predictions

        runs = with_predictions(runs)
    sweep_dir = Path(parent_run.tags.get(mlflow_tags.SWEEP_DIR, "/nonexistent"))
    out_dir = args.out or (sweep_dir if sweep_dir.is_dir() else Path("compare") / parent_run.run_id[:8])
    written, table, logged = publish(runs, parent_run, out_dir)
    print_shown(table)
    for line in _memory_lines(runs):
        print(f"memory: {line}")
    print(wrote_line(written, out_dir, parent_run.run_id if logged else None))
    return 0


def wrote_line(written: list[Path], out_dir: Path, run_id: str | None) -> str:
    """'wrote compare.md, ..., tpot_vs_memory.png to DIR; logged on MLflow run ID (compare/)': where
    the files are, on disk and (where this user may log) on the sweep's parent run."""
    from kvpipe.decide.compare import ARTIFACT_DIR

    on_run = f"; logged on MLflow run {run_id} ({ARTIFACT_DIR}/)" if run_id else ""
    return f"wrote {', '.join(path.name for path in written)} to {out_dir}{on_run}"


def _memory_lines(runs) -> list[str]:
    """Per workload, where a cache holds fewer KV bytes than the leanest lossless run yet peaks
    higher, one line on why."""
    from kvpipe.predict.memory_tradeoff import explain

    lines = []
    for _, group in runs.groupby("workload", sort=False):
        lossless = group[group["lossless"]]
        if not lossless.empty:
            line = explain(group, lossless.loc[lossless["memory_bytes"].idxmin()])
            lines += [line] if line else []
    return lines
