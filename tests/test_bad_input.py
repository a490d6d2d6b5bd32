"""The bad-input catalogue: one line naming the field and the valid choices, exit 2,
no traceback, nothing recorded, nothing heavy done first (validation precedes the heavy imports and the
model; how many seconds that takes depends on the machine, so it is no verdict here)."""

from __future__ import annotations

import pytest

from conftest import run_cli

CATALOGUE = {
    "unknown group option": (["cache=fastest"], "cache=fastest", "dynamic"),
    "unknown key": (["model.colour=red"], "model.colour", "dtype"),
    "appended unknown key": (["+workload.speed=3"], "workload.speed", "max_new_tokens"),
    "wrong type": (["workload.batch_size=two"], "workload.batch_size", "Integer"),
    "non-positive max_new_tokens": (["workload.max_new_tokens=0"], "workload.max_new_tokens=0", "positive"),
    "missing local model folder": (
        ["model=hf", "model.name_or_path=/no/such/model"],
        "model.name_or_path",
        "config.json",
    ),
    "unknown dtype": (["model.dtype=float8"], "model.dtype='float8'", "bfloat16"),
    "unknown workload": (["workload=essay"], "workload=essay", "long_context"),
    "a preset without its +": (["experiment=cache_shootout"], "experiment", "use +experiment=cache_shootout"),
    "--cfg in a multirun": (["-m", "cache=dynamic,static", "--cfg", "job"], "--cfg", "without -m"),
    "repeats neither a count nor auto": (["workload.repeats=often"], "workload.repeats", "positive integer or auto"),
    "repeats=auto with a target outside (0, 1)": (
        ["workload.repeats=auto", "workload.target_interval=1.5"],
        "workload.target_interval=1.5",
        "fraction in (0, 1)",
    ),
    "interleaving asked of a launcher that cannot": (
        ["-m", "cache=dynamic,static", "interleave=true", "hydra/launcher=parallel"],
        "interleave='true'",
        "hydra/launcher=interleaved can",
    ),
    "a press ratio of 1 or more": (["press=snapkv", "press.ratio=1"], "press.ratio=1", "not including) 1"),
    "a press on a cache it cannot evict from": (["press=knorm", "cache=static"], "press.name", "cache=dynamic"),
    "an unknown press": (["press=h2o"], "press=h2o", "snapkv"),
    "a wrong type for the chosen option": (["press=snapkv", "press.window=abc"], "press.window='abc'", "expected int"),
    "a wrong type for a load": (["load=rate", "load.rate=fast"], "load.rate='fast'", "expected float"),
    "repeats=auto deciding within a share outside (0, 1)": (
        ["workload.repeats=auto", "workload.decide_within=0"],
        "workload.decide_within=0",
        "fraction in (0, 1)",
    ),
    "an unknown turn for interleaved rounds": (
        ["-m", "cache=dynamic,static", "hydra.launcher.turn=round"],
        "hydra.launcher.turn='round'",
        "call, pass",
    ),
    "a negative wait for quiet": (
        ["-m", "cache=dynamic,static", "hydra.launcher.quiet_wait_s=-1"],
        "hydra.launcher.quiet_wait_s=-1",
        "0 or more",
    ),
    "an unknown interleave": (
        ["-m", "cache=dynamic,static", "interleave=sometimes"],
        "interleave",
        "auto, true, false",
    ),
}


@pytest.mark.slow  # starts a kvpipe process per case
@pytest.mark.parametrize("case", sorted(CATALOGUE))
def test_bad_input_gets_one_line_error_and_exit_2(case, tmp_path, monkeypatch):
    from kvpipe import model
    from kvpipe.model import loading

    heavy = []  # what ran that validation should have spared: the heavy imports, a model's load
    for module in (model, loading):
        monkeypatch.setattr(module, "import_libraries", lambda: heavy.append("imports") or 0.0)
        monkeypatch.setattr(module, "load", lambda cfg: heavy.append(f"load {cfg.name}"))
    args, field, hint = CATALOGUE[case]
    proc = run_cli(args, cwd=tmp_path, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("kvpipe: error: ")
    assert field in lines[0] and hint in lines[0]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "outputs" / "mlflow.db").exists()  # no MLflow run left behind
    assert heavy == []


@pytest.mark.slow  # starts a kvpipe process
def test_help_describes_kvpipe_its_groups_and_subcommands(tmp_path):
    proc = run_cli(["--help"], cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("kvpipe: measure how a KV-cache strategy trades memory")
    assert "powered by Hydra" not in proc.stdout
    for name in ("compare", "recommend", "plan", "sync"):
        assert f"  {name} " in proc.stdout
    groups = proc.stdout.split("== Config groups (group=option) ==")[1]
    assert "cache: dynamic, offloaded, offloaded_static, paged, quantized, static, static_compiled" in groups
    assert "load: concurrency, offline, rate" in groups
    assert "tab completion" in proc.stdout.lower()


def test_validation_does_not_import_heavy_libraries():
    import subprocess
    import sys

    code = (
        "import sys; from conftest import spec_for; spec_for('workload.max_new_tokens=3'); "
        "print(sorted(m for m in ('torch', 'transformers', 'mlflow') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=__import__("pathlib").Path(__file__).parent,
        check=True,
    )
    assert out.stdout.strip() == "[]"


def test_sync_does_not_import_the_measuring_engine():
    import subprocess
    import sys

    code = (
        "import sys, kvpipe.record.sync; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers') "
        "or m.split('.')[:2] in (['kvpipe', 'job'], ['kvpipe', 'measure'])))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
