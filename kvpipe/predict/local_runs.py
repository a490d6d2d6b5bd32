"""This machine's runs, as a calibration reads them: which runs count (same model, dtype, host,
device, threads and batch; not contended, not fallen back), each run's Sample, and the sweep that
would calibrate a strategy measured at too few prompt lengths."""

from __future__ import annotations

import shlex
import socket
from dataclasses import dataclass

from kvpipe import catalogue
from kvpipe.errors import KvpipeError
from kvpipe.jobspec import override_group
from kvpipe.predict.calibration import Sample
from kvpipe.predict.run_costs import BATCH, NEW, PROMPT, TPOT, TTFT
from kvpipe.record import table as run_table
from kvpipe.record import tags as mlflow_tags


@dataclass(frozen=True)
class LocalRuns:
    """The runs a calibration may use, and a line saying which they are (or why there are none)."""

    runs: object  # a DataFrame (kvpipe.record.read_back), or None
    said: str
    store: str | None = None


def read_local_runs(spec, dtype: str, device: str, threads: int, prompt_lengths: list[int] | None = None) -> LocalRuns:
    """The experiment's FINISHED runs of this model and dtype, on this host and device (on CPU, with
    these torch threads: another thread count is another machine to the roofline), at the plan's
    batch size, neither contended nor fallen back to another strategy. Every run counts, a
    measurement's repeats included: each length is fitted at the median of its runs, which a run
    slower than the others (noisy or not) does not move. prompt_lengths: only the runs at these
    (plan --calibrate-on), the others held out to check the predictions against."""
    from pathlib import Path

    from kvpipe.record.read_back import column, read_runs
    from kvpipe.record.store import resolve_uri

    experiment, host, batch = spec.tracking.experiment, socket.gethostname(), spec.workload.batch_size
    store = resolve_uri(spec.tracking.uri, Path.cwd())[1]
    try:
        runs, _ = read_runs(experiment, None, spec.tracking.uri, whole_experiment=True, spelled="tracking.uri",
                            every_repeat=True)  # fmt: skip
    except KvpipeError as exc:
        return LocalRuns(None, f"no runs to calibrate with: {exc}", store)
    wanted = {run_table.param("model.name"): spec.model.name, run_table.param("model.dtype"): dtype, mlflow_tags.column(mlflow_tags.HOST): host,
              mlflow_tags.column(mlflow_tags.DEVICE): device}  # fmt: skip
    if device == "cpu":
        wanted[mlflow_tags.column(mlflow_tags.TORCH_THREADS)] = str(threads)
    keep = column(runs, BATCH) == batch
    for name, value in wanted.items():
        keep &= column(runs, name, None) == value
    contended = column(runs, mlflow_tags.column(mlflow_tags.CONTENDED), "").fillna("") == "true"
    keep &= ~contended & column(runs, mlflow_tags.column(mlflow_tags.FALLBACK_TO), None).isna()
    keep &= column(runs, TPOT).notna() & column(runs, TTFT).notna()
    if prompt_lengths:
        keep &= column(runs, PROMPT).round().isin(prompt_lengths)
    what = " · ".join([spec.model.name, dtype, device, f"host {host}"] + ([f"{threads} torch threads"] if device == "cpu"
                      else []) + [f"batch {batch}"])  # fmt: skip
    if prompt_lengths:
        what += " at " + ", ".join(str(n) for n in sorted(prompt_lengths)) + " prompt tokens"
    said = f"{int(keep.sum())} of the {len(runs)} FINISHED runs in experiment {experiment!r} ({store}) are {what}"
    return LocalRuns(runs[keep], said, store)


def matching(runs, variant):
    """The runs whose cache settings are exactly the variant's (every cache, backend and axis field
    its strategy reads, as runs log them)."""
    import pandas as pd

    from kvpipe.record.read_back import column

    wanted = variant.params()
    keep = pd.Series(True, index=runs.index)
    for name in variant.read_fields():
        if not name.endswith(".*"):
            logged = column(runs, run_table.param(name), None)
            same = [(value if isinstance(value, str) else None) == wanted.get(name) for value in logged]
            keep &= pd.Series(same, index=runs.index, dtype=bool)
    return runs[keep]


def samples(runs, variant, costs) -> list[Sample]:
    """The variant's runs among `runs`, each with what its context costs (floors.ModelCosts)."""
    found = []
    for _, run in matching(runs, variant).iterrows():
        prompt, new = round(run[PROMPT]), max(1, round(run[NEW]))
        cost = costs.at(variant.strategy, prompt, new)
        halves = [_half(run, figure) for figure in ("tpot_ms", "ttft_ms")]
        found.append(Sample.of(run["run_id"], cost, float(run[TPOT]), float(run[TTFT]), *halves))
    return found


def _half(run, figure: str) -> float | None:
    """Half the run's 95% interval of a figure; None where it recorded none (runs before intervals)."""
    metric = catalogue.get(figure)
    low, high = run.get(metric.companion("ci_low")), run.get(metric.companion("ci_high"))
    if low is None or high is None or low != low or high != high:
        return None
    return (float(high) - float(low)) / 2


def calibrating_command(spec, variant, measured: list[int], new_tokens: int, cap: int) -> str:
    """The sweep that would calibrate the variant: its cache settings at two prompt lengths (one it
    was measured at, where it was), with the plan's other overrides."""
    room = cap - new_tokens
    lengths = [length for length in (512, 2048) if length <= room] or [max(1, room // 8), max(2, room // 2)]
    if measured:
        other = measured[0] * 4 if measured[0] * 4 <= room else max(1, measured[0] // 4)
        lengths = [measured[0], other]
    kept = [o for o in spec.overrides if override_group(o) not in ("cache", "backend", "axis")
            and not o.startswith(("workload=", "workload.prompt_tokens=", "quality="))]  # fmt: skip
    words = [*kept, *type(variant.strategy).command_overrides(variant.params()), "workload=long_context",
             f"workload.prompt_tokens={','.join(str(n) for n in sorted(set(lengths)))}", "quality=off"]  # fmt: skip
    if f"workload.max_new_tokens={new_tokens}" not in words:
        words.append(f"workload.max_new_tokens={new_tokens}")
    return "kvpipe -m " + shlex.join(words)
