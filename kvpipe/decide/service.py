"""Deciding for a service: among runs that served requests under a load (load=...), the cache and
load (concurrency or rate) with the most throughput, or goodput, within the user's latency and memory
limits. Runs of one batch at a time have no throughput under load and take no part."""

from __future__ import annotations

import math

from kvpipe import catalogue
from kvpipe.decide.limits import Limits
from kvpipe.decide.recommend import closest
from kvpipe.record import tags as mlflow_tags
from kvpipe.record.read_back import column

OBJECTIVES = {  # --objective -> the figure it maximises
    "throughput": catalogue.column("output_tokens_per_s"),
    "goodput": catalogue.column("goodput_requests_per_s"),
}


def add_objective_argument(parser, latency: str, service: str) -> None:
    """--objective: latency (the default, what `latency` says it does) or a service's throughput or
    goodput (what `service` says), for recommend and advise alike."""
    parser.add_argument(
        "--objective",
        choices=("latency", *OBJECTIVES),
        default="latency",
        help=f"latency (default): {latency}; throughput or goodput: {service}",
    )


def serving_runs(runs):
    """The runs that served a load."""
    return runs[column(runs, catalogue.column("output_tokens_per_s")).notna()]


def choose_for_service(runs, limits: Limits, objective: str):
    """(the chosen run or None, (what, why)): the most `objective` among the serving runs that meet
    every limit; with none, the closest by its worst miss."""
    figure = OBJECTIVES[objective]
    served = serving_runs(runs)
    if served.empty:
        return None, ("no run served a load", "run a sweep with load=concurrency or load=rate, e.g. "
                      "kvpipe -m cache=dynamic,paged load=concurrency load.concurrency=1,4,16")  # fmt: skip
    ok = served[[not limits.misses(run) for _, run in served.iterrows()]]
    if not ok.empty and column(ok, figure).isna().all():
        return None, (f"no serving run measured {objective}",
                      "goodput counts requests within latency targets: run with load.max_ttft_ms and/or load.max_tpot_ms")  # fmt: skip
    if ok.empty:
        run, missed = closest(served, limits)
        return None, ("no serving run meets the limits", f"closest: {_describe(run)} misses {' and '.join(missed)}")
    measured = ok[column(ok, figure).notna()]
    ranked = measured.iloc[(-column(measured, figure)).argsort(kind="stable").to_numpy()]  # the most first
    best = ranked.iloc[0]
    why = f"the most {objective} of the {len(ranked)} serving runs within limits" + (
        f"; the next: {_describe(ranked.iloc[1])}" if len(ranked) > 1 else ""
    )
    return best, (_describe(best), why)


def _describe(run) -> str:
    """'paged at concurrency(16): 80.7 tok/s, 3.10 req/s, TPOT p90 41.2 ms, TTFT p90 310.4 ms' (– for a
    figure the run did not record)."""

    def show(name: str) -> str:
        return catalogue.get(name).show(run.get(catalogue.column(name), math.nan))

    load = run.get(mlflow_tags.column(mlflow_tags.LOAD), "")
    goodput = run.get(catalogue.column("goodput_requests_per_s"), math.nan)
    parts = [
        show("output_tokens_per_s"),
        show("requests_per_s"),
        *([f"goodput {show('goodput_requests_per_s')}"] if goodput == goodput else []),
        f"TPOT p90 {show('tpot_p90_ms')}",
        f"TTFT p90 {show('ttft_p90_ms')}",
    ]
    return f"{run['label']} at {load or 'its load'}: " + ", ".join(parts)
