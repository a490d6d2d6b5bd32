"""Each choice of config groups composed once per process; the values set on the command line are
applied to a copy, by Hydra's own code, every time.

A Hydra composition spends most of its ~0.15 s (2 cores) on two steps that depend only on which
option each config group names (`cache=static`, `press=snapkv`), not on the values set
(`workload.max_new_tokens=4`): walking the defaults lists, and merging the configs they name. A
sweep composes each job's config again, and the test suite composes hundreds of configs that differ
only in values. Both steps are kept here, keyed by the group overrides, the config sources and the
ConfigStore's contents; Hydra then applies the value overrides, checks them and fills its own node
as it always does, so errors and results are Hydra's. Only packaged sources are kept (Hydra's and
kvpipe's `pkg://` folders, the ConfigStore): a folder on disk named by `hydra.searchpath` may change
while a process runs, so a composition that reads one is done in full.
"""

from __future__ import annotations

import copy
import dataclasses

_DEFAULTS: dict[tuple, object] = {}
_MERGED: dict[tuple, object] = {}
_store_version = 0  # bumped by every ConfigStore.store: a stored node changes what composes


def install() -> None:
    """From now on, compositions reuse their group choices' defaults list and merge (idempotent)."""
    from hydra._internal import config_loader_impl
    from hydra.core.config_store import ConfigStore

    if getattr(config_loader_impl.create_defaults_list, "composed_once", False):
        return
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
        key = (sources, _store_version, tuple((d.config_path, d.parent, d.package, d.is_self) for d in defaults))
        if key not in _MERGED:
            _MERGED[key] = merge(self, defaults, repo)
        return copy.deepcopy(_MERGED[key])

    counted_store.composed_once = defaults_list.composed_once = merged.composed_once = True
    ConfigStore.store = counted_store
    # Each composition deep-copies its config repository, and with it this process-wide singleton
    # (25 ms); a copy is never written, and the store hands out copies of what it holds anyway
    ConfigStore.__deepcopy__ = lambda self, memo: self
    config_loader_impl.create_defaults_list = defaults_list
    config_loader_impl.ConfigLoaderImpl._compose_config_from_defaults_list = merged


def _packaged_sources(repo) -> tuple | None:
    """The repository's sources as a key, or None where one is a folder on disk."""
    sources = tuple((source.scheme(), source.path) for source in repo.get_sources())
    return None if any(scheme not in ("pkg", "structured") for scheme, _ in sources) else sources
