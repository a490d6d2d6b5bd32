"""A choice of config groups composed once per process (kvpipe.jobspec.composed_once), Hydra's own
entries merged once for every choice: what composes is node for node what Hydra's own merge gives,
types, flags and unresolved values included, for every option of every group and every preset."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import DictConfig, ListConfig, ValueNode

from kvpipe.jobspec import composed_once, schema


def every_choice() -> list[list[str]]:
    """Every option of every group at least once, in as few compositions as the largest group has
    options (the i-th of each group, cycling), and each preset on its own."""
    conf = Path(__file__).resolve().parents[1] / "conf"
    groups = {
        g.name: sorted(o.stem for o in g.glob("*.yaml"))
        for g in conf.iterdir()
        if g.is_dir() and g.name != "__pycache__"
    }
    presets = [[f"+experiment={name}"] for name in groups.pop("experiment")]
    groups = {name: options for name, options in groups.items() if options and name != "hydra"}
    most = max(len(options) for options in groups.values())
    return [[f"{g}={o[i % len(o)]}" for g, o in sorted(groups.items())] for i in range(most)] + presets


def shape(node, path="") -> list[tuple]:
    """Every node's path, class, declared and held type, flags and, for a value, its unresolved value."""
    meta = node._metadata
    found = [(path, type(node).__name__, meta.object_type, meta.ref_type, meta.optional, dict(meta.flags or {}))]
    if isinstance(node, ValueNode):
        return [*found[:1], (path, repr(node._value()))]
    if node._is_missing() or node._is_none() or node._is_interpolation():
        return [*found, (path, repr(node._value()))]
    if isinstance(node, DictConfig):
        for key in node.keys():
            found += shape(node._get_node(key), f"{path}.{key}")
    elif isinstance(node, ListConfig):
        for index in range(len(node)):
            found += shape(node._get_node(index), f"{path}[{index}]")
    return found


@pytest.mark.parametrize("overrides", every_choice(), ids=lambda o: " ".join(o))
def test_each_choice_composes_as_hydras_own_merge(overrides, monkeypatch):
    composed = schema._compose(overrides, with_hydra=True)
    monkeypatch.setattr(composed_once, "HYDRAS_NODE", "no such node")  # Hydra's merge, whole
    monkeypatch.setattr(composed_once, "_MERGED", {})
    hydras = schema._compose(overrides, with_hydra=True)
    assert shape(composed) == shape(hydras)
