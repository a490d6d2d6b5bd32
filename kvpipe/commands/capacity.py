"""`kvpipe capacity`: how much traffic each cache carries on this machine before the latency targets
break, and what gives out first.

Per cache of cache= (default dynamic, paged and quantized) it measures the maximum throughput (every
request at once: the search's ceiling), then searches the open-loop request rate (load=rate, seeded)
for the highest at which the targets hold at their percentile, each point a child run of one MLflow
parent, the caches still searching taking turns at each batch (hydra/sweeper=capacity). It answers per
cache: the rate carried, the lowest failing rate above it, the goodput there, and what binds (TTFT,
TPOT, goodput's share, accuracy with --min-accuracy, or memory, with plan's memory-bound capacity
beside it); then the cache that
carries the most and the command that measures it again. Exit 0 with an answer, 1 with none, 2 for a
usage error. A repeated (or killed) search reuses the points it measured (resume=true).

    kvpipe capacity --max-ttft-ms 2000 --max-tpot-ms 150
    kvpipe capacity cache=dynamic,paged --max-tpot-ms 80 --percentile 99 --min-goodput 0.95
    kvpipe capacity workload=dataset workload.path=examples/questions.jsonl --max-tpot-ms 150 --min-accuracy 0.8
    kvpipe capacity engine=llama_cpp engine.cache_type=f16,q8_0,q4_0 --max-ttft-ms 2000 --max-tpot-ms 150
"""

from __future__ import annotations

import argparse
import math
import shlex
import time
from pathlib import Path

from kvpipe.decide.capacity import PERCENTILES, THROUGHPUT, Targets
from kvpipe.errors import ConfigError
from kvpipe.orchestrate.capacity.sweeper import CapacitySettings
from kvpipe.units import duration_text, human_bytes, parse_bytes

HELP = "the highest request rate each cache carries within TTFT/TPOT targets, and what binds"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", help="Hydra overrides: the model and workload, fixed for every "
                        "point; cache=a,b,c the caches (default dynamic,paged,quantized), or through an engine one of its "
                        "settings' values (engine.cache_type=f16,q8_0)")  # fmt: skip
    parser.add_argument("--max-ttft-ms", type=float, metavar="MS", help="time to first token target, from arrival")
    parser.add_argument("--max-tpot-ms", type=float, metavar="MS", help="time per output token target")
    parser.add_argument("--percentile", type=int, default=CapacitySettings.percentile,
                        help=f"the targets hold at this percentile of requests: {', '.join(map(str, PERCENTILES))}"
                        f" (default {CapacitySettings.percentile})")  # fmt: skip
    parser.add_argument("--min-goodput", type=float, metavar="SHARE",
                        help="and at least this share of requests within both targets, e.g. 0.95")  # fmt: skip
    parser.add_argument("--min-accuracy", type=float, metavar="SHARE",
                        help="and at least this share of answers right, where the workload judges answers "
                        "(labelled prompts, pass keys, RULER, tasks), e.g. 0.8")  # fmt: skip
    parser.add_argument("--max-accuracy-drop", type=float, metavar="SHARE",
                        help="and at most this much below the accuracy of full precision's answers to the same "
                        "prompts (the ceiling's quality pass measures it), e.g. 0.05")  # fmt: skip
    parser.add_argument("--resolution", type=float, default=CapacitySettings.resolution, metavar="SHARE",
                        help=f"search to within this share of the rate (default {CapacitySettings.resolution})")  # fmt: skip
    parser.add_argument("--requests", type=int, default=CapacitySettings.requests,
                        help=f"requests per rate point (default {CapacitySettings.requests})")  # fmt: skip
    parser.add_argument("--memory-budget", metavar="SIZE",
                        help="plan's memory-bound capacity within this (default: the device's whole memory)")  # fmt: skip
    parser.add_argument("--trials", type=int, default=CapacitySettings.trials,
                        help=f"jobs to launch at most (default {CapacitySettings.trials})")  # fmt: skip


def checked(args: argparse.Namespace) -> Targets:
    """The targets and search settings, each checked: one line naming the flag, before anything loads."""
    targets = Targets(args.max_ttft_ms, args.max_tpot_ms, args.percentile, args.min_goodput, args.min_accuracy,
                      args.max_accuracy_drop).check()  # fmt: skip
    if not 0 < args.resolution < 1:
        raise ConfigError("--resolution", args.resolution, "expected a share of the rate above 0 and below 1, e.g. 0.1")
    if args.requests < 2:
        raise ConfigError("--requests", args.requests, "expected 2 or more requests per rate point, e.g. 16")
    if args.trials < 1:
        raise ConfigError("--trials", args.trials, "expected a positive number of jobs")
    if args.memory_budget is not None:
        parse_bytes(args.memory_budget, "--memory-budget")
    if any(o in ("tracking=off", "tracking.enabled=false") for o in args.overrides):
        raise ConfigError("tracking", "off", "capacity records every point as a child run and reuses them when "
                          "asked again; expected tracking=sqlite or server")  # fmt: skip
    return targets


def run(args: argparse.Namespace) -> int:
    from kvpipe.jobspec import spec_from
    from kvpipe.orchestrate.capacity.launch import launch_capacity
    from kvpipe.orchestrate.capacity.walker import as_override, shown, split_arguments, swept
    from kvpipe.orchestrate.search.launch import sweep_dir_of
    from kvpipe.record import auth

    started = time.monotonic()
    targets = checked(args)
    caches, fixed = split_arguments(args.overrides)
    specs = [spec_from([*fixed, as_override(cache), "load=rate"]) for cache in caches]  # each checked: one line
    spec = specs[0]
    check_accuracy_floor(targets, specs)
    auth.check_credentials(spec.tracking, Path.cwd())
    sweep_dir = sweep_dir_of(args.overrides, "capacity")
    names = ", ".join(shown(cache, fixed) for cache in caches)
    print(f"capacity: {names} within {targets.describe()}; points in {sweep_dir}", flush=True)
    name = f"capacity within {targets.describe()}"
    parent, found = launch_capacity(
        [*fixed, swept(caches), f"sweep_name={name!r}"], sweep_dir, trials=args.trials,
        max_ttft_ms=args.max_ttft_ms, max_tpot_ms=args.max_tpot_ms, percentile=args.percentile,
        min_goodput=args.min_goodput, min_accuracy=args.min_accuracy, max_accuracy_drop=args.max_accuracy_drop,
        resolution=args.resolution, requests=args.requests,
        memory_budget=args.memory_budget,
    )  # fmt: skip
    print()
    status = show(found, targets, fixed, args.requests)
    took = duration_text(time.monotonic() - started)
    print(f"capacity: done in {took}: {found['jobs']} jobs ({found['reused']} reused); "
          f"`kvpipe compare --parent {parent}` shows every point")  # fmt: skip
    return status


def check_accuracy_floor(targets: Targets, specs: list) -> None:
    """An accuracy floor needs answers to judge, and --max-accuracy-drop the full-precision answers beside
    them (the ceilings' quality pass): one line naming the flag, before any model loads."""
    workload = specs[0].bound_workload
    if targets.min_accuracy is not None and not workload.judges_answers():
        raise ConfigError("--min-accuracy", targets.min_accuracy, f"workload={specs[0].workload.kind} judges no "
                          "answers here; expected a labelled workload: workload=dataset with an answer column, "
                          "passkey, ruler, lm_eval or shared_context")  # fmt: skip
    if targets.max_accuracy_drop is None:
        return
    if not workload.judges_beside_reference():
        raise ConfigError("--max-accuracy-drop", targets.max_accuracy_drop, f"workload={specs[0].workload.kind} "
                          "does not judge full precision's answers beside its own here; expected greedy "
                          "workload=dataset with an answer column, or lm_eval (or --min-accuracy)")  # fmt: skip
    if not any(spec.quality.enabled for spec in specs) or all(spec.strategy.continuous for spec in specs):
        raise ConfigError("--max-accuracy-drop", targets.max_accuracy_drop, "expected a cache whose quality pass "
                          "runs (quality on; cache=paged's server has none): it answers at full precision")  # fmt: skip


def show(found: dict, targets: Targets, fixed: list[str], requests: int) -> int:
    """The table of what each cache carries, the one that carries the most and its command; 0 with
    an answer, 1 with none."""
    judged = targets.judges_accuracy  # the accuracy at the rate carried, beside its goodput
    # where the points judged answers: goodput of right answers, beside latency's alone
    right = any(cache.get("goodput_correct_requests_per_s") is not None for cache in found["caches"])
    from kvpipe.orchestrate.capacity.walker import shown

    named = {cache["cache"]: shown(cache["cache"], fixed) for cache in found["caches"]}
    rows = [("cache", *verdict_columns(right, judged))]
    rows += [(named[cache["cache"]], *verdict_cells(cache, right, judged)) for cache in found["caches"]]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    for cache in found["caches"]:
        print(f"  {named[cache['cache']]}: {cache['binds']} binds: {cache['why']}")
    print(f"  carries: the arrival rate sent · goodput there: requests within both targets a second, over "
          f"the {requests} requests' first arrival to their last answer"
          + (" · right answers' goodput: those of them that answered right" if right else "")
          + " · KV per request: the cache's peak bytes there over the most requests in flight (an engine's: "
          "what it allocated)")  # fmt: skip
    carrying = [c for c in found["caches"] if c["rate"]]
    if not carrying:
        print(f"\ncapacity: no cache meets {targets.describe()} at any rate tried")
        return 1
    best = max(carrying, key=lambda c: c["rate"])
    print(
        f"\ncapacity: {named[best['cache']]} carries the most: {best['rate']:.3g} requests/s within {targets.describe()}"
    )
    print(f"  use: kvpipe {shlex.join(_again(best, targets, fixed, requests))}")
    return 0


def verdict_columns(right: bool, judged: bool) -> list[str]:
    """The verdict table's columns after the cache's name: right answers' goodput where the points
    judged answers, the accuracy there where a floor judged it."""
    return ["carries", "fails at", "binds", "goodput there", *(["right answers' goodput"] if right else []),
            *(["accuracy there"] if judged else []), "KV per request", "max throughput", "plan's memory bound"]  # fmt: skip


def verdict_cells(cache: dict, right: bool, judged: bool) -> list[str]:
    """One cache's verdict (capacity.json's) as the cells of verdict_columns."""
    return [
        f"{cache['rate']:.3g} req/s" if cache["rate"] else "none",
        _rate(cache["failing_rate"]) if cache["binds"] != THROUGHPUT else "(its ceiling)",
        cache["binds"],
        _rate(cache["goodput_requests_per_s"]),
        *([_rate(cache.get("goodput_correct_requests_per_s"))] if right else []),
        *([_accuracy(cache.get("accuracy"), cache.get("accuracy_interval"))] if judged else []),
        human_bytes(cache["kv_bytes_per_request"]) if cache.get("kv_bytes_per_request") else "–",
        _rate(cache["max_throughput"]),
        f"{cache['memory_requests']:,} requests" if cache["memory_requests"] is not None else "–",
    ]


def _again(best: dict, targets: Targets, fixed: list[str], requests: int) -> list[str]:
    """The overrides that measure the cache that carries the most at its rate: the user's, less the
    settings that cache does not read (a backend beside cache=dynamic) and the sweep's own."""
    from kvpipe.decide.recommend import reproducing
    from kvpipe.jobspec import spec_from
    from kvpipe.orchestrate.capacity.walker import as_override

    chosen = [*fixed, as_override(best["cache"])]
    again = reproducing(chosen, spec_from([*chosen, "load=rate"]).read_fields())
    again += ["load=rate", f"load.rate={best['rate']:g}", f"load.requests={requests}"]
    again += [f"load.{name}={value:g}" for name, value in (("max_ttft_ms", targets.max_ttft_ms),
              ("max_tpot_ms", targets.max_tpot_ms)) if value is not None]  # fmt: skip
    return again


def _accuracy(value: float | None, interval: list[float] | None) -> str:
    """'89% (73–96%)': the accuracy at the rate carried and its 95% interval, where measured."""
    if value is None:
        return "–"
    return f"{value:.0%}" + (f" ({interval[0]:.0%}–{interval[1]:.0%})" if interval else "")


def _rate(value: float | None) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3g} req/s"
