"""Each choice of config groups composed once per process; the values set on the command line are
applied to a copy, by Hydra's own code, every time.

A Hydra composition spends most of its ~0.15 s (2 cores) on two steps that depend only on which
option each config group names (`cache=static`, `press=snapkv`), not on the values set
(`workload.max_new_tokens=4`): walking the defaults lists, and merging the configs they name. A
sweep composes each job's config again, and the test suite composes hundreds of configs that differ
only in values. Both steps are kept here, keyed by the group overrides, the config sources and the
ConfigStore's contents; Hydra then applies the value overrides, checks them and fills its own node
as it always does, so errors and results are Hydra's. A first composition of a choice still merges
its configs, but Hydra's own entries, which come first and are the same for nearly every choice, are
merged once (tests/test_composed_once.py holds the result to Hydra's own merge, node for node). Only
packaged sources are kept (Hydra's and
kvpipe's `pkg://` folders, the ConfigStore): a folder on disk named by `hydra.searchpath` may change
while a process runs, so a composition that reads one is done in full.
"""

from __future__ import annotations

import copy
import dataclasses
import sys

_DEFAULTS: dict[tuple, object] = {}
_MERGED: dict[tuple, object] = {}
_HEADS: dict[tuple, object] = {}  # the merge of Hydra's own entries, through its node
HYDRAS_NODE = "hydra/config"
_store_version = 0  # bumped by every ConfigStore.store: a stored node changes what composes


def install() -> None:
    """From now on, compositions reuse their group choices' defaults list and merge (idempotent)."""
    from hydra._internal import config_loader_impl
    from hydra.core.config_store import ConfigStore

    if getattr(config_loader_impl.create_defaults_list, "composed_once", False):
        return
    from hydra.errors import ConfigCompositionException
    from omegaconf import flag_override
    from omegaconf.errors import OmegaConfBaseException

    create_defaults_list = config_loader_impl.create_defaults_list
    merge = config_loader_impl.ConfigLoaderImpl._compose_config_from_defaults_list
    store = ConfigStore.store

    def counted_store(self, *args, **kwargs):
        global _store_version
        _store_version += 1
        return store(self, *args, **kwargs)

    def defaults_list(repo, config_name, overrides_list, prepend_hydra, skip_missing):
        sources = _packaged_sources(repo)
        if sources is None:
            return create_defaults_list(repo, config_name, overrides_list, prepend_hydra, skip_missing)
        # Hydra's own split (defaults_list.Overrides): a group's option choice shapes the defaults
        # list; a value, or a dict given to a group, is applied afterwards in order; a sweep is skipped
        groups, values = [], []
        for override in overrides_list:
            if override.is_sweep_override():
                continue
            is_group = repo.group_exists(override.key_or_group) and not isinstance(override.value(), dict)
            (groups if is_group else values).append(override)
        key = (sources, _store_version, config_name, prepend_hydra, skip_missing, tuple(o.input_line for o in groups))
        if key not in _DEFAULTS:  # a bad choice raises, every time, as Hydra's own does
            _DEFAULTS[key] = create_defaults_list(repo, config_name, groups, prepend_hydra, skip_missing)
        return dataclasses.replace(_DEFAULTS[key], config_overrides=values)

    def merged(self, defaults, repo):
        sources = _packaged_sources(repo)
        if sources is None:
            return merge(self, defaults, repo)
        key = (sources, _store_version, _named(defaults))
        if key not in _MERGED:
            _MERGED[key] = merged_after_hydras_node(self, defaults, repo, sources)
        return copy.deepcopy(_MERGED[key])

    def merged_after_hydras_node(self, defaults, repo, sources):
        """Hydra's own entries come first and end with its node (hydra/config), the same for nearly
        every choice of kvpipe's groups: their merge (a fifth of a first composition) is kept, and the
        rest merged onto a copy of it, one config after another, as Hydra's own merge does."""
        split = next((i + 1 for i, d in enumerate(defaults) if d.config_path == HYDRAS_NODE and d.is_self), 0)
        if not 0 < split < len(defaults):
            return merge(self, defaults, repo)
        head_key = (sources, _store_version, _named(defaults[:split]))
        if head_key not in _HEADS:
            _HEADS[head_key] = merge(self, defaults[:split], repo)
        composed = copy.deepcopy(_HEADS[head_key])
        with flag_override(composed, "no_deepcopy_set_nodes", True):
            for default in defaults[split:]:
                loaded = self._load_single_config(default=default, repo=repo)
                try:
                    composed.merge_with(loaded.config)
                except OmegaConfBaseException as exc:  # Hydra's own words for it
                    raise ConfigCompositionException(
                        f"In '{default.config_path}': {type(exc).__name__} raised while composing config:\n{exc}"
                    ).with_traceback(sys.exc_info()[2]) from None
        _strip_defaults(composed)
        return composed

    counted_store.composed_once = defaults_list.composed_once = merged.composed_once = True
    ConfigStore.store = counted_store
    # Each composition deep-copies its config repository, and with it this process-wide singleton
    # (25 ms); a copy is never written, and the store hands out copies of what it holds anyway
    ConfigStore.__deepcopy__ = lambda self, memo: self
    config_loader_impl.create_defaults_list = defaults_list
    config_loader_impl.ConfigLoaderImpl._compose_config_from_defaults_list = merged


def _strip_defaults(cfg) -> None:
    """What Hydra's merge does last: the defaults lists left in any node removed (its own code's rule)."""
    from omegaconf import DictConfig, flag_override

    if not isinstance(cfg, DictConfig) or cfg._is_missing() or cfg._is_none():
        return
    with flag_override(cfg, ["readonly", "struct"], False):
        if cfg._get_flag("HYDRA_REMOVE_TOP_LEVEL_DEFAULTS"):
            cfg._set_flag("HYDRA_REMOVE_TOP_LEVEL_DEFAULTS", None)
            cfg.pop("defaults", None)
    for _key, value in cfg.items_ex(resolve=False):
        _strip_defaults(value)


def _named(defaults) -> tuple:
    return tuple((d.config_path, d.parent, d.package, d.is_self) for d in defaults)


def _packaged_sources(repo) -> tuple | None:
    """The repository's sources as a key, or None where one is a folder on disk."""
    sources = tuple((source.scheme(), source.path) for source in repo.get_sources())
    return None if any(scheme not in ("pkg", "structured") for scheme, _ in sources) else sources
