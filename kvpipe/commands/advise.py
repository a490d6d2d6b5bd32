"""`kvpipe advise`: from question to answer in one command.

It prints the plan (what each strategy's cache would hold), searches the cache space within the trial
or time budget (hydra/sweeper=search: an Optuna study, its trials run and recorded as a sweep's jobs,
under one MLflow parent run), then prints the Pareto front found and `recommend`'s answer over it:
the cache to use with its numbers, the `use:` line and the generate() snippet. Exit 0 with an
answer, 1 with none (naming the closest run and how far it misses), 2 for a usage error.

    kvpipe advise --memory-budget 2GiB --max-tpot-ms 80 --trials 12
    kvpipe advise model=hf model.name_or_path=/models/x --max-kl 0.02 --timeout 20m
    kvpipe advise workload=passkey --min-accuracy 0.9 backend=hqq     # narrow the space: hqq only
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

from kvpipe.decide.limits import add_limit_arguments, limits_of, settings
from kvpipe.decide.service import add_objective_argument
from kvpipe.errors import ConfigError
from kvpipe.orchestrate.search.sweeper import SearchSettings
from kvpipe.record import tags as mlflow_tags
from kvpipe.units import duration_text, human_bytes

HELP = "plan, search the cache space under your limits, and recommend, in one command"
DEFAULT_TRIALS = SearchSettings.trials


def parse_duration(text: str) -> float:
    """Seconds from '20m', '90s', '1h', '1h30m' or a plain number of seconds."""
    match = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*", text)
    if not text.strip() or not match or not any(match.groups()):
        raise ConfigError("--timeout", text, "expected a duration such as 20m, 90s, 1h30m or 600")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    total = hours * 3600 + minutes * 60 + seconds
    if total <= 0:
        raise ConfigError("--timeout", text, "expected a duration above zero")
    return total


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", help="Hydra overrides: the model and workload, fixed for every trial; "
                        "cache=, backend=, backend.nbits=, axis=, ... narrow the space")  # fmt: skip
    add_limit_arguments(parser, exclusive_quality=True)
    parser.add_argument(
        "--trials", type=int, default=DEFAULT_TRIALS, help=f"jobs to measure at most (default {DEFAULT_TRIALS})"
    )
    parser.add_argument("--timeout", metavar="DURATION", help="launch no new trial after this long: 20m, 1h, 600")  # fmt: skip
    add_objective_argument(
        parser,
        "the cache for one batch at a time, searched",
        "the cache and concurrency with the most of it for a service, each cache of cache= walked up --concurrency "
        "while it gains",
    )
    parser.add_argument(
        "--concurrency",
        default="1,4,16",
        metavar="N,N",
        help="with --objective throughput|goodput: the levels the walk may climb",
    )


def run(args: argparse.Namespace) -> int:
    from kvpipe.commands.plan import show
    from kvpipe.jobspec import spec_from
    from kvpipe.orchestrate.search.launch import launch_search, sweep_dir_of
    from kvpipe.orchestrate.search.study import split_arguments
    from kvpipe.predict.bytes_plan import make_plan
    from kvpipe.record import auth

    started = time.monotonic()
    limits = _limits(args)
    if any(o in ("tracking=off", "tracking.enabled=false") for o in args.overrides):
        raise ConfigError(
            "tracking", "off", "advise reads its trials back from MLflow; expected tracking=sqlite or server"
        )
    if args.objective != "latency":
        return _advise_service(args, limits, started)
    fixed, _ = split_arguments(args.overrides)  # the plan shows every strategy: the model and workload matter
    spec = spec_from(fixed)
    auth.check_credentials(spec.tracking, Path.cwd())  # a refusal: one line, before the plan and the search
    sweep_dir = sweep_dir_of(args.overrides, "advise")
    show(make_plan(spec, limits.memory_bytes))
    timeout_s = parse_duration(args.timeout) if args.timeout else None
    within = f" for at most {duration_text(timeout_s)}" if timeout_s else ""
    print(f"\nadvise: searching at most {args.trials} jobs{within}; trials in {sweep_dir}", flush=True)
    limits_given = {name: getattr(args, name) for name in settings()}
    parent = launch_search(args.overrides, sweep_dir, trials=args.trials, timeout_s=timeout_s, **limits_given)
    print()
    print_front(parent, args, limits)
    status = _recommend(args, parent)
    took = duration_text(time.monotonic() - started)
    print(f"advise: done in {took} (sweep {parent[:8]}; `kvpipe compare --parent {parent}` shows every trial)")
    return status


def _limits(args):
    limits = limits_of(args)
    if args.trials < 1:
        raise ConfigError("--trials", args.trials, "expected a positive number of jobs")
    if args.timeout:
        parse_duration(args.timeout)
    return limits


def _source(args) -> tuple[str, str | None]:
    """(experiment, tracking URI) the trials were recorded in, from the overrides."""
    given = dict(o.split("=", 1) for o in args.overrides if "=" in o)
    return given.get("tracking.experiment", "kvpipe"), given.get("tracking.uri")


def print_front(parent: str, args, limits) -> None:
    """The feasible runs of the search that no other feasible run beats on memory, TPOT and quality."""
    import pandas as pd

    from kvpipe.decide.runs import judged_by, load_runs, non_dominated
    from kvpipe.orchestrate.search import objectives

    experiment, uri = _source(args)
    runs, _ = load_runs(experiment, parent, uri)
    device = (
        "cuda" if (runs.get(mlflow_tags.column(mlflow_tags.DEVICE), pd.Series(dtype=str)) == "cuda").any() else "cpu"
    )
    rows = []
    for _, run in runs.iterrows():
        values = objectives.values(run, device)
        if all(v == v for v in values) and not limits.misses(run):
            rows.append((values, run))
    front = [row for row, kept in zip(rows, non_dominated([values for values, _ in rows])) if kept]
    names = objectives.axis_names(device, judged_by(runs))
    print(
        f"Pareto front within the limits ({len(front)} of {len(runs)} measured runs; {', '.join(names)}, lower is better):"
    )
    for values, run in sorted(front, key=lambda item: item[0][0]):
        memory, tpot, quality = values
        print(f"  {run['label']:<40} {names[0]} {human_bytes(memory):>10} · TPOT {tpot:6.1f} ms · "
              f"{names[2]} {quality:.3g}")  # fmt: skip
    if not front:
        print("  (no measured run meets every limit)")


def _recommend(args, parent: str) -> int:
    from kvpipe.commands.recommend import answer

    experiment, uri = _source(args)
    return answer(limits_of(args), experiment, parent, uri)


def _advise_service(args, limits, started: float) -> int:
    """For a service: per cache of cache= (default dynamic, paged and quantized), concurrency walked
    upward along --concurrency while throughput grows and the limits hold, the caches taking turns at
    each level (hydra/sweeper=capacity, walk=concurrency), then the one with the most throughput (or
    goodput) within limits."""
    from kvpipe.commands.recommend import answer_for_service
    from kvpipe.jobspec import spec_from
    from kvpipe.orchestrate.capacity.launch import launch_capacity
    from kvpipe.orchestrate.capacity.walker import as_override, shown, split_arguments, swept
    from kvpipe.orchestrate.search.launch import sweep_dir_of
    from kvpipe.record import auth

    levels = _concurrencies(args.concurrency)
    caches, fixed = split_arguments(args.overrides)
    grid = len(caches) * len(levels)
    if grid > args.trials:
        raise ConfigError(
            "--trials", args.trials, f"{len(caches)} caches x {len(levels)} concurrencies is {grid} jobs; expected "
            f"--trials {grid} or more, or fewer caches (cache=) or concurrencies (--concurrency)",
        )  # fmt: skip
    targets = [f"load.max_tpot_ms={args.max_tpot_ms}"] if args.max_tpot_ms is not None else []
    spec = spec_from([*fixed, as_override(caches[0]), "load=concurrency", f"load.concurrency={levels[0]}", *targets])
    auth.check_credentials(spec.tracking, Path.cwd())
    sweep_dir = sweep_dir_of(args.overrides, "advise")
    print(f"advise: the most {args.objective} within {limits.describe()}: at most {grid} jobs ({', '.join(shown(c, fixed) for c in caches)} "
          f"at concurrency {', '.join(map(str, levels))}), each cache walked upward while it gains; trials in "
          f"{sweep_dir}", flush=True)  # fmt: skip
    limits_given = {name: getattr(args, name) for name in settings()}
    parent, found = launch_capacity([*fixed, swept(caches)], sweep_dir, walk="concurrency",
                                    levels=levels, objective=args.objective, trials=grid, **limits_given)  # fmt: skip
    print(f"advise: the walk took {found['jobs']} jobs of the grid's {grid}: {found['jobs'] - found['reused']} "
          f"measured, {found['reused']} reused")  # fmt: skip
    for cache in found["caches"]:
        print(f"  {shown(cache['cache'], fixed)}: concurrency {', '.join(map(str, cache['levels']))}"
              + (f"; stopped: {cache['stopped']}" if cache["stopped"] else ""))  # fmt: skip
    print()
    experiment, uri = _source(args)
    status = answer_for_service(limits, args.objective, experiment, parent, uri)
    took = duration_text(time.monotonic() - started)
    print(f"advise: done in {took} (sweep {parent[:8]}; `kvpipe compare --parent {parent}` draws the serving curve)")
    return status


def _concurrencies(text: str) -> list[int]:
    parts = text.replace(" ", "").split(",")
    if not all(part.isdigit() and int(part) >= 1 for part in parts):
        raise ConfigError(
            "--concurrency", text, "expected comma-separated requests in flight of 1 or more, e.g. 1,4,16"
        )
    return sorted({int(part) for part in parts})
