"""The chosen option of each plugged group, typed: what Hydra composed for the group (every key any
option declares, kvpipe.jobspec.schema) becomes the option's own dataclass, checked against its own
types and defaults; a setting of another option is set aside, to be refused or warned about.

Why composition is permissive and the option's types are checked here, not by one ConfigStore
schema per option: a sweep over a group's options (`-m cache=dynamic,static cache.max_cache_len=512`)
gives every job the same overrides, and a setting another option reads must stay a warning there,
which a struct schema per option would refuse at composition. Pure Python.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from kvpipe.errors import ConfigError, require_choice
from kvpipe.jobspec import schema


@dataclasses.dataclass(frozen=True)
class Typed:
    """A group's chosen option as its own dataclass, and the other options' settings given to it."""

    option: Any  # a kvpipe.config.OptionConfig
    ignored: dict[str, Any]


def typed(group: str, node) -> Typed:
    """`node` (the composed group, or an option's config already) as its option's own dataclass;
    a setting left null takes the option's default. Raises a one-line ConfigError for an unknown
    option or a value of the wrong type."""
    registry, common = schema.PLUGGED[group]
    values = {f.name: getattr(node, f.name) for f in dataclasses.fields(node)}
    name = values[registry.key]
    require_choice(registry.field, name, registry.names())
    option = schema.option_schema(registry.get(name))
    own = {f.name for f in dataclasses.fields(option)}
    shared = {f.name for f in dataclasses.fields(common)} if common else set()
    given = {k: v for k, v in values.items() if k in own and (v is not None or k in shared)}
    try:
        checked = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(option), given))
    except ValidationError as exc:
        key = str(exc.key)
        expected = type_text(typing.get_type_hints(option)[key])
        raise ConfigError(
            f"{group}.{key}", given.get(key), f"wrong type; expected {expected} ({group}={name}'s type)"
        ) from None
    ignored = {k: v for k, v in values.items() if k not in own and _given(registry, k, v)}
    return Typed(checked, ignored)


def ignored_warnings(group: str, typed_option: Typed) -> list[str]:
    """A warning for each setting of another option given to this one; a ConfigError where the
    option that declares it refuses to see it set elsewhere (Registered.refusal)."""
    registry, _ = schema.PLUGGED[group]
    name = getattr(typed_option.option, registry.key)
    warnings = []
    for key, value in typed_option.ignored.items():
        owner = next(p for p in registry.registered() if key in _setting_names(p))
        refusal = owner.refusal(key)
        if refusal:
            raise ConfigError(f"{group}.{key}", value, refusal)
        warnings.append(f"{group}.{key} is ignored by {group}={name}")
    return warnings


def type_text(hint) -> str:
    """`Optional[int]` -> 'int or null': a type as a user reads it."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is typing.Union:
        named = [type_text(arg) for arg in args if arg is not type(None)]
        return " or ".join(named + (["null"] if type(None) in args else []))
    return getattr(hint, "__name__", str(hint).replace("typing.", ""))


def _given(registry, key: str, value) -> bool:
    """Whether another option's setting was given: not null, and off every declaring option's default."""
    if value is None:
        return False
    declared = [f for p in registry.registered() for f in dataclasses.fields(p.Settings) if f.name == key]
    return all(value != _default(setting) for setting in declared)


def _default(setting: dataclasses.Field):
    return setting.default_factory() if setting.default is dataclasses.MISSING else setting.default


def _setting_names(plugin) -> set[str]:
    return {f.name for f in dataclasses.fields(plugin.Settings)}
