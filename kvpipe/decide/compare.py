"""Compare: a sweep's FINISHED runs as one table of what varies, a Pareto front, and plots."""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from kvpipe import catalogue, workload
from kvpipe.decide import flipped, paired, plots
from kvpipe.decide.runs import (
    CACHE_PARAMS,
    column,
    environments,
    load_runs,
    model_names,
    param_values,
    recorded,
    settings_text,
    varying_params,
)
from kvpipe.decide.shown import Shown
from kvpipe.measure.uncertainty import interval_note
from kvpipe.predict.predicted_runs import PREDICTED
from kvpipe.record import table as run_table
from kvpipe.record import tags as mlflow_tags
from kvpipe.record.auth import TrackingRefused
from kvpipe.record.report import interval_words, without_interval_words
from kvpipe.record.tracking import attach_files
from kvpipe.units import counted

log = logging.getLogger(__name__)

ARTIFACT_DIR = "compare"  # the files' folder on the sweep's parent run
OUTPUT_FILES = ("compare.md", "compare.csv", "memory_vs_context.png", "tpot_vs_memory.png")
SERVING_FILES = ("serving_curve.png",)  # when some runs served requests under a load
FRONT_FILES = ("quality_vs_kv_bytes.png",)  # when some run evicted (press=...): each family a series
FOOTNOTE = (
    "★ Pareto front of each workload (and of each machine, where several measured) over peak memory, TPOT and KL (lower is better; lossy runs without a "
    "quality pass are left off); where every run measured its workload's accuracy (passkey retrieval, task or RULER accuracy), over it in place of KL "
    "(and KL too when every run has it). ⚠ noisy: TTFT or TPOT varied between calls of one shape, or between a "
    "call's tokens, by more than the run's workload.noise_threshold, so its place on the front is not firm. "
    "Peak memory: the process's (CPU) or the allocator's (CUDA) peak during a measured call, weights included. "
    "A figure's 95% interval is shown where its rounds support one; else why not (1 round; too noisy, and how "
    "many rounds would give ±10%)."
)
RATIO_NOTE = (
    " TPOT and TTFT vs the baseline: the ratio and its 95% interval, call by call where the two took turns "
    "by call (an interleaved sweep, or a job beside its own copy of the baseline: pair_on_node), else round by round where they shared rounds, so the machine's drift "
    "cancels: clearly slower or faster where the interval lies beyond ±2% of 1, the same within 2% where it "
    "lies inside, not yet decided where it straddles an edge. † measured in different rounds: a machine that "
    "drifted between them can fake or hide a difference."
)
NO_BASELINE_NOTE = " vs the baseline: – where no baseline run shares the run's workload, prompt length and load."
RATIO_ALONE_NOTE = " TPOT and TTFT vs the baseline: the ratio of the run's figure to the baseline's."


def footnote(runs: pd.DataFrame, table: pd.DataFrame | None = None) -> str:
    """FOOTNOTE, and what the ratio columns say: how their verdicts read where some ratio has an
    interval, one line where none has (each run measured one round) or where no run has a ratio (none
    shares its baseline's workload, prompt length and load); then what display_table said once for a
    whole column (`table`'s attrs) rather than in each cell."""
    ratios = [r for figure in paired.FIGURES if f"ratio_{figure}" in runs for r in runs[f"ratio_{figure}"]]
    once = "".join(f" {line}" for line in (table.attrs.get(SAID_ONCE, []) if table is not None else []))
    if not ratios:
        return FOOTNOTE + once
    apart = (
        f" – ({APART}): the two were not measured in turns on one machine, so their timings are not weighed against each other."
        if "apart" in runs and runs["apart"].any()
        else ""
    )
    if all(r is None for r in ratios):
        return FOOTNOTE + NO_BASELINE_NOTE + apart + once
    judged = any(r is not None and r.state != paired.NO_INTERVAL for r in ratios)
    return FOOTNOTE + (RATIO_NOTE if judged else RATIO_ALONE_NOTE) + apart + once


SAID_ONCE = "said_once"  # display_table's attrs: the notes it took out of every cell of a column
_NO_FIGURE = ("", "–", "baseline")


def said_once(table: pd.DataFrame) -> pd.DataFrame:
    """The table with a note that ends every figure of a column ('15.1 (1 round, no interval)' in
    each row) taken out of its cells and said once, for the columns that share it, in attrs[SAID_ONCE]:
    'TPOT ms, TPOT vs dynamic: 1 round, no interval (every run).'"""
    columns_by_note: dict[str, list[str]] = {}
    for name in table.columns:
        figures = [cell for cell in table[name] if isinstance(cell, str) and cell not in _NO_FIGURE]
        notes = {interval_words(cell) for cell in figures}
        if len(notes) == 1 and None not in notes:
            columns_by_note.setdefault(notes.pop(), []).append(name)
    table = table.copy()
    for name in [name for names in columns_by_note.values() for name in names]:
        table[name] = [without_interval_words(cell) if isinstance(cell, str) else cell for cell in table[name]]
    table.attrs[SAID_ONCE] = [f"{', '.join(names)}: {note} (every run)." for note, names in columns_by_note.items()]
    return table


def display_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row of strings per run: ★, cache label, varying params, then the catalogue's compare
    figures that some run measured (kvpipe.catalogue), each with its 95% interval where it has one,
    else ± its spread."""
    marks = zip(runs["pareto"], runs["noisy"], runs["contended"])
    stars = [("★" if p else "") + (" ⚠ contended" if c else " ⚠" if n else "") for p, n, c in marks]
    table = {"★": stars, "cache": list(runs["label"])}
    if "node" in runs and runs["node"].nunique() > 1:  # several machines: which measured each run
        table["measured on"] = list(runs["node"])
    table.update({p: param_values(runs, p) for p in varying_params(runs)})
    for metric in workload.metrics().values():
        values = figure_column(runs, metric)
        if metric.compare and values.notna().any():
            spreads = column(runs, metric.companion("std"))
            lows, highs = column(runs, metric.companion("ci_low")), column(runs, metric.companion("ci_high"))
            notes = [interval_note(low, high, paired.series(run, metric.name), metric.is_share) or ""
                     for (_, run), low, high in zip(runs.iterrows(), lows, highs)]  # fmt: skip
            table[metric.header()] = [
                metric.cell(v, s if pd.notna(s) else None, (low, high), note)
                for v, s, low, high, note in zip(values, spreads, lows, highs, notes)
            ]
    for figure, label in paired.FIGURES.items():  # paired.with_ratios: each against its baseline
        if f"ratio_{figure}" in runs:
            header = f"{label} vs {runs.attrs.get('baseline', 'baseline')}"
            apart = runs["apart"] if "apart" in runs else [False] * len(runs)
            table[header] = [
                _ratio_cell(r, b, own, far)
                for r, b, own, far in zip(runs[f"ratio_{figure}"], runs["baseline"], runs["label"], apart)
            ]
    for name, header in PREDICTED.items():  # compare --predicted (kvpipe.predict.predicted_runs)
        if name in runs:
            table[header] = [f"{value:.1f}" if pd.notna(value) else "–" for value in runs[name]]
    return said_once(pd.DataFrame(table))


def _ratio_cell(ratio, baseline, label, apart: bool = False) -> str:
    if ratio is not None:
        return ratio.text()
    if apart:
        return f"– ({APART})"
    return "baseline" if baseline is not None and baseline == label else "–"


APART = "its baseline ran on another machine"


def figure_column(runs: pd.DataFrame, metric: catalogue.Metric) -> pd.Series:
    """A metric's column; peak memory as the runs' derived memory_bytes (runs.with_derived)."""
    return runs["memory_bytes"] if metric.name == "peak_memory_bytes" else column(runs, metric.column)


def with_points(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs with `point`: each label and the cache settings that vary, as the plots name runs."""
    detail = settings_text(runs, [p for p in varying_params(runs) if p.startswith(CACHE_PARAMS)])
    return runs.assign(point=[f"{label} {more}".strip() for label, more in zip(runs["label"], detail)])


def sections(runs: pd.DataFrame, out_dir: Path | None) -> list[workload.Section]:
    """Each workload's own part of compare (passkey: retrieval by context length), over the runs that
    measured one of its metrics, with out_dir its plots written there; then, for any workload, the
    answers each cache turned wrong against the reference's (kvpipe.decide.flipped)."""
    runs = with_points(runs)
    found = []
    for kind in workload.registered():
        own = pd.Series(False, index=runs.index)
        for metric in kind.metrics:
            own |= column(runs, metric.column).notna()
        section = kind.compare_section(recorded(runs[own]), out_dir) if own.any() else None
        found += [section] if section is not None else []
    return found + flipped.sections(runs)


def _markdown(section: workload.Section) -> str:
    table = pd.DataFrame(section.rows, columns=section.columns).to_markdown(index=False, stralign="right")
    return f"\n## {section.markdown_title()}\n\n{table}\n"


def mixed_environments(runs: pd.DataFrame) -> str | None:
    """A warning when the runs were measured in more than one environment, else None."""
    found = environments(runs)
    if len(found) < 2:
        return None
    return f"⚠ these runs come from {len(found)} environments; their figures do not compare: " + " | ".join(found)


def write_outputs(runs: pd.DataFrame, out_dir: Path, title: str) -> list[Path]:
    """compare.md, compare.csv and the plots in out_dir; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    table = display_table(runs)
    markdown = table.to_markdown(index=False, stralign="right")
    warning = mixed_environments(runs)
    own = sections(runs, out_dir)
    (out_dir / "compare.md").write_text(
        f"# {title}\n\n{markdown}\n\n{footnote(runs, table)}\n"
        + (f"\n**{warning}**\n" if warning else "")
        + "".join(_markdown(section) for section in own)
    )
    columns = ["run_id", "label", "workload", "pareto", "memory_bytes", "quality_loss", "context_tokens"]
    # Stepped metrics (name/…, per context length) would show only their last step: left to the plots
    metrics = sorted(c for c in runs if run_table.is_metric(c) and "/" not in c)
    columns += [run_table.param(p) for p in varying_params(runs)] + metrics
    runs[columns].to_csv(out_dir / "compare.csv", index=False)
    runs = with_points(runs)
    plots.memory_vs_context(runs, out_dir / "memory_vs_context.png")
    plots.tpot_vs_memory(runs, out_dir / "tpot_vs_memory.png")
    written = list(OUTPUT_FILES)
    if column(runs, catalogue.column("output_tokens_per_s")).notna().any():
        plots.serving_curve(runs, out_dir / "serving_curve.png")
        written += SERVING_FILES
    if runs["evicted"].any():
        plots.quality_vs_kv_bytes(runs, out_dir / "quality_vs_kv_bytes.png")
        written += FRONT_FILES
    written += [name for section in own for name in section.files]
    return [out_dir / name for name in written]


def shown(runs: pd.DataFrame, title: str) -> Shown:
    """The tables to print, as plain rows (kvpipe.decide.shown prints them)."""
    frame = display_table(runs)
    return Shown(
        title=title,
        columns=list(frame.columns),
        rows=[list(row) for row in frame.itertuples(index=False)],
        caption=footnote(runs, frame),
        warning=mixed_environments(runs),
        sections=sections(runs, None),
    )


def publish(runs: pd.DataFrame, parent_run, out_dir: Path) -> tuple[list[Path], Shown, bool]:
    """Write the files, log them on the parent run (if this user may), compare.md as its description;
    returns the files, the table and whether the files are on the run."""
    title = f"kvpipe compare · {model_names(runs)} · sweep {parent_run.run_id[:8]} · {counted(len(runs), 'run')}"
    written = write_outputs(runs, out_dir, title)
    run_id = parent_run.run_id
    # the table as the run's description: on its page, without opening an artifact
    table = mlflow_tags.note((out_dir / "compare.md").read_text(), f"{ARTIFACT_DIR}/compare.md")
    try:
        attach_files(run_id, written, ARTIFACT_DIR, table)
    except TrackingRefused as exc:  # a user who may read the runs has what they asked for
        log.warning("%s; the files are in %s, not on the run", exc, out_dir)
        return written, shown(runs, title), False
    return written, shown(runs, title), True


def publish_sweep(experiment: str, parent_run_id: str, uri: str, sweep_dir: Path) -> Shown:
    """A sweep's end (kvpipe.orchestrate.closing, in its tracking worker if it has one): its runs read from
    MLflow, the files written in sweep_dir and logged on the parent; returns the table to print."""
    runs, parent_run = load_runs(experiment, parent_run_id, uri)
    return publish(paired.with_ratios(runs), parent_run, sweep_dir)[1]
