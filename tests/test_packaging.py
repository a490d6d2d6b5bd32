"""The configs travel inside the wheel, so an installed kvpipe composes them too."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest

from conftest import REPO


@pytest.mark.slow  # builds the wheel
def test_wheel_contains_every_config_file(tmp_path):
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
