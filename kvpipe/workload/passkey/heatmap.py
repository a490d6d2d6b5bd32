"""The needle-in-a-haystack picture of one run: retrieval accuracy over context length x depth."""

from __future__ import annotations

from pathlib import Path

from kvpipe.workload import _heatmap

HEATMAP_FILE = "retrieval_heatmap.png"
# Context length across, the key's depth down (0% at the top: the start of the text); each square
# labelled found/answers (or its accuracy, read back from a recorded run's series)
LAYOUT = _heatmap.Layout(
    down="depth",
    value="retrieval_accuracy",
    ylabel="key depth",
    colour_label="retrieval accuracy",
    down_text=lambda depth: f"{depth:.0%}",
    cell_text=lambda c: f"{c['found']}/{c['answers']}" if "found" in c else f"{c['retrieval_accuracy']:.0%}",
)


def save(cells: list[dict], path: Path, title: str) -> Path:
    return _heatmap.save(cells, LAYOUT, path, title)
