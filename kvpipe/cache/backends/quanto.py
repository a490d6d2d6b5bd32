"""backend=quanto: optimum-quanto, nbits 2 or 4, through kvpipe's QuantoKVLayer.

Which raw axis gives which grouping. transformers' QuantizedLayer hands `_quantize` a contiguous
[batch, heads, seq, head_dim] tensor. Let G = q_group_size and T = batch*heads*seq (the rows of the
flattened (batch, head, token) index). optimum.quanto.tensor.grouped.group (used by MaxOptimizer
and quantize_affine) ignores the 4-D shape and groups in flat memory order:
  axis 0   reshape(-1, G): a group is G consecutive elements, i.e. G consecutive channels of one token.
           Per-token iff head_dim % G == 0 (head_dim < G: a group spans G/head_dim tokens).
           ValueError "Group size (G) must be a divisor of (heads*seq*head_dim)" unless that divides.
  axis -1  reshape(T/G, G, head_dim).permute(1, 2, 0): a group is one channel over G consecutive rows of T.
           Per-channel (one head, consecutive tokens) iff seq % G == 0; otherwise groups straddle heads
           and batch rows. ValueError "Group size (G) must be a divisor of (T)" unless T % G == 0.
QuantoKVLayer pads tokens (repeating the last one) so that axis -1 is per-channel of one head at any
length. tests/test_axis_semantics.py proves each line on the real layers.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from importlib.util import find_spec
from pathlib import Path

from kvpipe.cache.backends.grouped import GroupedBackend

log = logging.getLogger(__name__)
# quanto's C++ build takes ~30 s on 2 cores; a build lock older than this was left by a killed process
STALE_BUILD_LOCK_S = 600


class Quanto(GroupedBackend):
    name = "quanto"
    order = 10
    nbits_choices = (2, 4)  # what QuantoQuantizedLayer accepts
    plan_nbits = (4, 2)
    axes = {"per_token": (0, 0), "per_channel": (-1, -1), "kivi": (-1, 0)}
    axes_grouping = {0: "token", -1: "channel"}

    @classmethod
    def warm(cls, device: str, dtype) -> None:
        prefer_this_environments_tools()
        clear_stale_build_locks()
        super().warm(device, dtype)

    @classmethod
    def layer_class(cls):
        from kvpipe.cache.backends._layers import QuantoKVLayer

        return QuantoKVLayer

    @classmethod
    def sliding_layer_class(cls):
        from kvpipe.cache.backends._layers import SlidingQuantoKVLayer

        return SlidingQuantoKVLayer

    def data_bytes(self, groups: int, grouping: str) -> int:
        if grouping == "channel":  # quanto packs the rows of its (group, groups) view
            return -(-self.settings.q_group_size // (8 // self.settings.nbits)) * groups
        return super().data_bytes(groups, grouping)


def prefer_this_environments_tools() -> None:
    """The interpreter's own bin folder first on PATH, as an activated venv has it. quanto builds its
    extension with the first `ninja` on PATH, and a build by another ninja (the system's, when kvpipe
    runs as .venv/bin/python without the venv activated) makes the next build start over: ~30 s of
    every quantized process's start, each time the two alternate."""
    here = os.path.dirname(sys.executable)
    if not os.path.isfile(os.path.join(here, "ninja")):
        return
    path = os.environ.get("PATH", "").split(os.pathsep)
    if path[0] != here:
        os.environ["PATH"] = os.pathsep.join([here, *(p for p in path if p != here)])


def clear_stale_build_locks() -> None:
    """torch's extension builder waits, without end or word, while its build folder's lock exists; a
    process killed mid-build leaves one behind, and every later quantized job would hang on it."""
    spec = find_spec("optimum.quanto.library.extensions")
    if spec is None or not spec.submodule_search_locations:
        return
    for lock in Path(spec.submodule_search_locations[0]).glob("*/build/lock"):
        try:
            age_s = time.time() - lock.stat().st_mtime
        except FileNotFoundError:  # a build that was running has just finished
            continue
        if age_s > STALE_BUILD_LOCK_S:
            log.warning(
                "removing %s: a build lock %.0f min old, left by a process killed while it built", lock, age_s / 60
            )
            lock.unlink(missing_ok=True)
