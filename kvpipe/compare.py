"""Compare: a sweep's FINISHED runs as one table of what varies, a Pareto front, and plots."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from kvpipe.errors import ConfigError, KvpipeError
from kvpipe.report import human_bytes

log = logging.getLogger(__name__)

LOSSLESS = ("dynamic", "static", "offloaded", "offloaded_static")
# Said by the cache label (quantized:quanto:int4:kivi, static+compile), or measuring nothing at all.
IN_LABEL = ("cache.strategy", "cache.compile", "backend.name", "backend.nbits", "axis.layout")
NOT_MEASURED = ("tracking.", "print_table", "resume", "sweep_name")
CACHE_PARAMS = ("cache.", "backend.", "axis.")  # the rest says what was measured: the workload
CONTEXT_PARAMS = ("workload.kind", "workload.prompts", "workload.prompt_tokens")  # the x axis covers these
FINISHED = "attributes.status = 'FINISHED' and tags.`kvpipe.status` = 'FINISHED'"
KEY = "tags.kvpipe.measurement_key"
OUTPUT_FILES = ("compare.md", "compare.csv", "memory_vs_context.png", "tpot_vs_memory.png")
FOOTNOTE = ("★ Pareto front of each workload over peak memory, TPOT and KL (lower is better; lossy runs without a "
            "quality pass are left off). Peak memory includes the weights (CPU: RSS growth + weights_bytes).")
MIB = 2**20


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    """--experiment, --parent, --tracking-uri: which runs to read (shared with recommend)."""
    parser.add_argument("--experiment", default="kvpipe", help="MLflow experiment (default: kvpipe)")
    parser.add_argument("--parent", metavar="RUN_ID", help="a sweep's parent run (default: the latest sweep)")
    parser.add_argument("--tracking-uri", metavar="URI",
                        help="MLflow store (default: sqlite:///<current dir>/outputs/mlflow.db)")


def load_runs(experiment: str, parent: str | None, tracking_uri: str | None, whole_experiment: bool = False):
    """(FINISHED runs with derived columns, parent Run or None): one sweep's, or the whole experiment's."""
    import mlflow
    from mlflow.exceptions import MlflowException

    from kvpipe.config import TrackingConfig
    from kvpipe.tracking import DB_FILE

    uri = tracking_uri or f"sqlite:///{(Path.cwd() / TrackingConfig().store_dir / DB_FILE).resolve()}"
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        # MLflow would create an empty database and then find nothing in it
        raise ConfigError("--tracking-uri", uri, "no MLflow store there; expected the launch dir's "
                          "outputs/mlflow.db (cd there) or --tracking-uri URI")
    mlflow.set_tracking_uri(uri)
    if parent:
        try:
            parent_run = mlflow.get_run(parent)
        except MlflowException:
            raise ConfigError("--parent", parent, f"no such run in {uri}; expected a sweep's parent run id, "
                              "or no --parent for the latest sweep") from None
        if parent_run.data.tags.get("kvpipe.sweep") != "true":
            raise ConfigError("--parent", parent, "that run is one job, not a sweep; expected a sweep's parent run")
        experiment_id = parent_run.info.experiment_id
    else:
        found = mlflow.get_experiment_by_name(experiment)
        if found is None:
            names = ", ".join(e.name for e in mlflow.search_experiments())
            raise ConfigError("--experiment", experiment, f"no such experiment in {uri}; expected one of: {names}")
        experiment_id, parent_run = found.experiment_id, None
        if not whole_experiment:
            sweeps = mlflow.search_runs([experiment_id], "tags.`kvpipe.sweep` = 'true'", max_results=1,
                                        order_by=["attributes.start_time DESC"], output_format="list")
            if not sweeps:
                raise ConfigError("--experiment", experiment, "it holds no sweep yet; run one with "
                                  "`python -m kvpipe -m cache=dynamic,static,quantized`")
            parent_run = sweeps[0]
    runs = _search(experiment_id, FINISHED) if parent_run is None else _sweep_runs(experiment_id, parent_run)
    if runs.empty:
        where = f"sweep {parent_run.info.run_id}" if parent_run else f"experiment {experiment!r}"
        raise KvpipeError(f"{where} has no FINISHED runs; its jobs failed or were skipped (see their result.json)")
    return with_derived(_latest_per_key(runs)), parent_run


def _search(experiment_id: str, filter_string: str) -> pd.DataFrame:
    import mlflow

    return mlflow.search_runs([experiment_id], filter_string, output_format="pandas")


def _sweep_runs(experiment_id: str, parent_run) -> pd.DataFrame:
    """The sweep's children, plus the earlier runs its jobs were skipped for under resume=true."""
    runs = _search(experiment_id, f"tags.`mlflow.parentRunId` = '{parent_run.info.run_id}' and {FINISHED}")
    sweep_dir = Path(parent_run.data.tags.get("kvpipe.sweep_dir", "/nonexistent"))
    results = [json.loads(path.read_text()) for path in sweep_dir.glob("*/result.json")]
    skipped = {doc.get("measurement_key") for doc in results if doc.get("status") == "SKIPPED"}
    skipped -= set(runs.get(KEY, ())) | {None}  # a duplicate within the sweep is a child already
    if skipped:
        earlier = _search(experiment_id, FINISHED)
        runs = pd.concat([runs, earlier[earlier[KEY].isin(skipped)]])
    return runs


def _latest_per_key(runs: pd.DataFrame) -> pd.DataFrame:
    """One run per measurement, the latest: a re-run replaces its row rather than doubling it."""
    runs = runs.sort_values("start_time") if "start_time" in runs else runs
    if KEY in runs:
        runs = runs[~(runs.duplicated(KEY, keep="last") & runs[KEY].notna())]
    return runs.reset_index(drop=True)


def _column(frame: pd.DataFrame, name: str, default=float("nan")) -> pd.Series:
    return frame[name] if name in frame else pd.Series(default, index=frame.index)


def with_derived(runs: pd.DataFrame) -> pd.DataFrame:
    """Add label, strategy, memory_bytes, quality_loss, context_tokens, workload and pareto columns."""
    runs = runs.copy()
    requested = _column(runs, "tags.kvpipe.cache.requested", None).fillna(_column(runs, "params.cache.strategy", ""))
    effective = _column(runs, "tags.kvpipe.cache.effective", None).fillna(requested)
    runs["strategy"] = effective.str.split(r"[:+]", regex=True).str[0]
    # Offloaded on a CPU runs as dynamic: say both, so the row is not mistaken for either.
    runs["label"] = [e if e.startswith(r) else f"{r} (as {e})" for r, e in zip(requested, effective)]
    # On CUDA the allocator's peak includes the weights; on CPU the figure is RSS growth during the call,
    # which leaves out weights loaded before it. Add them back so rows (and a budget) compare totals.
    growth = _column(runs, "tags.kvpipe.peak_memory_source", "") != "cuda_max_memory_allocated"
    runs["memory_bytes"] = (_column(runs, "metrics.peak_memory_bytes")
                            + _column(runs, "metrics.weights_bytes").fillna(0).where(growth, 0))
    # Without a quality pass only a lossless strategy has a known loss.
    lossless = pd.Series(0.0, index=runs.index).where(runs["strategy"].isin(LOSSLESS))
    runs["quality_loss"] = _column(runs, "metrics.kl_vs_reference").fillna(lossless)
    # The measured prompt length: workload.prompt_tokens means nothing to a chat workload.
    runs["context_tokens"] = _column(runs, "metrics.prompt_tokens").fillna(
        pd.to_numeric(_column(runs, "params.workload.prompt_tokens"), errors="coerce"))
    # A short prompt beats a long one on every axis: strategies compete within one workload only.
    runs["workload"] = describe(runs, [p for p in varying_params(runs) if not p.startswith(CACHE_PARAMS)], full=True)
    runs["pareto"] = False
    for _, group in runs.groupby("workload"):
        runs.loc[group.index, "pareto"] = pareto_front(group)
    return runs


def pareto_front(runs: pd.DataFrame) -> pd.Series:
    """True where no other run is as good on memory, TPOT and quality loss, and better on one."""
    points = np.column_stack([runs["memory_bytes"], _column(runs, "metrics.tpot_ms"), runs["quality_loss"]])
    points = points.astype(float)
    known = points[~np.isnan(points).any(axis=1)]  # unknown loss or no timing: no claim either way
    return pd.Series([not np.isnan(p).any() and not ((known <= p).all(axis=1) & (known < p).any(axis=1)).any()
                      for p in points], index=runs.index, dtype=bool)


def _applies(param: str, runs: pd.DataFrame) -> pd.Series:
    """Which runs' strategies read this param (as Plan.measurement_key decides)."""
    strategy = _column(runs, "params.cache.strategy", "")
    if param.startswith(("backend.", "axis.")):
        fp8 = _column(runs, "params.backend.name", "") == "fp8"
        return (strategy == "quantized") & ~(fp8 & (param not in ("backend.name", "backend.nbits")))
    if param in ("cache.max_cache_len", "cache.compile"):
        return strategy.isin(("static", "offloaded_static"))
    if param in ("workload.prompts", "workload.prompt_tokens"):
        return _column(runs, "params.workload.kind", "") == ("chat" if param == "workload.prompts" else "long_context")
    return pd.Series(True, index=runs.index)


def param_values(runs: pd.DataFrame, param: str) -> list[str]:
    """The param as shown: blank where the run's strategy ignores it."""
    return runs[f"params.{param}"].astype(str).where(_applies(param, runs), "").tolist()


def varying_params(runs: pd.DataFrame) -> list[str]:
    """Params with more than one value among the runs that read them: llama-bench's columns."""
    names = [c.removeprefix("params.") for c in runs.columns if c.startswith("params.")]
    names = [n for n in names if n not in IN_LABEL and not n.startswith(NOT_MEASURED)]
    return sorted(n for n in names if len(set(param_values(runs, n)) - {""}) > 1)


def describe(runs: pd.DataFrame, params: list[str], full: bool = False) -> list[str]:
    """'name=value ...' per run for these params, skipping those its strategy ignores."""
    values = {p if full else p.split(".")[-1]: param_values(runs, p) for p in params}
    return [" ".join(f"{name}={shown[i]}" for name, shown in values.items() if shown[i]) for i in range(len(runs))]


def display_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row of strings per run: ★, cache label, varying params, then the key figures."""
    def show(values, fmt):
        return ["–" if pd.isna(v) else fmt(v) for v in values]

    def metric(name):
        return _column(runs, f"metrics.{name}")
    table = {"★": ["★" if p else "" for p in runs["pareto"]], "cache": list(runs["label"])}
    table.update({p: param_values(runs, p) for p in varying_params(runs)})
    table["TPOT ms"] = ["–" if pd.isna(t) else f"{t:.1f} ± {s:.1f}"
                        for t, s in zip(metric("tpot_ms"), metric("tpot_ms_std").fillna(0))]
    table["decode tok/s"] = show(metric("decode_tokens_per_s"), "{:.1f}".format)
    table["peak memory"] = show(runs["memory_bytes"], human_bytes)
    table["KV cache"] = show(metric("kv_cache_bytes"), human_bytes)
    table["vs fp16 KV"] = show(metric("kv_compression"), "{:.2f}×".format)
    table["KL nats"] = show(metric("kl_vs_reference"), "{:.1e}".format)
    table["agreement"] = show(metric("token_agreement"), "{:.2f}".format)
    return pd.DataFrame(table)


def write_outputs(runs: pd.DataFrame, out_dir: Path, title: str) -> list[Path]:
    """compare.md, compare.csv and the two plots in out_dir; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    table = display_table(runs)
    lines = [f"# {title}", "", "| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(row) + " |" for row in table.itertuples(index=False)]
    (out_dir / "compare.md").write_text("\n".join([*lines, "", FOOTNOTE, ""]))
    columns = ["run_id", "label", "workload", "pareto", "memory_bytes", "quality_loss", "context_tokens"]
    columns += [f"params.{p}" for p in varying_params(runs)] + sorted(c for c in runs if c.startswith("metrics."))
    runs[columns].to_csv(out_dir / "compare.csv", index=False)
    detail = describe(runs, [p for p in varying_params(runs) if p.startswith(CACHE_PARAMS)])
    runs = runs.assign(point=[f"{label} {more}".strip() for label, more in zip(runs["label"], detail)])
    _plot_memory_vs_context(runs, out_dir / "memory_vs_context.png")
    _plot_tpot_vs_memory(runs, out_dir / "tpot_vs_memory.png")
    return [out_dir / name for name in OUTPUT_FILES]


def _plot_memory_vs_context(runs: pd.DataFrame, path: Path) -> None:
    from matplotlib.figure import Figure  # no pyplot: no global backend state, renders with Agg

    # A line per cache and workload, bar the context length on the x axis.
    others = describe(runs, [p for p in varying_params(runs) if not p.startswith(CACHE_PARAMS + CONTEXT_PARAMS)])
    runs = runs.assign(series=[f"{point} {more}".strip() for point, more in zip(runs["point"], others)])
    figure = Figure(figsize=(12, 4.5), layout="constrained")
    for ax, column, name in zip(figure.subplots(1, 2), ("memory_bytes", "metrics.kv_cache_bytes"),
                                ("peak memory", "KV cache")):
        if runs["context_tokens"].nunique() <= 1:  # one point per series: bars say it better than lines
            ax.barh(runs["series"], _column(runs, column) / MIB)
            ax.invert_yaxis()
            ax.set(xlabel=f"{name} (MiB)", title=f"{name} at {runs['context_tokens'].max():.0f} prompt tokens")
        else:
            for label, group in runs.sort_values("context_tokens").groupby("series", sort=False):
                ax.plot(group["context_tokens"], _column(group, column) / MIB, marker="o", label=label)
            ax.set(xlabel="prompt tokens", ylabel=f"{name} (MiB)", title=f"{name} vs context")
            ax.legend(fontsize="small")
        ax.grid(alpha=0.3)
    figure.savefig(path, dpi=110)


def _plot_tpot_vs_memory(runs: pd.DataFrame, path: Path) -> None:
    """One colour per workload; its Pareto front as a step line through the starred runs."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 5.5), layout="constrained")
    ax = figure.subplots()
    runs = runs.assign(tpot=_column(runs, "metrics.tpot_ms"), mib=runs["memory_bytes"] / MIB)
    for (workload, group), colour in zip(runs.groupby("workload", sort=False), [f"C{i}" for i in range(10)] * 9):
        ax.errorbar(group["mib"], group["tpot"], yerr=_column(group, "metrics.tpot_ms_std").fillna(0), fmt="o",
                    capsize=3, color=colour, label=workload or "runs")
        front = group[group["pareto"]].sort_values(["mib", "tpot"])
        ax.step(front["mib"], front["tpot"], where="post", color=colour, marker="*", markersize=12, alpha=0.7)
        for run in group.itertuples():
            ax.annotate(run.point, (run.mib, run.tpot), textcoords="offset points", xytext=(5, 4), fontsize="x-small")
    if runs["tpot"].max() > 20 * runs["tpot"].min():
        ax.set_yscale("log")  # one slow outlier would flatten everything else
    ax.set(xlabel="peak memory (MiB, weights included)", ylabel="TPOT (ms)",
           title="TPOT vs memory · ★ Pareto front (memory, TPOT, KL)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    figure.savefig(path, dpi=110)


def print_table(runs: pd.DataFrame, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    frame = display_table(runs)
    table = Table(title=title, header_style="bold", caption=FOOTNOTE, caption_justify="left")
    for column in frame.columns:
        table.add_column(column, justify="left" if column in ("★", "cache") else "right")
    for row in frame.itertuples(index=False):
        table.add_row(*row, style="bold" if row[0] else None)
    Console(width=None if sys.stdout.isatty() else 240).print(table)  # a pipe gets whole rows, not 80 columns


def _publish(runs: pd.DataFrame, parent_run, out_dir: Path) -> None:
    """Write the files, log them on the parent run, print the table."""
    from mlflow.tracking import MlflowClient

    title = f"kvpipe compare · sweep {parent_run.info.run_id[:8]} · {len(runs)} runs"
    for path in write_outputs(runs, out_dir, title):
        MlflowClient().log_artifact(parent_run.info.run_id, str(path), "compare")
    print_table(runs, title)


def main(argv: list[str]) -> int:
    """`kvpipe compare`: print the latest (or a named) sweep's table, write and log its files."""
    parser = argparse.ArgumentParser(prog="kvpipe compare", description=main.__doc__)
    add_source_arguments(parser)
    parser.add_argument("--out", type=Path, metavar="DIR", help="where to write (default: the sweep's dir)")
    args = parser.parse_args(argv)
    runs, parent_run = load_runs(args.experiment, args.parent, args.tracking_uri)
    sweep_dir = Path(parent_run.data.tags.get("kvpipe.sweep_dir", "/nonexistent"))
    out_dir = args.out or (sweep_dir if sweep_dir.is_dir() else Path("compare") / parent_run.info.run_id[:8])
    _publish(runs, parent_run, out_dir)
    if sys.stderr.isatty():
        print(f"wrote {', '.join(OUTPUT_FILES)} to {out_dir}; logged on MLflow run {parent_run.info.run_id}",
              file=sys.stderr)
    return 0


def summarise_sweep(config, parent_run_id: str, sweep_dir: Path) -> None:
    """End of a multirun: table, files in sweep_dir, artifacts on the parent. Never fails the sweep."""
    from omegaconf import OmegaConf

    from kvpipe.tracking import store_paths

    try:
        uri = store_paths(OmegaConf.to_object(config.tracking), Path(config.hydra.runtime.cwd))[0]
        runs, parent_run = load_runs(config.tracking.experiment, parent_run_id, uri)
        _publish(runs, parent_run, sweep_dir)
    except KvpipeError as exc:  # an empty or all-failed sweep has nothing to compare
        log.info("compare: %s", exc)
    except Exception:  # noqa: BLE001 - our bug, but every job is recorded already: keep the sweep's own status
        log.exception("compare failed; the sweep's runs are recorded, `kvpipe compare --parent %s` retries",
                      parent_run_id)
