"""Comments that point a reader at kvpipe's code point at code that exists."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PATH = re.compile(r"\bkvpipe/[\w/]*\w(?:\.py)?/?")
MODULE = re.compile(r"\bkvpipe(?:\.[a-z_]\w*)+")


def _named_in_comments(path: Path) -> list[tuple[int, str]]:
    found = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if "#" in line:
            comment = line.split("#", 1)[1]
            found += [(number, name) for name in PATH.findall(comment) + MODULE.findall(comment)]
    return found


FILES = ("log", "db", "yaml", "json", "md")  # kvpipe.log is the job's log file, not a module


def _exists(name: str) -> bool:
    """A path under the repository, a module, or a module's top-level name (kvpipe.orchestrate.sweep.SweepCallback)."""
    if name.startswith("kvpipe/"):
        return (REPO / name.rstrip("/")).exists()
    if name.rpartition(".")[2] in FILES or importlib.util.find_spec(name) is not None:
        return True
    module, _, attribute = name.rpartition(".")
    spec = importlib.util.find_spec(module) if module.count(".") else None
    if spec is None or not spec.origin:
        return False
    tree = ast.parse(Path(spec.origin).read_text())
    defined = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    defined |= {
        t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)
    }
    return attribute in defined


def test_every_config_comment_names_a_module_that_exists():
    missing = [
        f"{path.relative_to(REPO)}:{number}: {name}"
        for path in sorted((REPO / "conf").rglob("*.yaml"))
        for number, name in _named_in_comments(path)
        if not _exists(name)
    ]
    assert missing == []


def test_the_check_sees_a_comment_naming_a_module_that_is_gone(tmp_path):
    stale = tmp_path / "config.yaml"
    stale.write_text("  - workload: chat  # kvpipe/job/workloads.py\nx: 1  # kvpipe.decide.plan, kvpipe/cache/\n")
    names = [name for _, name in _named_in_comments(stale)]
    assert names == ["kvpipe/job/workloads.py", "kvpipe/cache/", "kvpipe.decide.plan"]
    assert [name for name in names if not _exists(name)] == ["kvpipe/job/workloads.py", "kvpipe.decide.plan"]
