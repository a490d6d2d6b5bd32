"""The suite's census (tests/census.py): what it adds up, how it files a moment, what it says of the budget."""

from __future__ import annotations

import sys

import budget
import census


def frame_in(path: str, function: str = "work"):
    """A live frame whose code claims to come from `path`, in `function`, called from this test."""
    namespace: dict = {}
    exec(compile(f"def {function}(sys):\n    return sys._getframe()\n", path, "exec"), namespace)
    return namespace[function](sys)


def test_a_moment_is_filed_under_the_innermost_kind_on_the_stack():
    assert census._kind_of(frame_in("/venv/site-packages/torch/_inductor/codecache.py")) == "compiling"
    assert census._kind_of(frame_in("/repo/kvpipe/measure/quality.py")) == "quality"
    assert census._kind_of(frame_in("/repo/kvpipe/model/loading.py", "load")) == "model loads"
    assert census._kind_of(frame_in("/repo/kvpipe/model/loading.py", "dtype_name")) == "other"


def frame_under(outer_path: str, inner_path: str):
    """A live frame in `inner_path`, called from a frame in `outer_path` (Hydra's launcher running a
    job, or a job composing a config)."""
    namespace: dict = {}
    exec(compile("def inner(sys):\n    return sys._getframe()\n", inner_path, "exec"), namespace)
    exec(compile("def outer(sys):\n    return inner(sys)\n", outer_path, "exec"), namespace)
    return namespace["outer"](sys)


def test_kvpipe_s_own_code_under_hydra_s_launcher_is_kvpipe_s_and_hydra_inside_kvpipe_is_hydra_s():
    job = census.KVPIPE_CODE + "job/runner.py"
    launcher = "/venv/site-packages/hydra/core/utils.py"
    assert census._kind_of(frame_under(launcher, job)) == census.KVPIPE
    assert census._kind_of(frame_under(job, launcher)) == "Hydra"
    assert census._kind_of(frame_in(job)) == census.KVPIPE  # no kind named: kvpipe's, not "other"
    assert census._kind_of(frame_under(launcher, census.KVPIPE_CODE + "measure/quality.py")) == "quality"


def test_workers_parts_add_up_file_by_file_and_kind_by_kind():
    one = {"files": {"tests/test_a.py": {"wall_s": 2.0, "children_cpu_s": 1.0, "tests": 3}},
           "kinds_s": {"imports": 5.0}, "before_first_test_s": 4.0, "session_s": 9.0}  # fmt: skip
    two = {"files": {"tests/test_a.py": {"wall_s": 3.0, "children_cpu_s": 0.0, "tests": 1},
                     "tests/test_b.py": {"wall_s": 1.0, "children_cpu_s": 0.0, "tests": 1}},
           "kinds_s": {"imports": 6.0, "generation": 1.0}, "before_first_test_s": 6.0, "session_s": 8.0}  # fmt: skip
    both = census.merged([one, two])
    assert both["files"]["tests/test_a.py"] == {"wall_s": 5.0, "children_cpu_s": 1.0, "tests": 4}
    assert both["kinds_s"] == {"imports": 11.0, "generation": 1.0}
    assert both["workers"] == 2 and both["before_first_test_s"] == 6.0


def test_the_report_says_the_budget_and_which_files_are_over_it_or_have_none(monkeypatch):
    monkeypatch.setattr(budget, "PARALLEL_S", 100)
    monkeypatch.setattr(budget, "FILES_S", {"test_a.py": 4.0})
    files = {"tests/test_a.py": {"wall_s": 5.0, "children_cpu_s": 0.0, "tests": 2},
             "tests/test_new.py": {"wall_s": 6.0, "children_cpu_s": 0.0, "tests": 1}}  # fmt: skip
    lines = census.report({"files": files, "kinds_s": {}, "workers": 2, "before_first_test_s": 1.0}, 120.0,
                          "parallel", every_file=False)  # fmt: skip
    assert "120 s wall on 2 worker(s) against a budget of 100 s (over)" in lines[0]
    (a,) = [line for line in lines if "test_a.py" in line]
    (new,) = [line for line in lines if "test_new.py" in line]
    assert a.endswith("over") and new.endswith("no budget")
    fast = census.report({"files": files, "kinds_s": {}, "workers": 2, "before_first_test_s": 1.0}, 50.0,
                         "fast", every_file=False)  # fmt: skip
    assert f"against a budget of {budget.FAST_S} s" in fast[0] and "(over)" not in fast[0]
    assert not any(line.endswith(("over", "no budget")) for line in fast[1:])
