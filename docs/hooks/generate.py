"""MkDocs hook: the manual's tables that come from the code, generated at build time so they cannot
drift. A page asks for one with a marker line, `<!-- generated: NAME -->`:

- `metrics`: every metric of kvpipe's catalogue (kvpipe.workload.metrics(): the core ones and each
  workload's), with its label, unit and direction from the code and its meaning from docs/metrics.yaml;
- `config-groups`: every config group under conf/, its options (the default first) and what each
  option's YAML says of itself in its first comment line;
- `hardware`: the accelerators of conf/hardware.yaml that `kvpipe plan --hardware NAME` knows;
- `cli`: each subcommand's `--help`, as `kvpipe NAME --help` prints it.

An unknown marker, a catalogued metric without a meaning, or a meaning for no metric fails the build.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml
from mkdocs.exceptions import PluginError

REPO = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)


def on_page_markdown(markdown: str, page, config, files) -> str:
    def replace(match: re.Match) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise PluginError(f"{page.file.src_path}: unknown generated table {name!r}; known: {', '.join(GENERATORS)}")
        return GENERATORS[name]()

    return MARKER.sub(replace, markdown)


def metrics_table() -> str:
    from kvpipe import workload

    catalogue = workload.metrics()
    entries = yaml.safe_load((REPO / "docs" / "metrics.yaml").read_text())
    described = [name for entry in entries for name in entry["metrics"]]
    unknown = [name for name in described if name not in catalogue]
    missing = [name for name in catalogue if name not in described]
    if unknown or missing:
        raise PluginError(
            f"docs/metrics.yaml and kvpipe's catalogue disagree: meanings for no metric {unknown}, "
            f"metrics without a meaning {missing}"
        )
    rows = ["| metric | shown as | better | meaning and how it is measured |", "|---|---|---|---|"]
    for entry in entries:
        metrics = [catalogue[name] for name in entry["metrics"]]
        names = ", ".join(f"`{m.name}`" for m in metrics)
        shown = "; ".join(dict.fromkeys(m.header() if m.format != "bytes" else f"{m.label} (bytes)" for m in metrics))
        better = {True: "lower", False: "higher", None: ""}[metrics[0].lower_is_better]
        rows.append(f"| {names} | {shown} | {better} | {entry['meaning']} |")
    return "\n".join(rows)


def config_groups_table() -> str:
    conf = REPO / "conf"
    defaults = {}
    for item in yaml.safe_load((conf / "config.yaml").read_text())["defaults"]:
        if isinstance(item, dict):
            ((group, option),) = item.items()
            defaults[group] = option
    rows = ["| group | options (default first) | code |", "|---|---|---|"]
    for folder in sorted(p for p in conf.iterdir() if p.is_dir() and p.name not in ("hydra", "__pycache__")):
        options = sorted(folder.glob("*.yaml"), key=lambda p: (p.stem != str(defaults.get(folder.name)), p.stem))
        cells = []
        for path in options:
            said = first_sentence(path)
            default = " (default)" if path.stem == str(defaults.get(folder.name)) else ""
            cells.append(f"`{path.stem}`{default}" + (f": {said}" if said else ""))
        if folder.name in defaults and defaults[folder.name] in (None, "null"):
            cells.insert(0, "none (default)")
        code = {"backend": "kvpipe/cache/backends/", "press": "kvpipe/cache/presses/", "axis": "kvpipe/cache/backends/",
                "experiment": "kvpipe/orchestrate/", "quality": "kvpipe/measure/quality.py",
                "tracking": "kvpipe/record/tracking.py"}.get(folder.name, f"kvpipe/{folder.name}/")  # fmt: skip
        rows.append(f"| `{folder.name}` | {'<br>'.join(cells)} | `{code}` |")
    return "\n".join(rows)


def first_sentence(path: Path) -> str:
    """What an option's YAML says of itself: the first sentence of its leading comment (Hydra's own
    `# @package` line aside)."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        if not line.startswith("# @package"):
            lines.append(line.lstrip("#").strip())
    said = " ".join(lines).split(" python -m kvpipe")[0]  # the example command a comment may go on to show
    return re.split(r"(?<=[.?;])\s", said, maxsplit=1)[0].rstrip(";:")


def hardware_table() -> str:
    entries = yaml.safe_load((REPO / "conf" / "hardware.yaml").read_text())
    rows = [
        "| `--hardware` | accelerator | memory | bandwidth | dense TFLOPS (bfloat16 / float16 / float32) | host memory |",
        "|---|---|--:|--:|--:|--:|",
    ]
    for name, entry in entries.items():
        flops = entry.get("peak_dense_tflops", {})
        tflops = " / ".join(str(flops.get(dtype, "–")) for dtype in ("bfloat16", "float16", "float32"))
        host = f"{entry['host_memory_gb']} GB" if "host_memory_gb" in entry else "– (`--host-memory`)"
        rows.append(
            f"| `{name}` | {entry.get('title', name)} | {entry.get('memory_gb', '–')} GB | "
            f"{entry.get('memory_bandwidth_gb_per_s', '–')} GB/s | {tflops} | {host} |"
        )
    return "\n".join(rows)


def cli_help() -> str:
    from kvpipe import cli

    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: one width for every build
    parts = []
    for name in cli.subcommands():
        parser = cli.subcommand_parser(only=name)
        command = parser._subparsers._group_actions[0].choices[name]
        parts.append(f"### `kvpipe {name}`\n\n```text\n{command.format_help().rstrip()}\n```\n")
    return "\n".join(parts)


GENERATORS = {
    "metrics": metrics_table,
    "config-groups": config_groups_table,
    "hardware": hardware_table,
    "cli": cli_help,
}
