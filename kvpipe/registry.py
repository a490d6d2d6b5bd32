"""Plugins by name: cache strategies (kvpipe.cache), quantization backends (kvpipe.cache.backends)
and workloads (kvpipe.workload) each keep one `Registry`, which their classes join by subclassing,
and `import_plugins` imports every module of their package so that they do."""

from __future__ import annotations

import importlib
import pkgutil
from typing import ClassVar, Generic, TypeVar

from kvpipe.errors import require_choice

T = TypeVar("T", bound="Registered")


class Registry(Generic[T]):
    """The classes of one kind, by name. `field` is the config field that chooses one (cache.strategy):
    an unknown name is a one-line ConfigError naming it and the registered ones."""

    def __init__(self, field: str):
        self.field = field
        self.group, _, self.key = field.partition(".")  # cache.strategy: the group `cache`, its key `strategy`
        self.classes: dict[str, type[T]] = {}

    def registered(self) -> list[type[T]]:
        """Every registered class, by `order`, then name: table and listing order."""
        return sorted(self.classes.values(), key=lambda c: (c.order, c.name))

    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.registered())

    def get(self, name: str) -> type[T]:
        require_choice(self.field, name, self.names())
        return self.classes[name]


class Registered:
    """A base class whose subclasses register themselves: one that sets `name` in its own body joins
    the base's `registry` as it is defined (one that does not, e.g. GroupedBackend, is a shared base)."""

    registry: ClassVar[Registry]
    name: ClassVar[str]
    order: ClassVar[int] = 100
    Settings: ClassVar[type]  # dataclass of the group's fields it reads, with their types and defaults
    # The Hydra overrides, beyond `group=name` itself, that make a quick valid job of it on
    # model=tiny_random (a load for a strategy that serves requests, a prompt long enough for a press)
    test_overrides: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            cls.registry.classes[cls.name] = cls

    @classmethod
    def refusal(cls, setting: str) -> str | None:
        """Why a job choosing another option of this group may not set this one's `setting` away from
        its default (None: it is merely ignored there, with a warning)."""
        return None


def import_plugins(package: str, path, packages: bool = False) -> None:
    """Every module of `package` except `base` and private (_underscored) ones, and with
    packages=True its subpackages too (a plugin big enough for a folder of its own): adding a
    strategy, a backend or a workload is adding a module, with no list to edit."""
    for module in pkgutil.iter_modules(path):
        if module.name != "base" and not module.name.startswith("_") and (packages or not module.ispkg):
            importlib.import_module(f"{package}.{module.name}")
