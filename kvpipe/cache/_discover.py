"""Import every plugin module of a package, so that its classes register themselves by subclassing."""

from __future__ import annotations

import importlib
import pkgutil


def import_plugins(package: str, path) -> None:
    """Every module of `package` except `base` and private (_underscored) ones: adding a strategy or a
    backend is adding a module, with no list to edit."""
    for module in pkgutil.iter_modules(path):
        if module.name != "base" and not module.name.startswith("_") and not module.ispkg:
            importlib.import_module(f"{package}.{module.name}")
