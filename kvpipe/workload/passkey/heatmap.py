"""The needle-in-a-haystack picture of one run: retrieval accuracy over context length x depth."""

from __future__ import annotations

from pathlib import Path

HEATMAP_FILE = "retrieval_heatmap.png"


def draw(ax, cells: list[dict], title: str) -> object:
    """Context length across, the key's depth down (0% at the top: the start of the text); each
    square coloured red (never found) to green (always) and labelled found/answers. Returns the image."""
    lengths = sorted({cell["context_tokens"] for cell in cells})
    depths = sorted({cell["depth"] for cell in cells})
    grid = [[float("nan")] * len(lengths) for _ in depths]
    for cell in cells:
        row, col = depths.index(cell["depth"]), lengths.index(cell["context_tokens"])
        grid[row][col] = cell["retrieval_accuracy"]
        label = f"{cell['found']}/{cell['answers']}" if "found" in cell else f"{cell['retrieval_accuracy']:.0%}"
        ax.text(col, row, label, ha="center", va="center", fontsize="small")
    image = ax.imshow(grid, cmap="RdYlGn", vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(lengths)), [f"{n:,}" for n in lengths])
    ax.set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths])
    ax.set(xlabel="context tokens", ylabel="key depth", title=title)
    return image


def save(cells: list[dict], path: Path, title: str) -> Path:
    from matplotlib.figure import Figure  # no pyplot: no global backend state, renders with Agg

    lengths = len({cell["context_tokens"] for cell in cells})
    figure = Figure(figsize=(2.2 + 1.1 * lengths, 3.6), layout="constrained")
    ax = figure.subplots()
    figure.colorbar(draw(ax, cells, title), ax=ax, label="retrieval accuracy")
    figure.savefig(path, dpi=110)
    return path
