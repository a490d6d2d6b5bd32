"""Why a cache that holds fewer KV bytes can still peak higher, in one line: what recommend, advise
and compare print beside such a pair of runs.

A quantized cache stores a few bits a value, yet each decode step dequantizes a layer back to the
model's dtype, and its backend brings code and buffers of its own. On a short context these outweigh
the bytes saved. The line gives the measured gap; the transient plan's accounting counts (Cost's
memory: weights + KV + the larger of the prefill's activation and the dequantized copy); the rest of
the gap, which the accounting does not count; and, were that rest fixed, the context from which the
saving outgrows the gap.
"""

from __future__ import annotations

import math

from kvpipe import catalogue
from kvpipe.predict.floors import split
from kvpipe.predict.run_costs import BATCH, NEW, PROMPT, job_costs, job_spec
from kvpipe.record import table as run_table
from kvpipe.record import tags as mlflow_tags
from kvpipe.units import human_bytes, sizes_apart

KV, PEAK = catalogue.column("kv_cache_bytes"), "memory_bytes"
# The least difference, as a share of the reference's figure, that a line is about: a process's peak on
# CPU moves by a few percent from run to run with what its libraries allocate, and a KV size a few
# percent apart is the same cache to a reader; below it "holds 1.0x fewer ... yet peaks 568 KiB higher"
# would be about noise and rounding.
NOTICEABLE = 0.05


def explain(runs, reference) -> str | None:
    """The line for the run beside `reference` that saves the most KV bytes yet peaks higher (and how
    many more do likewise), or None where no run does."""
    savers = smaller_but_higher(runs, reference)
    return tradeoff_line(savers[0], reference, others=len(savers) - 1) if savers else None


def smaller_but_higher(runs, reference) -> list:
    """The runs beside `reference` (same model, batch and prompt) that hold fewer KV bytes than it
    yet peak higher, each by more than NOTICEABLE of the reference's, the largest saving first."""
    found = []
    for _, run in runs.iterrows():
        same_job = all(_same(run.get(name), reference.get(name)) for name in _SAME_JOB)
        # comparisons with NaN are False: a run without a measured KV size or peak is never one
        fewer = run.get(KV, math.nan) < (1 - NOTICEABLE) * reference.get(KV, math.nan)
        if same_job and fewer and run[PEAK] > (1 + NOTICEABLE) * reference[PEAK]:
            found.append(run)
    return sorted(found, key=lambda run: run[KV])


_SAME_JOB = (
    run_table.param("model.name"),
    run_table.param("model.dtype"),
    BATCH,
    PROMPT,
    NEW,
    mlflow_tags.column(mlflow_tags.DEVICE),
)


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def tradeoff_line(saver, reference, others: int = 0) -> str:
    """'quanto int4 kivi holds 3.0x fewer KV bytes than dynamic (7.5 vs 22.5 MiB) yet peaks 64 MiB
    higher (1.0 GiB vs 940.5 MiB): ...'; where the runs' jobs no longer compose, the measured part alone."""
    kv_ratio = reference[KV] / saver[KV] if saver[KV] > 0 else math.inf
    gap = saver[PEAK] - reference[PEAK]
    line = (
        f"{saver['label']} holds {kv_ratio:.{1 if kv_ratio >= 2 else 2}f}× fewer KV bytes than {reference['label']} "
        f"({sizes_apart(saver[KV], reference[KV])}) yet peaks {human_bytes(gap)} higher "
        f"({sizes_apart(saver[PEAK], reference[PEAK])})"
    )
    likewise = f"; {others} more {'caches do' if others > 1 else 'cache does'} likewise" if others else ""
    return line + _accounted(saver, reference, gap) + likewise


def _accounted(saver, reference, gap: float) -> str:
    """': plan's accounting counts its decode's 1.4 MiB dequantized copy of one layer against 15.0
    MiB of KV saved; the other 78 MiB is outside it (...); were that fixed, it would peak lower from
    about 6,100 tokens of context (now 73)', or '' where the runs' jobs cannot be composed again. On
    CPU the peak is the whole process's, so the rest holds what the backend's (or an earlier job's)
    libraries brought into it as well as working buffers."""
    pair = [_costed(run) for run in (saver, reference)]
    if any(found is None for found in pair):
        return ""
    (saver_spec, costs), (reference_spec, _) = pair
    new_tokens = max(1, round(saver[NEW]))
    now = round(saver[PROMPT]) + new_tokens

    def at(context: int):
        prompt, new = split(context, new_tokens)
        return costs.at(saver_spec.strategy, prompt, new), costs.at(reference_spec.strategy, prompt, new)

    def predicted_gap(context: int) -> int:  # the saver's memory minus the reference's, by plan's accounting
        saver_cost, reference_cost = at(context)
        return saver_cost.memory_bytes - reference_cost.memory_bytes

    saver_now, reference_now = at(now)
    copy, saved = saver_now.dequantized_copy_bytes, reference_now.kv_cache_bytes - saver_now.kv_cache_bytes
    covered = copy <= max(saver_now.activation_bytes, reference_now.dequantized_copy_bytes)
    what = (
        f"plan's accounting counts its decode's {human_bytes(copy)} dequantized copy of one layer"
        + (" (within the prefill's larger activation)" if covered else "")
        + f" against {human_bytes(saved)} of KV saved"
        if copy
        else f"plan's accounting counts no transient of its own against {human_bytes(saved)} of KV saved"
    )
    rest = gap - predicted_gap(now)
    cap = costs.shape.context_cap
    wins_from = _first_context(lambda context: rest + predicted_gap(context) < 0, now, cap)
    if wins_from is None:
        where = f"even were that fixed, it would not peak lower within the model's {cap:,}-token context"
    else:
        where = f"were that fixed, it would peak lower from about {wins_from:,} tokens of context (now {now:,})"
    on_cpu = str(saver.get(mlflow_tags.column(mlflow_tags.DEVICE))) == "cpu"
    whose = (
        "the process's peak counts libraries and buffers too" if on_cpu else "working buffers, the allocator's slack"
    )
    return f": {what}; the other {human_bytes(rest)} is outside it ({whose}); {where}"


def _costed(run):
    """(the run's Spec, its model's costs), or None where its job no longer composes."""
    spec = job_spec(str(run.get(mlflow_tags.column(mlflow_tags.OVERRIDES))))
    if spec is None or not isinstance(run.get(BATCH), float):
        return None
    dtype, device = str(run.get(run_table.param("model.dtype"))), str(run.get(mlflow_tags.column(mlflow_tags.DEVICE)))
    costs = job_costs(spec, dtype, int(run[BATCH]), device)
    return None if costs is None else (spec, costs)


def _first_context(wins, low: int, cap: int) -> int | None:
    """The least context in (low, cap] where wins(context) holds, taking it to hold from there on
    (the saving grows with the context faster than a layer's copy does); None where it holds nowhere."""
    if low >= cap or not wins(cap):
        return None
    high = cap
    while low + 1 < high:  # wins(high) holds; wins(low) does not
        middle = (low + high) // 2
        low, high = (low, middle) if wins(middle) else (middle, high)
    return high
