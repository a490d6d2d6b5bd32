"""Shared fixtures: Hydra composition, a scratch launch dir, and specs for tiny models."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvpipe.config import compose, register_schemas
from kvpipe.spec import Spec, make_spec

register_schemas()

REPO = Path(__file__).resolve().parents[1]


def compose_config(overrides: list[str] | None = None):
    """Compose conf/config.yaml with overrides, as `python -m kvpipe` would."""
    return compose(overrides or [])


def spec_for(*overrides: str) -> Spec:
    return make_spec(compose_config(list(overrides)))


TINY = ("model=tiny_random", "workload.max_new_tokens=6", "workload.warmup=0", "tracking=off", "quality=off")


@pytest.fixture
def tiny_spec():
    return lambda *extra: spec_for(*TINY, *extra)


def run_cli(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `python -m kvpipe ARGS` in cwd, as a user would."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run(
        [sys.executable, "-m", "kvpipe", *args], cwd=cwd, env=env, text=True, capture_output=True, timeout=timeout
    )
