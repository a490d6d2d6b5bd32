"""Packaging that pyproject.toml cannot say: conf/ stays at the top level, where users edit it, and
ships inside the wheel as kvpipe.conf, each folder below it a package of YAML files found here, so a
new config group needs no edit (tests/test_packaging.py builds the wheel and checks). Everything else
is in pyproject.toml."""

from pathlib import Path

from setuptools import find_namespace_packages, find_packages, setup

CONF = Path(__file__).parent / "conf"
conf_packages = ["kvpipe.conf"] + [
    "kvpipe.conf." + ".".join(folder.relative_to(CONF).parts)
    for folder in sorted(CONF.rglob("*"))
    if folder.is_dir() and not folder.name.startswith(("_", "."))
]

setup(
    # hydra_plugins is a namespace package Hydra scans for plugins: kvpipe's sweeper lives there
    packages=[
        *find_packages(include=["kvpipe", "kvpipe.*"]),
        *find_namespace_packages(include=["hydra_plugins.*"]),
        *conf_packages,
    ],
    package_dir={"kvpipe.conf": "conf"},
    package_data={package: ["*.yaml"] for package in conf_packages},
)
