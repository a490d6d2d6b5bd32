"""kvpipe's floors, read from its imports: each floor imports only the floors below it, and nothing
closes a cycle. Every import counts, wherever it is written: at the top of a module, inside a
function, under `if TYPE_CHECKING:`, or as a module's dotted name in a string (`importlib`, a worker's
warm-up list, a Hydra `_target_`). Third-party libraries have floors too: MLflow is record/'s alone
(every other floor goes through record's API), and the floors a config is validated on import no
heavy library when they load (torch, transformers, MLflow and the rest arrive inside functions)."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Bottom to top: each floor is one or more siblings, each sibling a set of packages or modules
# (a name covers what lies under it). Siblings on one floor never import each other.
FOUNDATION = ("kvpipe", "kvpipe.errors", "kvpipe.units", "kvpipe.registry", "kvpipe._startup", "kvpipe.disk_cache",
              "kvpipe.kill_points")  # fmt: skip
FLOORS: tuple[tuple[tuple[str, ...], ...], ...] = (
    (FOUNDATION,),
    (("kvpipe.config",),),
    (("kvpipe.catalogue",),),
    (("kvpipe.model",),),
    (("kvpipe.cache",), ("kvpipe.workload",), ("kvpipe.load",), ("kvpipe.engine",)),  # siblings: none imports another
    (("kvpipe.jobspec",),),
    (("kvpipe.measure",),),
    (("kvpipe.schedule",),),  # the measuring policy: order, guard, stop rule, over a job's calls
    (("kvpipe.job",),),
    (("kvpipe.record",),),
    (("kvpipe.predict",),),  # what a configuration will cost, without running it
    (("kvpipe.decide",),),  # judging what was recorded (it may set predictions beside it: compare --predicted)
    (("kvpipe.orchestrate",),),
    (("kvpipe.commands", "kvpipe.cli", "kvpipe.api", "kvpipe.__main__"),),
)


# A library only these packages import, anywhere in a module.
ONLY_UNDER = {
    "mlflow": ("kvpipe.record",),  # every other floor goes through record's API
    "optuna": ("kvpipe.orchestrate.search",),
    "datasets": ("kvpipe.workload.dataset",),  # a user's own prompt file
    "lm_eval": ("kvpipe.workload.lm_eval",),  # lm-evaluation-harness tasks (an optional extra)
    # compare's plots, a workload's own (passkey's heatmap), and a served run's timeline as it is recorded
    "matplotlib": ("kvpipe.decide", "kvpipe.workload", "kvpipe.record.requests"),
}
# The floors a config is validated on, before a job loads anything (kvpipe.jobspec and what it reads):
# none of their modules imports these at its top level.
LIGHT_FLOORS = ("kvpipe", "kvpipe.config", "kvpipe.catalogue", "kvpipe.model", "kvpipe.workload", "kvpipe.load",
                "kvpipe.engine", "kvpipe.jobspec")  # fmt: skip
HEAVY = ("torch", "transformers", "mlflow", "pandas", "numpy", "matplotlib", "optuna", "datasets", "lm_eval")


def modules(root: Path = REPO) -> dict[str, Path]:
    found = {}
    for path in sorted((root / "kvpipe").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _known(name: str, known: dict[str, Path]) -> str | None:
    """The module a dotted name lands in: itself, or the module that defines the attribute it names."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports(root: Path = REPO) -> dict[str, set[str]]:
    """module -> the kvpipe modules it imports. `from package import module` is an import of the
    module (the package's __init__ runs first, as it does for every import of a submodule)."""
    known = modules(root)
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                targets = [f"{base}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value.split(":")[0]  # "kvpipe.x.y:attr" as entry points write it
                if text in known:  # a module named whole (a tag such as "kvpipe.cache.requested" is not one)
                    targets = [text]
            for target in targets:
                if target.split(".")[0] != "kvpipe":
                    continue
                landed = _known(target, known)
                if landed and landed != name:
                    edges[name].add(landed)
    return edges


def third_party(root: Path = REPO) -> dict[str, tuple[set[str], set[str]]]:
    """module -> (the libraries it imports at its top level, those it imports anywhere), by their
    top-level name; kvpipe's own and relative imports left out."""
    found = {}
    for name, path in modules(root).items():
        found[name] = (set(), set())
        _library_imports(ast.parse(path.read_text(), str(path)), False, *found[name])
    return found


def _library_imports(node: ast.AST, in_function: bool, top: set[str], anywhere: set[str]) -> None:
    for child in ast.iter_child_nodes(node):
        roots = []
        if isinstance(child, ast.Import):
            roots = [alias.name.split(".")[0] for alias in child.names]
        elif isinstance(child, ast.ImportFrom) and not child.level and child.module:
            roots = [child.module.split(".")[0]]
        roots = [root for root in roots if root != "kvpipe"]
        anywhere.update(roots)
        if not in_function:
            top.update(roots)
        inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        _library_imports(child, inside, top, anywhere)


def library_misuses(root: Path = REPO) -> list[str]:
    """Every import of a library outside the packages it belongs to, and every heavy library a light
    floor imports at its top level."""
    found = []
    for module, (top, anywhere) in sorted(third_party(root).items()):
        for library in sorted(anywhere & set(ONLY_UNDER)):
            owners = ONLY_UNDER[library]
            if not any(module == owner or module.startswith(owner + ".") for owner in owners):
                found.append(f"{module} imports {library} (only {', '.join(owners)} may)")
        where = place(module)
        floor = FLOORS[where[0]][where[1]][0] if where else None
        for library in sorted(top & set(HEAVY)) if floor in LIGHT_FLOORS else ():
            found.append(
                f"{module} imports {library} at its top level (floor {floor} stays light; import it inside a function)"
            )
    return found


def place(module: str) -> tuple[int, int] | None:
    """(floor, sibling) of a module: the longest name that covers it. `kvpipe` itself (the package's
    __init__, which `import kvpipe.anything` runs first, so it sits at the bottom) covers only itself."""
    best, best_len = None, -1
    for floor, siblings in enumerate(FLOORS):
        for index, names in enumerate(siblings):
            for name in names:
                covers = module == name or (name != "kvpipe" and module.startswith(name + "."))
                if covers and len(name) > best_len:
                    best, best_len = (floor, index), len(name)
    return best


def floor_of(module: str) -> int | None:
    found = place(module)
    return None if found is None else found[0]


def climbing(root: Path = REPO) -> list[str]:
    """Every import that climbs a floor or crosses to a sibling on its own floor."""
    found = []
    for module, targets in sorted(imports(root).items()):
        for target in sorted(targets):
            if place(module) is None or place(target) is None:
                continue  # test_every_module_sits_on_a_floor names it
            (here, mine), (there, theirs) = place(module), place(target)
            if there > here:
                found.append(
                    f"{module} -> {target} (climbs from {FLOORS[here][mine][0]} to {FLOORS[there][theirs][0]})"
                )
            elif there == here and mine != theirs:
                found.append(f"{module} -> {target} (crosses to a sibling on its floor)")
    return found


def cycles(root: Path = REPO) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    graph = imports(root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(modules(root)):
        if node not in index:
            visit(node)
    return groups


def a_tree(root: Path, files: dict[str, str]) -> None:
    """A kvpipe package under root holding these files (paths below kvpipe/), each folder a package."""
    for relative, text in files.items():
        path = root / "kvpipe" / relative
        for folder in [root / "kvpipe", *(p for p in reversed(path.parents) if root / "kvpipe" in p.parents)]:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "__init__.py").touch()
        path.write_text(text)


def test_every_module_sits_on_a_floor():
    assert [m for m in modules() if floor_of(m) is None] == []


def test_no_import_climbs_a_floor():
    assert climbing() == []


def test_no_import_cycle():
    assert cycles() == []


def test_libraries_stay_on_their_floors():
    assert library_misuses() == []


def test_the_library_rules_can_fail(tmp_path):
    """A tree where compare calls MLflow itself (inside a function) and the config imports torch when
    it loads is caught twice; torch inside the config's function, and MLflow in record/, are fine."""
    a_tree(tmp_path, {
        "decide/compare.py": "def publish():\n    from mlflow.tracking import MlflowClient\n",
        "record/tracking.py": "import mlflow\n",
        "config.py": "import torch.nn\ndef late():\n    import transformers\n",
    })  # fmt: skip
    assert library_misuses(tmp_path) == [
        "kvpipe.config imports torch at its top level (floor kvpipe.config stays light; import it inside a function)",
        "kvpipe.decide.compare imports mlflow (only kvpipe.record may)",
    ]


def test_the_reader_sees_function_level_typing_and_string_imports(tmp_path):
    """The checks above can fail: a tree whose bottom floor reaches up three ways is caught three times."""
    package = tmp_path / "kvpipe"
    (package / "decide").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "decide" / "__init__.py").write_text("")
    (package / "decide" / "compare.py").write_text("import kvpipe.errors\n")
    (package / "cli.py").write_text("")
    (package / "errors.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from kvpipe.cli import main\n"
        "def late():\n    from kvpipe.decide import compare\n"
        "WARM = ('kvpipe.decide.compare',)\n"
    )
    assert len(climbing(tmp_path)) == 2  # errors -> cli, errors -> decide.compare (the string and the import)
    assert cycles(tmp_path) == [["kvpipe.decide.compare", "kvpipe.errors"]]


# MLflow's runs table and Run objects, spelled out: only record/ may (kvpipe.record.table names its
# columns, RunRecord carries a run), so that the floors above read runs as kvpipe's own data; and
# the catalogue, below it, a metric's column
MLFLOW_SHAPES = re.compile(r"""["']params\.|["']metrics\.|f["']tags\.|\.info\.run_id|\.data\.(params|metrics|tags)\b""")


def mlflow_shapes(root: Path = REPO) -> list[str]:
    found = []
    for module, path in sorted(modules(root).items()):
        if module in ("kvpipe.record", "kvpipe.catalogue") or module.startswith("kvpipe.record."):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if MLFLOW_SHAPES.search(line.split("#")[0]):
                found.append(f"{module}:{number}: {line.strip()}")
    return found


def test_only_record_spells_mlflows_runs_table():
    assert mlflow_shapes() == []


def test_the_runs_table_rule_can_fail(tmp_path):
    a_tree(tmp_path, {
        "decide/runs.py": 'NAME = "params.model.name"\nID = lambda run: run.info.run_id\n',
        "record/table.py": 'PARAMS = "params."\n',
    })  # fmt: skip
    assert mlflow_shapes(tmp_path) == [
        'kvpipe.decide.runs:1: NAME = "params.model.name"',
        "kvpipe.decide.runs:2: ID = lambda run: run.info.run_id",
    ]
