"""The configs travel inside the wheel, so an installed kvpipe composes them too."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest

from conftest import REPO


@pytest.mark.slow  # builds the wheel
def test_wheel_contains_every_config_file_and_the_sweeper_plugin(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("kvpipe-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {f"kvpipe/conf/{p.relative_to(REPO / 'conf')}" for p in (REPO / "conf").rglob("*.yaml")}
    assert shipped and shipped <= names
    assert "kvpipe/cli.py" in names
    # Hydra scans the hydra_plugins namespace of an installed kvpipe for the search sweeper
    assert "hydra_plugins/kvpipe_search/__init__.py" in names and "hydra_plugins/__init__.py" not in names
