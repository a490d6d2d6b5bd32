"""Import every plugin module of a package, so that its classes register themselves by subclassing."""

from __future__ import annotations

import importlib
import pkgutil


def import_plugins(package: str, path, packages: bool = False) -> None:
    """Every module of `package` except `base` and private (_underscored) ones, and with
    packages=True its subpackages too (a plugin big enough for a folder of its own): adding a
    strategy, a backend or a workload is adding a module, with no list to edit."""
    for module in pkgutil.iter_modules(path):
        if module.name != "base" and not module.name.startswith("_") and (packages or not module.ispkg):
            importlib.import_module(f"{package}.{module.name}")
