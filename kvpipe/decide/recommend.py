"""Recommend: the cache strategy to use under memory, latency and quality limits, from measured runs.

The guide's rules, in order, over the runs that meet every limit: dynamic, which grows only as needed,
unless static (or static+compile) is at least 10% faster; static when dynamic misses a limit; when memory
binds (every dense run is over budget), offloaded (lossless) before quantized (fastest within --max-kl
and --min-accuracy).
Otherwise no recommendation, and the run that comes closest, with the limits it misses.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
from dataclasses import dataclass

from kvpipe import cache, catalogue
from kvpipe import workload as workloads
from kvpipe.decide.runs import (  # mlflow only once limits are valid
    add_source_arguments,
    is_lossless,
    load_runs,
    model_names,
)
from kvpipe.errors import ConfigError
from kvpipe.units import human_bytes, parse_bytes

DEFAULT_KL = 0.05  # nats: the quality limit when none is given
PAYS_OFF = 0.10  # static must beat dynamic's TPOT by this much to be worth a fixed, preallocated cache
DYNAMIC, STATIC, OFFLOADED, QUANTIZED = cache.FAMILIES  # the guide's rules are written per family
DENSE, MEMORY_SAVERS = (DYNAMIC, STATIC), (OFFLOADED, QUANTIZED)  # lossless before lossy, when memory binds


def family(strategy: str) -> str | None:
    """What the registry says recommend should weigh this strategy as."""
    return cache.REGISTRY[strategy].family if strategy in cache.REGISTRY else None


@dataclass(frozen=True)
class Limits:
    """The user's limits; None is no limit."""

    memory_bytes: float | None = None
    tpot_ms: float | None = None
    kl: float | None = DEFAULT_KL
    accuracy: float | None = None  # passkey retrieval accuracy, a minimum

    def describe(self) -> str:
        parts = [
            f"memory ≤ {human_bytes(self.memory_bytes)}" if self.memory_bytes is not None else "",
            f"TPOT ≤ {self.tpot_ms:g} ms" if self.tpot_ms is not None else "",
            f"KL ≤ {self.kl:g} nats" if self.kl is not None else "",
            f"retrieval ≥ {self.accuracy:.0%}" if self.accuracy is not None else "",
        ]
        return " · ".join(p for p in parts if p)

    def misses(self, run) -> dict[str, float]:
        """Relative overshoot of each limit the run misses; inf where the figure was not measured.

        Memory is the measured peak, weights included: the allocator's on CUDA, the process's on CPU."""
        overshoot = {}
        for name, (value, limit) in self.checks(run).items():
            if limit is None:
                continue
            if value is None or math.isnan(value):
                overshoot[name] = math.inf
            elif name in MINIMUMS and value < limit:
                overshoot[name] = 1 - value / limit  # the share of the required accuracy it lacks
            elif name not in MINIMUMS and value > limit:
                overshoot[name] = value / limit - 1 if limit > 0 else math.inf
        return overshoot

    def checks(self, run) -> dict[str, tuple[float, float | None]]:
        return {
            "memory": (run["memory_bytes"], self.memory_bytes),
            "TPOT": (run["metrics.tpot_ms"], self.tpot_ms),
            "KL": (run["quality_loss"], self.kl),
            "accuracy": (run.get("metrics.retrieval_accuracy", math.nan), self.accuracy),
        }


MINIMUMS = ("accuracy",)  # limits a run must reach; the others it must stay under


# Each limit's figure, as the catalogue shows it
LIMIT_METRICS = {
    "memory": "peak_memory_bytes",
    "TPOT": "tpot_ms",
    "KL": "kl_vs_reference",
    "accuracy": "retrieval_accuracy",
}


def _figure(name: str, value: float) -> str:
    return workloads.metrics()[LIMIT_METRICS[name]].show(value)


def _miss_text(run, name: str, overshoot: float, limits: Limits) -> str:
    value, limit = limits.checks(run)[name]
    if math.isinf(overshoot):
        rerun = {"KL": " (run it with quality=on)", "accuracy": " (run it with workload=passkey)"}
        return f"{name} not measured" + rerun.get(name, "")
    if name in MINIMUMS:
        return f"{name} {_figure(name, value)}, below {_figure(name, limit)}"
    return f"{name} by {overshoot:.0%} ({_figure(name, value)} vs {_figure(name, limit)})"


def summary(run, limits: Limits, baseline=None) -> str:
    """'static+compile: TPOT 31.2 ms vs 40.1 ms for dynamic (-22%), peak 612 MiB within 8 GiB, lossless'."""
    tpot = run["metrics.tpot_ms"]
    parts = [f"TPOT {_figure('TPOT', tpot)}"]
    if baseline is not None:
        base = baseline["metrics.tpot_ms"]
        parts[0] += f" vs {_figure('TPOT', base)} for {baseline['label']} ({tpot / base - 1:+.0%})"
    elif limits.tpot_ms is not None:
        parts[0] += f" within {limits.tpot_ms:g} ms"
    parts.append(
        f"peak {_figure('memory', run['memory_bytes'])}"
        + (f" within {_figure('memory', limits.memory_bytes)}" if limits.memory_bytes is not None else "")
    )
    lossless = is_lossless(run["strategy"]) and run["quality_loss"] == 0
    if lossless:
        parts.append("lossless")
    elif run["quality_loss"] == run["quality_loss"]:  # not NaN: measured
        parts.append(
            f"KL {_figure('KL', run['quality_loss'])}" + (f" within {limits.kl:g}" if limits.kl is not None else "")
        )
    accuracy = run.get("metrics.retrieval_accuracy", math.nan)
    if accuracy == accuracy:  # not NaN: a passkey run
        bound = f" (at least {_figure('accuracy', limits.accuracy)})" if limits.accuracy is not None else ""
        parts.append(f"passkey retrieval {_figure('accuracy', accuracy)}{bound}")
    if run.get("contended"):
        others = run.get("metrics.other_cpu_cores", float("nan"))
        held = f"{others:.1f} cores" if others == others else "the cores"
        parts.append(f"CONTENDED: other processes held {held} while it measured, so every timing is slow")
    elif run.get("noisy"):
        noise = catalogue.get("timing_noise_cv").show(run.get("metrics.timing_noise_cv", float("nan")))
        parts.append(f"NOISY: TTFT or TPOT varied by {noise} between calls of one shape or between a call's tokens")
    return f"{run['label']}: " + ", ".join(parts)


def choose(runs, limits: Limits):
    """(chosen run or None, why): the guide's rules over measured runs, in order."""
    runs = runs.assign(kind=runs["strategy"].map(family), tpot=runs["metrics.tpot_ms"])
    ok = runs[[not limits.misses(run) for _, run in runs.iterrows()]].sort_values(["tpot", "quality_loss"])
    best = {kind: group.iloc[0] for kind, group in ok.groupby("kind")}
    dynamic, static = best.get(DYNAMIC), best.get(STATIC)
    if dynamic is not None:
        if static is not None and static["tpot"] <= (1 - PAYS_OFF) * dynamic["tpot"]:
            return static, (
                summary(static, limits, dynamic),
                f"a fixed cache pays off: at least {PAYS_OFF:.0%} faster than dynamic, both within limits",
            )
        note = "" if static is None else "; " + _static_versus_dynamic(static, dynamic)
        return dynamic, (summary(dynamic, limits), "dynamic meets every limit and grows only as needed" + note)
    dense = runs[runs["kind"].isin(DENSE)]
    if static is not None:
        return static, (
            summary(static, limits, None),
            _closest_text(dense[dense["kind"] == DYNAMIC], limits) or "no dynamic run was measured",
        )
    binds = limits.memory_bytes is not None and not dense.empty and (dense["memory_bytes"] > limits.memory_bytes).all()
    for kind in MEMORY_SAVERS:  # lossless before lossy, when both fit
        if kind in best:
            if binds:
                why = (
                    f"memory binds: dense caches need at least {human_bytes(dense['memory_bytes'].min())}, over "
                    f"the {human_bytes(limits.memory_bytes)} budget; {best[kind]['label']} fits"
                )
            elif dense.empty:
                why = f"no dynamic or static run was measured; {best[kind]['label']} is the fastest within limits"
            else:
                why = "the dense caches miss the limits: " + _closest_text(dense, limits)
            return best[kind], (summary(best[kind], limits), why)
    return None, ("no measured run meets the limits", "closest: " + _closest_text(runs, limits))


def _static_versus_dynamic(static, dynamic) -> str:
    """'static decodes 12% slower than dynamic (TPOT 3.3 vs 2.9 ms); a fixed cache pays only when it
    is at least 10% faster'."""
    change = static["tpot"] / dynamic["tpot"] - 1
    pace = f"{abs(change):.0%} {'slower' if change > 0 else 'faster'}" if round(change, 2) else "as fast"
    return (
        f"{static['label']} decodes {pace} than {dynamic['label']} (TPOT {static['tpot']:.1f} vs "
        f"{dynamic['tpot']:.1f} ms); a fixed cache pays only when it is at least {PAYS_OFF:.0%} faster"
    )


def _closest_text(runs, limits: Limits) -> str:
    """The run nearest to meeting every limit (smallest worst overshoot), and by how much it misses."""
    if runs.empty:
        return ""
    misses = [
        (max(m.values()), sorted(m.items(), key=lambda item: item[1]), run)
        for m, run in ((limits.misses(run), run) for _, run in runs.iterrows())
    ]
    _, missed, run = min(misses, key=lambda item: item[0])
    texts = [_miss_text(run, name, overshoot, limits) for name, overshoot in missed]
    return f"{run['label']} (run {run['run_id'][:8]}) misses {'only ' if len(texts) == 1 else ''}" + " and ".join(texts)


# Overrides that shape how a sweep ran, not what a job measured
NOT_REPRODUCED = ("resume=", "sweep_name=", "hydra/", "hydra.", "print_table=")


def use_command(run) -> str:
    """The command that measures this run again: its own recorded Hydra overrides (model, workload
    and strategy settings as given), or, for runs recorded before kvpipe kept them, the strategy's
    overrides from the registry."""
    recorded = run.get("tags.kvpipe.overrides")
    if isinstance(recorded, str):
        words = [] if recorded == "(defaults)" else shlex.split(recorded)
        return shlex.join(["python", "-m", "kvpipe", *(w for w in words if not w.startswith(NOT_REPRODUCED))])
    return "python -m kvpipe " + " ".join(cache_overrides(run))


def cache_overrides(run) -> list[str]:
    """The strategy, backend and axis settings of a run, as overrides (from the registry)."""
    params = {
        name.removeprefix("params."): str(value)
        for name, value in run.items()
        if name.startswith("params.") and isinstance(value, str)
    }
    strategy = cache.get(params.get("cache.strategy") or run["strategy"])
    return strategy.command_overrides(params)


def snippet(run) -> str:
    """Python that applies the same cache in the user's own `model.generate(...)` (kvpipe.api builds
    the cache object the run measured, for the installed transformers)."""
    new_tokens = run.get("params.workload.max_new_tokens")
    new_tokens = new_tokens if isinstance(new_tokens, str) else "32"
    settings = json.dumps(" ".join(cache_overrides(run)))
    return (
        "from kvpipe import api\n"
        f"kwargs = api.cache_kwargs(model, {settings}, prompt_tokens=inputs['input_ids'].shape[1], "
        f"max_new_tokens={new_tokens})\n"
        f"output = model.generate(**inputs, max_new_tokens={new_tokens}, **kwargs)"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--memory-budget", metavar="SIZE", help="e.g. 8GiB, 512MiB, 24GB, 1e9 (default: none)")
    parser.add_argument("--max-tpot-ms", type=float, metavar="MS", help="time per output token (default: none)")
    parser.add_argument(
        "--max-kl",
        type=float,
        metavar="NATS",
        help=f"KL divergence vs the full-precision reference (default: {DEFAULT_KL}, or none with --min-accuracy)",
    )
    parser.add_argument(
        "--min-accuracy",
        type=float,
        metavar="FRACTION",
        help="passkey retrieval accuracy, from runs with workload=passkey, e.g. 0.9; the quality limit in "
        "place of the default --max-kl (default: none)",
    )
    parser.add_argument("--all", action="store_true", help="every FINISHED run in the experiment, not one sweep")
    add_source_arguments(parser)


def limits_from(memory_budget: str | None, max_tpot_ms, max_kl, min_accuracy) -> Limits:
    """The user's limits, checked (one-line errors naming the flag), as recommend, advise and the
    search read them."""
    for name, value in (("--max-tpot-ms", max_tpot_ms), ("--max-kl", max_kl)):
        if value is not None and not value >= 0:
            raise ConfigError(name, value, "expected a number ≥ 0")
    if min_accuracy is not None and not 0 <= min_accuracy <= 1:
        raise ConfigError("--min-accuracy", min_accuracy, "expected a fraction from 0 to 1, e.g. 0.9")
    budget = parse_bytes(memory_budget) if memory_budget is not None else None
    # One quality limit by default: KL, or retrieval accuracy when asked for (passkey runs score
    # their answers, and their KL would be over the reference's rambling past the answer); both when both are given
    kl = max_kl if max_kl is not None or min_accuracy is not None else DEFAULT_KL
    return Limits(memory_bytes=budget, tpot_ms=max_tpot_ms, kl=kl, accuracy=min_accuracy)


def run(args: argparse.Namespace) -> int:
    """0 and the strategy to use per workload, or 1 and the limit closest to being met."""
    limits = limits_from(args.memory_budget, args.max_tpot_ms, args.max_kl, args.min_accuracy)
    runs, parent_run = load_runs(
        args.experiment, args.parent, args.tracking_uri, whole_experiment=args.all, spelled=args.uri_spelling
    )
    source = f"sweep {parent_run.info.run_id[:8]}" if parent_run else f"experiment {args.experiment!r}"
    print(f"limits: {limits.describe()} · {len(runs)} measured runs of {model_names(runs)} from {source}")
    missing = 0
    for workload, group in runs.groupby("workload", sort=False):  # strategies compete within one workload
        if workload:
            print(f"{workload}:")
        chosen, (what, why) = choose(group, limits)
        if chosen is None:
            print(f"{what}\n  {why}")
            missing += 1
        else:
            code = "\n".join("    " + line for line in snippet(chosen).splitlines())
            print(
                f"recommend: {chosen['label']} (run {chosen['run_id']})\n  {what}\n  why: {why}\n"
                f"  use: {use_command(chosen)}\n  in your own generate() call:\n{code}"
            )
    return 1 if missing else 0
