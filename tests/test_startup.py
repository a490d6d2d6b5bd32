"""Start-up: what a kvpipe process imports before it measures (kvpipe._startup)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kvpipe._startup import lazy_compile


def test_a_lazy_compile_calls_the_real_one_once_on_first_use_with_its_options():
    compiled = []

    def real(fn, **options):
        compiled.append(options)
        return lambda *args: ("compiled", fn(*args))

    @lazy_compile(real)(mode="default")
    def double(x):
        return 2 * x

    assert compiled == [] and double.__name__ == "double"
    assert double(3) == ("compiled", 6) and double(4) == ("compiled", 8)
    assert compiled == [{"mode": "default"}]


@pytest.mark.slow  # a fresh interpreter importing torch and transformers
def test_importing_transformers_caches_under_kvpipe_leaves_the_compiler_unimported_and_torch_compile_intact():
    probe = (
        "import sys, kvpipe, torch; real = torch.compile; import transformers.cache_utils, hqq.core.quantize as q; "
        "print('torch._inductor.compile_fx' in sys.modules, torch.compile is real, "
        "q.HQQLinear.forward_pytorch_compile.__wrapped__.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True", "forward_pytorch_compile"]


def test_mlflow_telemetry_is_off_unless_the_user_chose():
    probe = "import kvpipe, os; print(os.environ['MLFLOW_DISABLE_TELEMETRY'])"
    said = [
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env).stdout.strip()
        for env in ({k: v for k, v in os.environ.items() if k != "MLFLOW_DISABLE_TELEMETRY"},
                    {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "false"})
    ]  # fmt: skip
    assert said == ["true", "false"]
