"""RULER's picture of one run: accuracy per task (down, in the suite's order) and context length (across)."""

from __future__ import annotations

from kvpipe.workload import _heatmap
from kvpipe.workload.ruler.tasks import TASKS

HEATMAP_FILE = "ruler_heatmap.png"
LAYOUT = _heatmap.Layout(
    down="task",
    value="accuracy",
    ylabel="task",
    colour_label="RULER accuracy",
    down_order=lambda names: [name for name in TASKS if name in names],
)
