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
        "import sys, torch; from kvpipe._startup import prepare; prepare(); real = torch.compile; "
        "import transformers.cache_utils, hqq.core.quantize as q; "
        "print('torch._inductor.compile_fx' in sys.modules, torch.compile is real, "
        "q.HQQLinear.forward_pytorch_compile.__wrapped__.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True", "forward_pytorch_compile"]


def test_importing_kvpipe_sets_nothing_up():
    probe = "import sys, os, kvpipe.jobspec; print(len(sys.meta_path), 'MLFLOW_DISABLE_TELEMETRY' in os.environ)"
    bare = "import sys, os; print(len(sys.meta_path), 'MLFLOW_DISABLE_TELEMETRY' in os.environ)"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_DISABLE_TELEMETRY"}
    said = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
            for code in (probe, bare)]  # fmt: skip
    assert said[0] == said[1] and said[0].split()[1] == "False"


def test_mlflow_telemetry_is_off_unless_the_user_chose():
    probe = "from kvpipe._startup import prepare; import os; prepare(); print(os.environ['MLFLOW_DISABLE_TELEMETRY'])"
    said = [
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env).stdout.strip()
        for env in ({k: v for k, v in os.environ.items() if k != "MLFLOW_DISABLE_TELEMETRY"},
                    {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "false"})
    ]  # fmt: skip
    assert said == ["true", "false"]


def test_quanto_builds_with_the_ninja_of_kvpipes_own_environment(tmp_path, monkeypatch):
    from kvpipe.cache.backends import quanto

    (tmp_path / "ninja").touch()
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", os.pathsep.join(["/usr/bin", str(tmp_path), "/bin"]))
    quanto.prefer_this_environments_tools()
    assert os.environ["PATH"].split(os.pathsep) == [str(tmp_path), "/usr/bin", "/bin"]


def test_a_build_lock_left_by_a_killed_process_is_removed_and_a_fresh_one_kept(tmp_path, monkeypatch, caplog):
    from kvpipe.cache.backends import quanto

    stale, fresh = tmp_path / "cpp" / "build" / "lock", tmp_path / "cuda" / "build" / "lock"
    for lock in (stale, fresh):
        lock.parent.mkdir(parents=True)
        lock.touch()
    old = stale.stat().st_mtime - quanto.STALE_BUILD_LOCK_S - 60
    os.utime(stale, (old, old))
    found = type("Spec", (), {"submodule_search_locations": [str(tmp_path)]})
    monkeypatch.setattr(quanto, "find_spec", lambda name: found)
    quanto.clear_stale_build_locks()
    assert not stale.exists() and fresh.exists()
    assert "left by a process killed while it built" in caplog.text


@pytest.mark.slow  # starts kvpipe in a new process (~3 s)
def test_the_prompt_exit_keeps_what_a_normal_exit_does(tmp_path):
    """kvpipe.cli.run ends the process without the interpreter's teardown, after what a normal exit
    does first: other threads finish, exit handlers run, buffered output is written; and the status
    is main()'s."""
    script = f"""
import atexit, sys, threading, time
from pathlib import Path
from kvpipe import cli
threading.Thread(target=lambda: (time.sleep(0.3), Path({str(tmp_path / "thread")!r}).write_text("done"))).start()
atexit.register(lambda: print("exit handler ran"))
print("buffered", end="")
sys.argv = ["kvpipe", *sys.argv[1:]]
cli.run()
print("never reached")
"""
    good = subprocess.run([sys.executable, "-c", script, "plan", "model=tiny_random"], capture_output=True, text=True)
    assert good.returncode == 0 and good.stdout.startswith("buffered") and good.stdout.endswith("exit handler ran\n")
    assert "never reached" not in good.stdout and (tmp_path / "thread").read_text() == "done"
    bad = subprocess.run([sys.executable, "-c", script, "plan", "--hardware", "abacus"], capture_output=True, text=True)
    assert bad.returncode == 2 and "hardware" in bad.stderr and bad.stdout.endswith("exit handler ran\n")


@pytest.mark.slow  # a fresh interpreter running kvpipe up to its refusal
@pytest.mark.parametrize(
    "overrides, field",
    [
        (["workload=long_context", "workload.prompt_tokens=100000"], "workload.prompt_tokens=100000"),
        (["workload=passkey", "workload.context_tokens=[500,9000]"], "workload.context_tokens=[500, 9000]"),
    ],
)
def test_a_prompt_longer_than_the_models_positions_is_refused_before_torch_is_imported(tmp_path, overrides, field):
    """What the settings alone refuse (the prompt's length against the model's config.json) takes
    a second of CPU, not the five that importing torch and transformers first would add."""
    probe = (
        "import atexit, runpy, sys; atexit.register(lambda: print('torch imported:', 'torch' in sys.modules, "
        f"file=sys.stderr)); sys.argv = ['kvpipe', 'model=tiny_random', *{overrides!r}]; "
        "runpy.run_module('kvpipe', run_name='__main__')"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"kvpipe: error: {field} is not valid: expected " in done.stderr and "exceed the model's 4096" in done.stderr
    assert "torch imported: False" in done.stderr
