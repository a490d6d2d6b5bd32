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
import functools
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
        checked = plainly_typed(option, given)
        if checked is None:
            checked = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(option), given))
    except ValidationError as exc:
        key = str(exc.key)
        expected = type_text(typing.get_type_hints(option)[key])
        raise ConfigError(
            f"{group}.{key}", given.get(key), f"wrong type; expected {expected} ({group}={name}'s type)"
        ) from None
    ignored = {k: v for k, v in values.items() if k not in own and _given(registry, k, v)}
    return Typed(checked, ignored)


_NOT_PLAIN = object()


def plainly_typed(option: type, given: dict[str, Any]):
    """The option's dataclass built straight from `given`, where each value already has its field's
    plain type (bool, int, str, a float or an int for a float, null where the field allows it) and
    every other field has a default: what OmegaConf's merge and to_object build, without their cost
    (~2 ms a group, ~10 ms a composition). None where OmegaConf must convert or check something."""
    hints = _hints(option)
    for setting in dataclasses.fields(option):
        if not setting.init or (setting.name not in given and _has_no_default(setting)):
            return None
    plain = {key: _plain(hints[key], value) for key, value in given.items()}
    if any(value is _NOT_PLAIN for value in plain.values()):
        return None
    return option(**plain)


@functools.lru_cache(maxsize=None)
def _hints(option: type) -> dict[str, Any]:
    return typing.get_type_hints(option)


def _has_no_default(setting: dataclasses.Field) -> bool:
    return setting.default is dataclasses.MISSING and setting.default_factory is dataclasses.MISSING


def _plain(hint, value):
    """`value` as a field of type `hint` holds it, or _NOT_PLAIN where OmegaConf would have to decide."""
    if typing.get_origin(hint) is typing.Union:
        rest = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if value is None:
            return None if len(rest) < len(typing.get_args(hint)) else _NOT_PLAIN
        if len(rest) != 1:
            return _NOT_PLAIN
        hint = rest[0]
    kind = type(value)
    if hint is typing.Any:  # a value of any plain kind, or a list of such (workload.repeats, context_tokens)
        if kind is list:
            return _plain(list[typing.Any], value)
        return _plain(kind, value) if kind in (bool, int, float, str) else _NOT_PLAIN
    if typing.get_origin(hint) is list and kind is list:
        (item,) = typing.get_args(hint) or (typing.Any,)
        items = [_NOT_PLAIN if type(v) is list else _plain(item, v) for v in value]
        return _NOT_PLAIN if any(v is _NOT_PLAIN for v in items) else items
    if hint is float and kind in (int, float):
        return float(value)
    if hint in (bool, int) and kind is hint:
        return value
    if hint is str and kind is str and value != "???" and "${" not in value:  # OmegaConf's missing and interpolations
        return value
    return _NOT_PLAIN


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
