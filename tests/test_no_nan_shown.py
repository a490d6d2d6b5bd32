"""No 'nan' reaches compare's table, its footnote or a plot's text: recorded sweeps (a passkey
sweep of one round per run, a serving sweep at two loads, both on tiny_random, read back from MLflow
into tests/data/recorded_sweeps/) go through compare as a sweep's end sends them."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from kvpipe.decide import compare, paired, plots
from kvpipe.decide import runs as recorded

RECORDED = Path(__file__).parent / "data" / "recorded_sweeps"
NAN = re.compile(r"\bnan\b", re.IGNORECASE)


def recorded_runs(name: str, drop: tuple[str, ...] = ()) -> pd.DataFrame:
    """A recorded sweep's runs as compare reads them, less the columns `drop` names."""
    runs = pd.read_json(RECORDED / f"{name}.json", orient="records", dtype=False)
    return paired.with_ratios(recorded.with_derived(runs.drop(columns=list(drop))))


def plot_texts(runs: pd.DataFrame, tmp_path: Path, monkeypatch) -> list[str]:
    """Every text compare's own plots draw (titles, labels, legends, annotations)."""
    from matplotlib.figure import Figure
    from matplotlib.text import Text

    drawn: list[str] = []
    saved = Figure.savefig

    def keep_texts(figure, *args, **kwargs):
        drawn.extend(text.get_text() for text in figure.findobj(Text))
        return saved(figure, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep_texts)
    runs = compare.with_points(runs)
    plots.memory_vs_context(runs, tmp_path / "memory_vs_context.png")
    plots.tpot_vs_memory(runs, tmp_path / "tpot_vs_memory.png")
    if "tags.kvpipe.load" in runs:
        plots.serving_curve(runs, tmp_path / "serving_curve.png")
    return drawn


def shown_texts(runs: pd.DataFrame) -> list[str]:
    table = compare.display_table(runs)
    return [
        *table.columns,
        *(str(cell) for row in table.itertuples(index=False) for cell in row),
        compare.footnote(runs),
    ]


@pytest.mark.parametrize("sweep", ["needle", "serving"])
def test_no_nan_in_compare_table_or_plot_texts(sweep, tmp_path, monkeypatch):
    runs = recorded_runs(sweep)
    found = [text for text in shown_texts(runs) + plot_texts(runs, tmp_path, monkeypatch) if NAN.search(text)]
    assert found == []


def test_one_round_runs_show_their_figure_and_say_once_why_there_is_no_interval():
    runs = recorded_runs("needle")
    table = compare.display_table(runs)
    assert all(re.fullmatch(r"\d+\.\d", cell) for cell in table["TPOT ms"])
    ratios = [cell for cell in table["TPOT vs dynamic"] if cell != "baseline"]
    assert ratios and all(re.fullmatch(r"\d+\.\d\d×", cell) for cell in ratios)
    said = compare.footnote(runs, table)
    assert said.count("1 round, no interval") == 1
    assert "TPOT ms, decode tok/s, TPOT vs dynamic, TTFT vs dynamic: 1 round, no interval (every run)." in said
    assert compare.RATIO_ALONE_NOTE in said and compare.RATIO_NOTE not in said  # no verdict to explain


def test_a_note_that_only_some_cells_share_stays_in_them():
    table = compare.said_once(pd.DataFrame({"TPOT ms": ["15.1 (1 round, no interval)", "12.0 (11.0–13.0)"]}))
    assert list(table["TPOT ms"]) == ["15.1 (1 round, no interval)", "12.0 (11.0–13.0)"]
    assert table.attrs[compare.SAID_ONCE] == []


def test_serving_runs_are_weighed_against_the_baseline_under_their_own_load():
    runs = recorded_runs("serving")
    table = compare.display_table(runs)
    for (_, run), cell in zip(runs.iterrows(), table["TPOT vs dynamic"]):
        load = run["tags.kvpipe.load"]
        assert run["baseline"] == "dynamic"
        if run["label"] == "dynamic":
            assert cell == "baseline"
        else:  # its ratio is to the dynamic run at its load
            base = runs[(runs["label"] == "dynamic") & (runs["tags.kvpipe.load"] == load)].iloc[0]
            assert cell.startswith(f"{paired.ratio(run, base).value:.2f}×")
    assert compare.RATIO_ALONE_NOTE in compare.footnote(runs)  # one round each: ratios without a verdict


def test_without_a_baseline_under_the_same_load_the_ratio_columns_take_one_line():
    runs = recorded_runs("serving")
    alone = paired.with_ratios(runs[(runs["label"] != "dynamic") | (runs["tags.kvpipe.load"] == "concurrency(1)")])
    others = alone[alone["tags.kvpipe.load"] == "concurrency(2)"]
    assert len(others) == 2 and others["baseline"].isna().all()  # static and paged
    assert compare.footnote(others) == compare.FOOTNOTE + compare.NO_BASELINE_NOTE


def test_memory_plot_title_names_a_prompt_length_only_where_every_run_recorded_it(tmp_path, monkeypatch):
    shared = plot_texts(recorded_runs("serving"), tmp_path, monkeypatch)
    assert "peak memory at 40 prompt tokens" in shared  # both loads' requests: the same prompts
    unknown = recorded_runs("serving", drop=("metrics.prompt_tokens",))
    assert unknown["context_tokens"].isna().all()
    texts = plot_texts(unknown, tmp_path, monkeypatch)
    assert "peak memory" in texts and not any(NAN.search(text) for text in texts)
