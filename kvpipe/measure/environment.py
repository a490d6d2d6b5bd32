"""Where a run ran: the versions that shaped its numbers."""

from __future__ import annotations

from kvpipe import __version__


def versions() -> dict[str, str]:
    import torch
    import transformers

    return {
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "kvpipe_version": __version__,
    }
