"""Recommend: the cache strategy to use under memory, latency and quality limits, from measured runs.

The guide's rules, in order, over the runs that meet every limit: dynamic, which grows only as needed,
unless static (or static+compile) is at least 10% faster; static when dynamic misses a limit; when memory
binds (every dense run is over budget), offloaded (lossless) before the lossy savers: quantized caches
and caches a press evicted from (kvpipe.cache.presses), alone or together, the fastest within --max-kl
and --min-accuracy.
Otherwise no recommendation, and the run that comes closest, with the limits it misses.
"""

from __future__ import annotations

import json
import math
import shlex

from kvpipe import cache, catalogue
from kvpipe.decide import paired
from kvpipe.decide.limits import ANSWER_QUALITY, Limits, limit_named, shown
from kvpipe.decide.runs import evicts, judge_of
from kvpipe.record import table as run_table
from kvpipe.record import tags as mlflow_tags
from kvpipe.units import human_bytes

PAYS_OFF = 0.10  # static must beat dynamic's TPOT by this much to be worth a fixed, preallocated cache
# the guide's rules are written per family
DYNAMIC, STATIC, OFFLOADED, QUANTIZED = (
    cache.Family.DYNAMIC,
    cache.Family.STATIC,
    cache.Family.OFFLOADED,
    cache.Family.QUANTIZED,
)
DENSE, MEMORY_SAVERS = (DYNAMIC, STATIC), (OFFLOADED, QUANTIZED)  # lossless before lossy, when memory binds


TPOT = catalogue.get("tpot_ms")


def family(strategy: str, press: str | None = None) -> str | None:
    """What the registry says recommend should weigh this strategy as; a cache a press evicted from
    is weighed with the quantized ones: smaller, and lossy."""
    if press is not None and evicts(press) and strategy in cache.REGISTRY:
        return QUANTIZED
    return cache.REGISTRY[strategy].family if strategy in cache.REGISTRY else None


def engine_family(lossless: str) -> str:
    """An engine's run (its own KV cache): its full-precision cache weighed as the dynamic one, a
    quantized one with the quantized caches (smaller, and lossy)."""
    return DYNAMIC if lossless == "true" else QUANTIZED


def _figure(name: str, value: float) -> str:
    return shown(name, value)


def _miss_text(run, name: str, overshoot: float, limits: Limits) -> str:
    value, limit = limits.checks(run)[name]
    if math.isinf(overshoot):
        return f"{name} not measured" + limit_named(name).unmeasured
    if limit_named(name).minimum:
        return f"{name} {_figure(name, value)}, below {_figure(name, limit)}"
    return f"{name} by {overshoot:.0%} ({_figure(name, value)} vs {_figure(name, limit)})"


def account(run, limits: Limits, baseline=None) -> str:
    """'static+compile: TPOT 31.2 ms vs 40.1 ms for dynamic (-22%), peak 612 MiB within 8 GiB, lossless'."""
    tpot = run[TPOT.column]
    parts = [f"TPOT {_figure('TPOT', tpot)}"]
    if baseline is not None:
        base = baseline[TPOT.column]
        parts[0] += f" vs {_figure('TPOT', base)} for {baseline['label']} ({tpot / base - 1:+.0%})"
    elif limits.tpot_ms is not None:
        parts[0] += f" within {limits.tpot_ms:g} ms"
    parts.append(
        f"peak {_figure('memory', run['memory_bytes'])}"
        + (f" within {_figure('memory', limits.memory_bytes)}" if limits.memory_bytes is not None else "")
    )
    if run["lossless"] and run["quality_loss"] == 0:
        parts.append("lossless")
    elif run["quality_loss"] == run["quality_loss"]:  # not NaN: measured
        parts.append(
            f"KL {_figure('KL', run['quality_loss'])}" + (f" within {limits.kl:g}" if limits.kl is not None else "")
        )
    accuracy = run.get(ANSWER_QUALITY.name, math.nan)
    if accuracy == accuracy:  # not NaN: its workload judged its answers (passkey: its retrieval)
        bound = f" (at least {_figure('accuracy', limits.accuracy)})" if limits.accuracy is not None else ""
        parts.append(f"{judge_of(run).metric.label} {_figure('accuracy', accuracy)}{bound}")
    if run.get("contended"):
        others = run.get(catalogue.column("other_cpu_cores"), float("nan"))
        held = f"{others:.1f} cores" if others == others else "the cores"
        parts.append(f"CONTENDED: other processes held {held} while it measured, so every timing is slow")
    elif run.get("noisy"):
        noise_cv = catalogue.get("timing_noise_cv")
        noise = noise_cv.show(run.get(noise_cv.column, float("nan")))
        parts.append(f"NOISY: TTFT or TPOT varied by {noise} between calls of one shape or between a call's tokens")
    return f"{run['label']}: " + ", ".join(parts)


def choose(runs, limits: Limits):
    """(chosen run or None, why): the guide's rules over measured runs, in order."""
    lossless = runs.get(mlflow_tags.column(mlflow_tags.ENGINE_LOSSLESS), [None] * len(runs))
    kinds = [
        family(s, p) if e is None or e != e else engine_family(e)
        for s, p, e in zip(runs["strategy"], runs["press"], lossless)
    ]
    runs = runs.assign(kind=kinds, tpot=runs[TPOT.column])
    ok = runs[[not limits.misses(run) for _, run in runs.iterrows()]].sort_values(["tpot", "quality_loss"])
    best, ties = {}, {}
    for kind, group in ok.groupby("kind"):
        best[kind], ties[kind] = fastest_supported(group)
    dynamic, static = best.get(DYNAMIC), best.get(STATIC)
    if dynamic is not None:
        faster = None if static is None else paired.ratio(static, dynamic)
        supported = faster is None or faster.clear  # runs without round means: their point figures, as before
        if static is not None and static["tpot"] <= (1 - PAYS_OFF) * dynamic["tpot"] and supported:
            return static, (
                account(static, limits, dynamic),
                f"a fixed cache pays off: at least {PAYS_OFF:.0%} faster than dynamic, both within limits"
                + (f" (TPOT {faster.figures()} of dynamic's)" if faster else "")
                + ties[STATIC],
            )
        note = "" if static is None else "; " + _static_versus_dynamic(static, dynamic, faster)
        grows = "grows only as needed" if dynamic["label"] == DYNAMIC else "keeps keys and values at full precision"
        return dynamic, (
            account(dynamic, limits),
            f"{dynamic['label']} meets every limit and {grows}" + note + ties[DYNAMIC],
        )
    dense = runs[runs["kind"].isin(DENSE)]
    if static is not None:
        return static, (
            account(static, limits, None),
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
                pace = "as fast as any the runs can tell apart" if ties[kind] else "the fastest"
                why = f"no dynamic or static run was measured; {best[kind]['label']} is {pace} within limits"
            else:
                why = "the dense caches miss the limits: " + _closest_text(dense, limits)
            return best[kind], (account(best[kind], limits), why + ties[kind])
    return None, ("no measured run meets the limits", "closest: " + _closest_text(runs, limits))


def fastest_supported(group) -> tuple[object, str]:
    """The run to take of one family (sorted fastest first), and why where it is not the fastest: runs
    whose TPOT is not clearly different from the fastest's (the same within 2%, or not yet decided) tie on
    latency, and the tie goes to the one better on the other axes: less peak memory, then less
    quality loss."""
    fastest = group.iloc[0]
    tied = [(fastest, None)]
    for _, run in group.iloc[1:].iterrows():
        against = paired.ratio(run, fastest)
        if against is not None and not against.clear:
            tied.append((run, against))
    chosen, against = min(tied, key=lambda pair: (pair[0]["memory_bytes"], _loss(pair[0])))
    if against is None:
        return fastest, ""
    if chosen["memory_bytes"] < fastest["memory_bytes"]:
        why = (
            f"takes less memory ({_figure('memory', chosen['memory_bytes'])} vs "
            f"{_figure('memory', fastest['memory_bytes'])})"
        )
    else:
        why = "loses less quality"
    return chosen, (
        f"; {chosen['label']} over {fastest['label']}: their TPOTs are not clearly apart "
        f"({against.text()}), and {chosen['label']} {why}"
    )


def _loss(run) -> float:
    loss = run["quality_loss"]
    return math.inf if loss != loss else loss  # not measured: last


def _static_versus_dynamic(static, dynamic, faster=None) -> str:
    """'static decodes 12% slower than dynamic (TPOT 3.3 vs 2.9 ms); a fixed cache pays only when it
    is at least 10% faster', or, where their ratio is not clearly apart from 1, its verdict."""
    if faster is not None and not faster.clear:
        return (
            f"{static['label']}'s TPOT against {dynamic['label']}'s: {faster.text()}; a fixed cache is worth "
            "preallocating only for a clear speed-up"
        )
    change = static["tpot"] / dynamic["tpot"] - 1
    pace = f"{abs(change):.0%} {'slower' if change > 0 else 'faster'}" if round(change, 2) else "as fast"
    return (
        f"{static['label']} decodes {pace} than {dynamic['label']} (TPOT {static['tpot']:.1f} vs "
        f"{dynamic['tpot']:.1f} ms); a fixed cache pays only when it is at least {PAYS_OFF:.0%} faster"
    )


def closest(runs, limits: Limits) -> tuple[object, list[str]]:
    """The run nearest to meeting every limit (smallest worst overshoot; every run misses one), and
    what it misses, the nearest miss first, as text."""
    misses = [
        (max(m.values()), sorted(m.items(), key=lambda item: item[1]), run)
        for m, run in ((limits.misses(run), run) for _, run in runs.iterrows())
    ]
    _, missed, run = min(misses, key=lambda item: item[0])
    return run, [_miss_text(run, name, overshoot, limits) for name, overshoot in missed]


def _closest_text(runs, limits: Limits) -> str:
    """The run nearest to meeting every limit, and by how much it misses."""
    if runs.empty:
        return ""
    run, texts = closest(runs, limits)
    return f"{run['label']} (run {run['run_id'][:8]}) misses {'only ' if len(texts) == 1 else ''}" + " and ".join(texts)


# Overrides that shape how a sweep ran, not what a job measured
NOT_REPRODUCED = ("resume=", "sweep_name=", "interleave=", "hydra/", "hydra.", "print_table=")


def use_command(run) -> str:
    """The command that measures this run again: its own recorded Hydra overrides (model, workload
    and the settings its cache reads, as given), or, for runs recorded before kvpipe kept them, the
    strategy's overrides from the registry. A run served by an engine's own server: the command that
    starts that server with the same KV settings (`llama-server ... -ctk q8_0 -ctv q8_0 -fa auto`)."""
    served_by = run.get(mlflow_tags.column(mlflow_tags.ENGINE_COMMAND))
    if isinstance(served_by, str):  # an engine's own server: the engine's own words
        return served_by
    recorded = run.get(mlflow_tags.column(mlflow_tags.OVERRIDES))
    if isinstance(recorded, str):
        words = reproducing([] if recorded == "(defaults)" else shlex.split(recorded), read_by(run))
        params, _, press = _cache_of(run)
        if press.rolled_unsaid(params) and not any(word.startswith("press.rolling=") for word in words):
            words.append("press.rolling=true")  # it rolled, where its recorded words now compress once
        return shlex.join(["python", "-m", "kvpipe", *words])
    return "python -m kvpipe " + " ".join(cache_overrides(run))


def reproducing(words: list[str], read: tuple[str, ...]) -> list[str]:
    """Of the overrides a job ran with, those that measure it again: none that shapes only how a sweep
    ran, and of the groups a cache may read (cache, backend, axis, press) only what this one reads
    (`read`: its fields, from the registry), so that a sweep's backend=quanto never follows cache=dynamic."""
    kept = []
    for word in words:
        name = word.split("=", 1)[0].lstrip("+~")
        group, _, key = name.partition(".")
        if word.startswith(NOT_REPRODUCED):
            continue
        if group in cache.CacheChoice.GROUPS and not _reads(read, group, key):
            continue
        kept.append(word)
    return kept


def _reads(read: tuple[str, ...], group: str, key: str) -> bool:
    if not key:  # the group's option (backend=quanto): read where any of its fields is
        return any(field.startswith(f"{group}.") for field in read)
    return f"{group}.{key}" in read or f"{group}.*" in read


def read_by(run) -> tuple[str, ...]:
    """The cache, backend, axis and press fields the run's cache reads, as the registry says."""
    params, strategy, press = _cache_of(run)
    return (*strategy.read_fields(params.get("backend.name")), *press.read_fields(),
            *(("press.protocol",) if press.evicts else ()))  # fmt: skip


def cache_overrides(run) -> list[str]:
    """The strategy, backend and axis settings of a run, as overrides (from the registry)."""
    params, strategy, press = _cache_of(run)
    return [*strategy.command_overrides(params), *press.command_overrides(params)]


def _cache_of(run) -> tuple[dict[str, str], type, type]:
    """(the run's logged params, its strategy's class, its press's class)."""
    params = run_table.params_in(run)
    strategy = cache.get(params.get("cache.strategy") or run["strategy"])
    return params, strategy, cache.presses.get(params.get("press.name") or "none")


def snippet(run) -> str:
    """Python that applies the same cache in the user's own `model.generate(...)` (kvpipe.api builds
    the cache object the run measured, for the installed transformers); none for a run an engine's
    own server made (its `use:` line starts that server)."""
    if isinstance(run.get(mlflow_tags.column(mlflow_tags.ENGINE_COMMAND)), str):
        return ""
    new_tokens = run.get(run_table.param("workload.max_new_tokens"))
    new_tokens = new_tokens if isinstance(new_tokens, str) else "32"
    settings = json.dumps(" ".join(cache_overrides(run)))
    return (
        "from kvpipe import api\n"
        f"kwargs = api.cache_kwargs(model, {settings}, prompt_tokens=inputs['input_ids'].shape[1], "
        f"max_new_tokens={new_tokens})\n"
        f"output = model.generate(**inputs, max_new_tokens={new_tokens}, **kwargs)"
    )
