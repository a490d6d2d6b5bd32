"""Command line. `kvpipe [overrides]` and `python -m kvpipe` run a Hydra job (or sweep, with -m);
`kvpipe NAME ...` runs a subcommand: each module of kvpipe/commands/ is one (its HELP, add_arguments
and run), found as plugins are, so a new subcommand is one module.

argparse rather than Typer: Hydra already owns the default command's argv and its --help, so the
subcommands need only a parser of their own, and argparse adds no dependency and no second style.
User mistakes print one line and exit 2; our own bugs keep their full traceback.
"""

from __future__ import annotations

import argparse
import ast
import atexit
import contextlib
import functools
import importlib
import importlib.util
import logging
import os
import pkgutil
import shlex
import sys
import threading

import hydra
from omegaconf import DictConfig, OmegaConf

from kvpipe import commands
from kvpipe._startup import prepare
from kvpipe.errors import KvpipeError, did_you_mean, fail
from kvpipe.jobspec import register_schemas
from kvpipe.orchestrate.task import run_task, user_error
from kvpipe.record import worker
from kvpipe.record.result import COMMAND_ENV

log = logging.getLogger("kvpipe")
INTERRUPTED = "kvpipe: interrupted; the current run is recorded as KILLED"

register_schemas()


def subcommands() -> list[str]:
    """Every subcommand: the public modules of kvpipe/commands/, found without importing them."""
    return sorted(m.name for m in pkgutil.iter_modules(commands.__path__) if not m.name.startswith("_"))


def _module(name: str):
    return importlib.import_module(f"{commands.__name__}.{name}")


@functools.cache
def help_line(name: str) -> str:
    """A subcommand's HELP, read from its source where it is a plain string: Hydra resolves `kvpipe
    --help`'s template at every composition, and importing every subcommand (pandas and more) cost
    each run 0.7 s on 2 cores."""
    source = importlib.util.find_spec(f"{commands.__name__}.{name}").origin
    with open(source, encoding="utf-8") as file:
        for node in ast.parse(file.read()).body:
            if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["HELP"]:
                with contextlib.suppress(ValueError):
                    return ast.literal_eval(node.value)
    return _module(name).HELP


# `kvpipe --help` (Hydra's, conf/config.yaml hydra.help) lists them, each with its HELP line
OmegaConf.register_new_resolver(
    "kvpipe_subcommands", lambda: "\n".join(f"  {name:10s}  {help_line(name)}" for name in subcommands())
)


def help_defaults(_root_) -> str:
    """`kvpipe --help`'s defaults: the composed config less Hydra's own, and less the model.* settings
    its model's source does not read (the schema's defaults for a random model's shape are not the
    embedded model's)."""
    from kvpipe.config import SOURCE_FIELDS, reads

    shown = OmegaConf.to_container(_root_, resolve=False)
    shown.pop("hydra", None)
    model = shown.get("model") or {}
    shown["model"] = {key: value for key, value in model.items() if reads(SOURCE_FIELDS, model.get("source"), key)}
    return OmegaConf.to_yaml(shown).replace("$", "$$")  # the help template is then a string.Template


OmegaConf.register_new_resolver("kvpipe_defaults", help_defaults)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, as every kvpipe user error
        raise KvpipeError(f"{self.prog}: {message}")


def subcommand_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The one parser for every subcommand (or, for speed, just the one being run: each module is
    imported to add its arguments)."""
    parser = _Parser(
        prog="kvpipe",
        description="Measure KV-cache strategies. Without a subcommand, "
        "`kvpipe [overrides]` runs a Hydra job; see `kvpipe --help`.",
    )
    parsers = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in subcommands():
        if only in (None, name):
            module = _module(name)
            command = parsers.add_parser(name, help=module.HELP, description=module.HELP)
            module.add_arguments(command)
            command.set_defaults(run=module.run, parser=command)
    return parser


def _run_subcommand(argv: list[str]) -> int:
    parser = subcommand_parser(only=argv[0])
    argv, uri = _store_setting(_dashed_values_joined(parser, argv), _takes_overrides(parser, argv[0]))
    args, extra = parser.parse_known_args(argv)
    if uri is not None:
        args.tracking_uri, args.uri_spelling = uri, "tracking.uri"
    if extra and hasattr(args, "overrides"):  # overrides after --flags: argparse leaves them over
        args.overrides += extra
    elif extra:
        args.parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args.run(args)


def _dashed_values_joined(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """`--memory-budget -1GiB` as `--memory-budget=-1GiB`: argparse takes a value that starts with a
    dash for an option and says "expected one argument"; joined, the value reaches its own check."""
    options = _subparser(parser, argv[0])._option_string_actions
    joined: list[str] = []
    for arg in argv:
        previous = options.get(joined[-1]) if joined else None
        taking_one = previous is not None and previous.option_strings and previous.nargs is None
        if taking_one and arg.startswith("-") and arg not in options and arg != "--":
            joined[-1] += "=" + arg
        else:
            joined.append(arg)
    return joined


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    (commands_action,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return commands_action.choices[name]


def _takes_overrides(parser: argparse.ArgumentParser, name: str) -> bool:
    """Whether subcommand `name` takes Hydra overrides of its own (plan, advise, capacity)."""
    return any(action.dest == "overrides" for action in _subparser(parser, name)._actions)


def _store_setting(argv: list[str], takes_overrides: bool) -> tuple[list[str], str | None]:
    """`tracking.uri=URI`, spelt as for runs, for the subcommands that read a store (compare,
    recommend, sync); one that takes overrides (plan, advise, capacity) keeps it among them, so that
    the jobs it launches record where the user said."""
    if takes_overrides:
        return argv, None
    uri = next((a.split("=", 1)[1] for a in argv if a.startswith("tracking.uri=")), None)
    return [a for a in argv if not a.startswith("tracking.uri=")], uri


@hydra.main(version_base="1.3", config_path="pkg://kvpipe.conf", config_name="config")
def _hydra_app(cfg: DictConfig) -> None:
    return run_task(cfg)


def subcommand(argv: list[str]) -> int:
    """Run `kvpipe NAME ...` (argv starts with NAME) and return its exit status; a user mistake is
    one line on stderr and status 2."""
    try:
        return _run_subcommand(argv)
    except KvpipeError as exc:
        print(f"kvpipe: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:  # capacity, advise: their sweep closed what it had begun as KILLED
        print(INTERRUPTED, file=sys.stderr)
        return 130


def run() -> None:
    """Entry point for `kvpipe` and `python -m kvpipe`: main(), then a prompt exit. After torch and
    transformers, the interpreter's shutdown frees some hundred thousand objects and unloads their
    libraries (0.3 s on 2 cores) for nothing: exit handlers run and output is flushed, then the
    process ends, as Python's own exit would have ended it but for that teardown."""
    try:
        main()
        status = 0
    except SystemExit as exc:
        if exc.code is not None and not isinstance(exc.code, int):
            raise
        status = exc.code or 0
    wait_for_threads = getattr(threading, "_shutdown", None)
    if wait_for_threads is None or sys.getprofile() or sys.gettrace():  # not CPython, or a profiler or
        sys.exit(status)  # debugger that writes its report once the process is done: the usual exit
    wait_for_threads()  # a normal exit's first step: other threads finish, executors shut down
    atexit._run_exitfuncs()  # its second: logging's flush, weakref finalizers, MLflow's end of run
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe (kvpipe ... | head) as at any exit
            stream.flush()
    os._exit(status)


def version() -> str:
    """`kvpipe --version`: kvpipe's version and the two libraries whose behaviour it measures, read
    from their installed metadata (importing torch takes seconds)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    def of(name: str) -> str:
        try:
            return installed(name)
        except PackageNotFoundError:
            return "not installed"

    from kvpipe import __version__

    return f"kvpipe {__version__} (torch {of('torch')}, transformers {of('transformers')})"


# Hydra's flags that take the next word as their value (--info's value is optional: one of INFO_TOPICS)
_VALUE_FLAGS = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd"}
_VALUE_FLAGS |= {"--experimental-rerun", "--shell-completion", "-sc"}
_INFO_TOPICS = {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}


def unknown_command(argv: list[str]) -> str | None:
    """The first bare word of a job's argv (no `=`, not a flag nor a flag's value, not `~key`), which
    Hydra would report as an override it cannot parse: the user most likely meant a subcommand."""
    skip = False
    for index, arg in enumerate(argv):
        if skip:
            skip = False
        elif arg in _VALUE_FLAGS or (
            arg in ("--info", "-i") and index + 1 < len(argv) and argv[index + 1] in _INFO_TOPICS
        ):
            skip = True
        elif not arg.startswith(("-", "~")) and "=" not in arg:
            return (
                f"unknown command {arg!r}{did_you_mean(arg, subcommands())} (subcommands: {', '.join(subcommands())}; "
                "a job takes key=value overrides)"
            )
    return None


def main() -> None:
    """What `kvpipe` and `python -m kvpipe` run: a subcommand, or a Hydra run or sweep."""
    if "--version" in sys.argv[1:] and sys.argv[1] not in subcommands():  # Hydra's would print its own
        print(version())
        sys.exit(0)
    prepare()
    _refuse_credentials_in_uri(sys.argv[1:])
    # What produced every run, as typed; launcher processes (joblib, submitit) inherit it
    os.environ.setdefault(COMMAND_ENV, shlex.join(["kvpipe", *sys.argv[1:]]))
    if len(sys.argv) > 1 and sys.argv[1] in subcommands():
        sys.exit(subcommand(sys.argv[1:]))
    if (message := unknown_command(sys.argv[1:])) is not None:
        fail(message)
    # Hydra's argparse cannot take overrides on both sides of -m; accept them anywhere.
    flags = [a for a in sys.argv[1:] if a in ("-m", "--multirun")]
    sys.argv[1:] = flags[:1] + [a for a in sys.argv[1:] if a not in ("-m", "--multirun")]
    # Let composition errors reach us instead of Hydra's multi-line report; we print one line.
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    from kvpipe.orchestrate.sweepers import register_grid_sweeper, register_search_sweeper

    try:
        if flags or "hydra.mode=MULTIRUN" in sys.argv:  # a sweep instantiates it (conf/hydra/sweeper/grid.yaml)
            register_grid_sweeper()
        if any(a.startswith("hydra/sweeper=") for a in sys.argv[1:]):
            register_search_sweeper()
        _hydra_app()
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr)
        sys.exit(130)
    except KvpipeError as exc:
        fail(str(exc))
    except Exception as exc:  # noqa: BLE001 - sorted into user errors vs our bugs below
        message = user_error(exc)
        if message is None:
            raise
        fail(message)
    finally:
        worker.stop()  # a sweep's tracking worker, whichever way the sweep ended


def _refuse_credentials_in_uri(argv: list[str]) -> None:
    """Here, before Hydra writes the overrides into the run's folder and kvpipe.command records them."""
    from kvpipe.record.auth import check_uri

    for arg in argv:
        if arg.lstrip("+~").startswith("tracking.uri="):
            try:
                check_uri(arg.split("=", 1)[1], "tracking.uri")
            except KvpipeError as exc:
                fail(str(exc))
