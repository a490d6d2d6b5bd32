"""The compare plots: memory against context, TPOT against memory with the Pareto front, quality
against KV bytes, and serving's throughput curve. A workload's own plots are its own (passkey's
heatmaps: kvpipe.workload.passkey.compared)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from kvpipe import catalogue
from kvpipe.decide.runs import CACHE_PARAMS, Front, column, context_params, judged_by, settings_text, varying_params
from kvpipe.record import tags as mlflow_tags
from kvpipe.units import MIB

TPOT, KV_BYTES = catalogue.get("tpot_ms"), catalogue.get("kv_cache_bytes")


def memory_vs_context(runs: pd.DataFrame, path: Path) -> None:
    from matplotlib.figure import Figure  # no pyplot: no global backend state, renders with Agg

    # A line per cache and workload, bar the context length on the x axis.
    others = settings_text(runs, [p for p in varying_params(runs) if not p.startswith(CACHE_PARAMS + context_params())])
    runs = runs.assign(series=[f"{point} {more}".strip() for point, more in zip(runs["point"], others)])
    figure = Figure(figsize=(12, 4.5), layout="constrained")
    for ax, figure_column, name in zip(
        figure.subplots(1, 2), ("memory_bytes", KV_BYTES.column), ("peak memory", "KV cache")
    ):
        if runs["context_tokens"].nunique() <= 1:  # one point per series: bars say it better than lines
            ax.barh(runs["series"], column(runs, figure_column) / MIB)
            ax.invert_yaxis()
            ax.set(xlabel=f"{name} (MiB)", title=name + _at_prompt_length(runs["context_tokens"]))
        else:
            for label, group in runs.sort_values("context_tokens").groupby("series", sort=False):
                ax.plot(group["context_tokens"], column(group, figure_column) / MIB, marker="o", label=label)
            ax.set(xlabel="prompt tokens", ylabel=f"{name} (MiB)", title=f"{name} vs context")
            ax.legend(fontsize="small")
        ax.grid(alpha=0.3)
    figure.savefig(path, dpi=110)


def _at_prompt_length(tokens: pd.Series) -> str:
    """' at 512 prompt tokens' where every run measured that one length; '' where some did not record it."""
    known = tokens.dropna()
    return f" at {known.iloc[0]:.0f} prompt tokens" if len(known) == len(tokens) > 0 and known.nunique() == 1 else ""


def tpot_vs_memory(runs: pd.DataFrame, path: Path) -> None:
    """One colour per workload; its Pareto front as a step line through the starred runs."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 5.5), layout="constrained")
    ax = figure.subplots()
    runs = runs.assign(tpot=column(runs, TPOT.column), mib=runs["memory_bytes"] / MIB)
    for (workload, group), colour in zip(runs.groupby("workload", sort=False), [f"C{i}" for i in range(10)] * 9):
        ax.errorbar(
            group["mib"],
            group["tpot"],
            yerr=column(group, TPOT.companion("std")).fillna(0),
            fmt="o",
            capsize=3,
            color=colour,
            label=workload or "runs",
        )
        front = group[group["pareto"]].sort_values(["mib", "tpot"])
        ax.step(front["mib"], front["tpot"], where="post", color=colour, marker="*", markersize=12, alpha=0.7)
        for run in group.itertuples():
            ax.annotate(run.point, (run.mib, run.tpot), textcoords="offset points", xytext=(5, 4), fontsize="x-small")
    if runs["tpot"].max() > 20 * runs["tpot"].min():
        ax.set_yscale("log")  # one slow outlier would flatten everything else
    ax.set(
        xlabel="peak memory (MiB, weights included)",
        ylabel="TPOT (ms)",
        title="TPOT vs memory · ★ Pareto front (memory, TPOT, KL)",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    figure.savefig(path, dpi=110)


def quality_vs_kv_bytes(runs: pd.DataFrame, path: Path) -> None:
    """The front a user picks a smaller cache on: quality against the KV cache's bytes, each way of
    shrinking it its own series (fewer bits, fewer tokens, both), a panel per workload. Quality is
    KL to the full-precision reference, or the workload's own quality metric where every run measured
    it (passkey's retrieval accuracy)."""
    from matplotlib.figure import Figure

    runs = runs.assign(kv=column(runs, KV_BYTES.column) / MIB)
    panels = list(runs.groupby("workload", sort=False))
    figure = Figure(figsize=(7.5 * len(panels), 5.5), layout="constrained")
    for ax, (workload, group) in zip(figure.subplots(1, len(panels), squeeze=False).ravel(), panels):
        judged = judged_by(group)
        own = judged is not None and column(group, judged.metric.column).notna().all()
        scores = column(group, judged.metric.column) if own else group["quality_loss"]
        group = group.assign(quality=scores).dropna(subset=["quality", "kv"])
        for family, marker in zip(Front, "s^ovD"):
            members = group[group["family"] == family].sort_values("kv")
            if members.empty:
                continue
            ax.plot(members["kv"], members["quality"], marker=marker, linestyle="none", markersize=8, label=family)
            for run in members.itertuples():
                ax.annotate(
                    run.point, (run.kv, run.quality), textcoords="offset points", xytext=(4, 4), fontsize="x-small"
                )
        ax.set_xscale("log")
        if own:
            ax.set_ylim(-0.05, 1.05)
            ax.yaxis.set_major_formatter("{x:.0%}")
            better = "lower" if judged.metric.lower_is_better else "higher"
            ylabel = f"{judged.axis} ({better} is better)"
        else:
            ylabel = "KL to full precision, nats (lower is better)"
        ax.set(xlabel="KV cache (MiB, log scale)", ylabel=ylabel, title=workload or "quality vs KV cache bytes")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    figure.suptitle("quality vs KV cache bytes: fewer bits, fewer tokens, or both")
    figure.savefig(path, dpi=110)


def serving_curve(runs: pd.DataFrame, path: Path) -> None:
    """Serving runs (load=...): output tokens per second against p90 TPOT, a line per cache, a point
    per load (concurrency or rate), as vLLM's bench sweep and GuideLLM draw it: up and to the left is better."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 5.5), layout="constrained")
    ax = figure.subplots()
    runs = runs.assign(
        tpot=column(runs, catalogue.column("tpot_p90_ms")),
        throughput=column(runs, catalogue.column("output_tokens_per_s")),
        load=column(runs, mlflow_tags.column(mlflow_tags.LOAD), "").fillna(""),
    ).dropna(subset=["tpot", "throughput"])
    for (label, group), colour in zip(runs.groupby("label", sort=False), [f"C{i}" for i in range(10)] * 9):
        group = group.sort_values("throughput")
        ax.plot(group["tpot"], group["throughput"], marker="o", color=colour, label=label)
        for run in group.itertuples():
            ax.annotate(run.load, (run.tpot, run.throughput), textcoords="offset points", xytext=(5, 4),
                        fontsize="x-small")  # fmt: skip
    ax.set(xlabel="TPOT p90 (ms)", ylabel="output tokens per second", title="serving: throughput vs p90 TPOT")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    figure.savefig(path, dpi=110)
