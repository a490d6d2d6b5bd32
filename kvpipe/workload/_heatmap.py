"""Accuracy heatmaps over context length (across) and a workload's own second axis (down: passkey's
key depth, ruler's task), for one run and for runs side by side; passkey and ruler each say what
their cells hold with a `Layout`. matplotlib without pyplot: no global backend state, renders with Agg."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable


@dataclass(frozen=True)
class Layout:
    """How a workload's cells (dicts with `context_tokens`) make a heatmap."""

    down: str  # the cell key down the side
    value: str  # the cell key that colours a square: a fraction, red (0) to green (1)
    ylabel: str
    colour_label: str
    down_text: Callable[[Any], str] = str
    cell_text: Callable[[dict], str] | None = None  # None: the value as a percentage
    down_order: Callable[[set], list] = sorted


def draw(ax, cells: list[dict], layout: Layout, title: str) -> object:
    """One run's squares, each coloured and labelled. Returns the image."""
    lengths = sorted({cell["context_tokens"] for cell in cells})
    downs = layout.down_order({cell[layout.down] for cell in cells})
    grid = [[float("nan")] * len(lengths) for _ in downs]
    for cell in cells:
        row, col = downs.index(cell[layout.down]), lengths.index(cell["context_tokens"])
        grid[row][col] = cell[layout.value]
        label = layout.cell_text(cell) if layout.cell_text else f"{cell[layout.value]:.0%}"
        ax.text(col, row, label, ha="center", va="center", fontsize="small")
    image = ax.imshow(grid, cmap="RdYlGn", vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(lengths)), [f"{n:,}" for n in lengths])
    ax.set_yticks(range(len(downs)), [layout.down_text(d) for d in downs])
    ax.set(xlabel="context tokens", ylabel=layout.ylabel, title=title)
    return image


def save(cells: list[dict], layout: Layout, path: Path, title: str) -> Path:
    """One run's heatmap as a PNG."""
    from matplotlib.figure import Figure

    lengths = len({cell["context_tokens"] for cell in cells})
    downs = len({cell[layout.down] for cell in cells})
    figure = Figure(figsize=(2.2 + 1.1 * lengths, max(3.6, 1.2 + 0.3 * downs)), layout="constrained")
    ax = figure.subplots()
    figure.colorbar(draw(ax, cells, layout, title), ax=ax, label=layout.colour_label)
    figure.savefig(path, dpi=110)
    return path


def side_by_side(panels: list[tuple[str, list[dict]]], layout: Layout, path: Path, title: str) -> None:
    """One heatmap per run (title, cells), three to a row, on one colour scale."""
    from matplotlib.figure import Figure

    panels = [(name, cells) for name, cells in panels if cells]
    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    lengths = max(len({cell["context_tokens"] for cell in cells}) for _, cells in panels)
    downs = max(len({cell[layout.down] for cell in cells}) for _, cells in panels)
    height = max(3.2, 1.0 + 0.3 * downs)
    figure = Figure(figsize=(columns * (1.6 + 1.0 * lengths), rows * height + 0.6), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for ax, (name, cells) in zip(axes, panels):
        image = draw(ax, cells, layout, name)
    for ax in axes[len(panels) :]:
        ax.set_axis_off()
    figure.colorbar(image, ax=list(axes), label=layout.colour_label, shrink=0.8)
    figure.suptitle(title)
    figure.savefig(path, dpi=110)
