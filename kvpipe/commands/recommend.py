"""`kvpipe recommend`: the cache to use under memory, latency and quality limits, from measured runs."""

from __future__ import annotations

import argparse

from kvpipe.commands._source import add_source_arguments
from kvpipe.decide import recommend
from kvpipe.decide.limits import Limits, add_limit_arguments, limits_of
from kvpipe.decide.service import add_objective_argument

HELP = "the cache to use under memory, latency and quality limits"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_limit_arguments(parser)
    add_objective_argument(
        parser,
        "the guide's rules for one batch at a time",
        "the cache and load with the most of it among runs that served requests under a load (load=...)",
    )
    parser.add_argument("--all", action="store_true", help="every FINISHED run in the experiment, not one sweep")
    add_source_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """0 and the strategy to use per workload, or 1 and the limit closest to being met."""
    limits = limits_of(args)
    if args.objective != "latency":
        return answer_for_service(limits, args.objective, args.experiment, args.parent, args.tracking_uri, args.all,
                                  args.uri_spelling)  # fmt: skip
    return answer(limits, args.experiment, args.parent, args.tracking_uri, args.all, args.uri_spelling)


def answer(limits: Limits, experiment: str, parent: str | None, tracking_uri: str | None, whole_experiment: bool = False,
           spelled: str = "tracking.uri") -> int:  # fmt: skip
    """Print the recommendation per workload; 1 where no run meets the limits."""
    from kvpipe.decide.runs import load_runs, model_names  # mlflow only once the limits are valid

    runs, parent_run = load_runs(experiment, parent, tracking_uri, whole_experiment=whole_experiment, spelled=spelled)
    source = f"sweep {parent_run.run_id[:8]}" if parent_run else f"experiment {experiment!r}"
    print(f"limits: {limits.describe()} · {len(runs)} measured runs of {model_names(runs)} from {source}")
    missing = 0
    for workload, group in runs.groupby("workload", sort=False):  # strategies compete within one workload
        if workload:
            print(f"{workload}:")
        chosen, (what, why) = recommend.choose(group, limits)
        if chosen is None:
            print(f"{what}\n  {why}")
            missing += 1
        else:
            code = "\n".join("    " + line for line in recommend.snippet(chosen).splitlines())
            print(
                f"recommend: {chosen['label']} (run {chosen['run_id']})\n  {what}\n  why: {why}\n"
                f"  use: {recommend.use_command(chosen)}"
                + (f"\n  in your own generate() call:\n{code}" if code else "")
            )
        _explain_memory(group, chosen if chosen is not None else recommend.closest(group, limits)[0])
    return 1 if missing else 0


def _explain_memory(runs, answer) -> None:
    """Where a cache beside the answer holds fewer KV bytes yet peaks higher, one line on why."""
    from kvpipe.predict.memory_tradeoff import explain

    line = explain(runs, answer)
    if line:
        print(f"  memory: {line}")


def answer_for_service(limits: Limits, objective: str, experiment: str, parent: str | None,
                       tracking_uri: str | None, whole_experiment: bool = False, spelled: str = "tracking.uri") -> int:  # fmt: skip
    """Print the cache and load with the most throughput (or goodput) within the limits; 1 with none."""
    from kvpipe.decide.runs import load_runs, model_names
    from kvpipe.decide.service import choose_for_service

    runs, parent_run = load_runs(experiment, parent, tracking_uri, whole_experiment=whole_experiment, spelled=spelled)
    source = f"sweep {parent_run.run_id[:8]}" if parent_run else f"experiment {experiment!r}"
    print(f"limits: {limits.describe()} · the most {objective} · {len(runs)} runs of {model_names(runs)} from {source}")
    chosen, (what, why) = choose_for_service(runs, limits, objective)
    if chosen is None:
        print(f"{what}\n  {why}")
        return 1
    print(f"recommend: {what} (run {chosen['run_id']})\n  why: {why}\n  use: {recommend.use_command(chosen)}")
    return 0
