"""A group's option typed without OmegaConf where its values are already plain (kvpipe.jobspec.options.
plainly_typed) is exactly what OmegaConf's merge and to_object build, for every option of every
plugged group, at its defaults and at values OmegaConf would convert; anything else is left to
OmegaConf, whose checks and errors stay the user's."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from omegaconf import OmegaConf

from kvpipe.jobspec import options, schema

OPTIONS = [
    pytest.param(schema.option_schema(plugin), id=f"{group}={plugin.name}")
    for group, (registry, _) in schema.PLUGGED.items()
    for plugin in registry.registered()
]


def by_omegaconf(option, given):
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(option), given))


def defaults(option) -> dict:
    fields = dataclasses.fields(option)
    return {f.name: f.default_factory() if f.default is dataclasses.MISSING else f.default for f in fields}


def variants(option) -> list[dict]:
    """The defaults; every field at once at a value of its kind that OmegaConf converts or keeps (an
    int for a float, a list of ints for a list of floats); every field that may be null at null."""
    hints, given = typing.get_type_hints(option), defaults(option)
    converted, nulls = dict(given), dict(given)
    for name, hint in hints.items():
        optional = type(None) in typing.get_args(hint)
        base = next((a for a in typing.get_args(hint) if a is not type(None)), hint) if optional else hint
        sample = {float: 2, int: 3, bool: True, str: "text"}.get(base)
        if typing.get_origin(base) is list and typing.get_args(base) in ((float,), (int,)):
            sample = [1, 2]
        if sample is not None:
            converted[name] = sample
        if optional:
            nulls[name] = None
    return [given, converted, nulls]


@pytest.mark.parametrize("option", OPTIONS)
def test_plainly_typed_is_what_omegaconf_builds(option):
    for given in variants(option):
        fast = options.plainly_typed(option, given)
        if fast is not None:
            built = by_omegaconf(option, given)
            assert fast == built, given
            assert all(type(getattr(fast, k)) is type(getattr(built, k)) for k in given), given


def test_a_value_omegaconf_must_convert_or_refuse_is_left_to_it():
    option = schema.option_schema(schema.PLUGGED["press"][0].get("snapkv"))
    for value in ("abc", "8", "${oc.env:HOME}", "???", 8.5, True):
        assert options.plainly_typed(option, {**defaults(option), "window": value}) is None
