"""Deciding for a service: among runs that served requests under a load (load=...), the cache and
load (concurrency or rate) with the most throughput, or goodput, within the user's latency and memory
limits. Runs of one batch at a time have no throughput under load and take no part."""

from __future__ import annotations

import math

from kvpipe import catalogue
from kvpipe.decide import paired
from kvpipe.decide.limits import Limits
from kvpipe.decide.recommend import closest
from kvpipe.record import table as run_table
from kvpipe.record import tags as mlflow_tags
from kvpipe.record.read_back import column

OBJECTIVES = {  # --objective -> the figure it maximises
    "throughput": catalogue.column("output_tokens_per_s"),
    "goodput": catalogue.column("goodput_requests_per_s"),
}
# goodput where every run weighed judged its answers: the requests within the targets that answered right
RIGHT_GOODPUT = catalogue.column("goodput_correct_requests_per_s")


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
    if objective == "goodput" and not ok.empty and column(ok, RIGHT_GOODPUT).notna().all():
        figure, objective = RIGHT_GOODPUT, "goodput of right answers"
    if not ok.empty and column(ok, figure).isna().all():
        return None, (f"no serving run measured {objective}",
                      "goodput counts requests within latency targets: run with load.max_ttft_ms and/or load.max_tpot_ms")  # fmt: skip
    if ok.empty:
        run, missed = closest(served, limits)
        return None, ("no serving run meets the limits", f"closest: {_describe(run)} misses {' and '.join(missed)}")
    measured = ok[column(ok, figure).notna()]
    ranked = measured.iloc[(-column(measured, figure)).argsort(kind="stable").to_numpy()]  # the most first
    best, tie = cheapest_within_noise(ranked, figure)
    within = f"of the {len(ranked)} serving runs within limits"
    why = f"as much {objective} as its runs can tell {within}: {tie}" if tie else f"the most {objective} {within}"
    others = [run for _, run in ranked.iterrows() if run["run_id"] != best["run_id"]]
    if others:
        why += f"; the next: {_describe(others[0])}"
    return best, (_describe(best), why)


def cheapest_within_noise(ranked, figure: str) -> tuple[object, str]:
    """The run to take of `ranked` (the most `figure` first), and why where it is not the first: runs
    whose figure is not clearly below the first's (kvpipe.decide.paired: their intervals cannot tell
    them apart; without intervals, within 2%) tie with it, and the tie goes to the cheaper setup:
    fewer requests in flight, then less concurrency asked for, less KV cache, a lower peak."""
    first = ranked.iloc[0]
    tied = [(first, "")]
    for _, run in ranked.iloc[1:].iterrows():
        verdict = _within_noise(run, first, figure)
        if verdict is not None:
            tied.append((run, verdict))
    chosen, verdict = min(tied, key=lambda pair: _cost(pair[0]))
    if chosen is first:
        return first, ""
    value, top = chosen[figure], first[figure]
    metric = catalogue.get(run_table.name_of(figure))
    return chosen, (
        f"{_setup(chosen)} and {_setup(first)} are within noise ({metric.show(value)} vs {metric.show(top)}, "
        f"{1 - value / top:.0%}{'; ' + verdict if verdict else ''}): {_setup(chosen)} {_cheaper(chosen, first)}"
    )


def _within_noise(run, first, figure: str) -> str | None:
    """How run's figure stands against first's where the runs cannot tell them apart, else None."""
    found = paired.ratio(run, first, run_table.name_of(figure))
    if found is not None and found.state != paired.NO_INTERVAL:
        return None if found.clear else found.text()
    return "no interval" if abs(run[figure] / first[figure] - 1) <= paired.NEGLIGIBLE else None


COSTS = (  # what makes a setup cheaper, in order, and how to say so
    ("keeps fewer requests in flight", lambda run: run.get(catalogue.column("max_in_flight"))),
    ("asks for less concurrency", lambda run: run.get(run_table.param("load.concurrency"))),
    ("holds less KV cache", lambda run: run.get(catalogue.column("kv_cache_bytes"))),
    ("peaks lower", lambda run: run.get("memory_bytes")),
)


def _cost(run) -> tuple[float, ...]:
    return tuple(_number(read(run)) for _, read in COSTS)


def _number(value) -> float:
    """A cost as a number: inf where the run has none (a rate load asks for no concurrency)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return math.inf
    return math.inf if value != value else value


def _cheaper(chosen, other) -> str:
    return next((says for (says, _), mine, theirs in zip(COSTS, _cost(chosen), _cost(other)) if mine < theirs),
                "costs no more")  # fmt: skip


def _setup(run) -> str:
    return f"{run['label']} at {run.get(mlflow_tags.column(mlflow_tags.LOAD), '') or 'its load'}"


def _describe(run) -> str:
    """'paged at concurrency(16): 80.7 tok/s, 3.10 req/s, TPOT p90 41.2 ms, TTFT p90 310.4 ms' (– for a
    figure the run did not record)."""

    def show(name: str) -> str:
        return catalogue.get(name).show(run.get(catalogue.column(name), math.nan))

    load = run.get(mlflow_tags.column(mlflow_tags.LOAD), "")
    goodput = run.get(catalogue.column("goodput_requests_per_s"), math.nan)
    right = run.get(RIGHT_GOODPUT, math.nan)
    parts = [
        show("output_tokens_per_s"),
        show("requests_per_s"),
        *([f"goodput {show('goodput_requests_per_s')}"] if goodput == goodput else []),
        *([f"{show('goodput_correct_requests_per_s')} of right answers"] if right == right else []),
        f"TPOT p90 {show('tpot_p90_ms')}",
        f"TTFT p90 {show('ttft_p90_ms')}",
    ]
    return f"{run['label']} at {load or 'its load'}: " + ", ".join(parts)
