"""A sweep as a Python call: Hydra's multirun, in this process, as `kvpipe -m ...` would run it, with
the search sweeper (hydra/sweeper=search: `launch_search`) or the grid (`launch_sweep`).
`kvpipe advise` calls them."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

from kvpipe.errors import ConfigError, KvpipeError
from kvpipe.orchestrate.sweep import SweepState

SWEEP_DIR = "hydra.sweep.dir"


def sweep_dir_of(overrides: list[str], command: str) -> Path:
    """Where the command's sweep goes: the last hydra.sweep.dir the overrides give, its interpolations
    (${now:...}) resolved once so the folder announced is the one used; else outputs/COMMAND/DATE/TIME."""
    from hydra.core.utils import setup_globals
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    given = [o.value() for o in _parsed(overrides) if o.key_or_group == SWEEP_DIR and not o.is_delete()]
    if not given:
        return Path("outputs", command, datetime.now().strftime("%Y-%m-%d/%H-%M-%S"))
    setup_globals()  # Hydra's own resolvers (now:), as a sweep it launched would read the value
    try:
        return Path(str(OmegaConf.create({"dir": given[-1]}).dir))
    except OmegaConfBaseException:
        raise ConfigError(SWEEP_DIR, given[-1], "expected a folder: a path, which may use ${now:FORMAT}") from None


def _parsed(overrides: list[str]) -> list:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_overrides(overrides)


def _hydra_quoted(path: Path) -> str:
    """A path as one override value: quoted where Hydra's grammar would read it otherwise (a comma
    sweeps, a space or an = breaks the override)."""
    text = str(path)
    if re.fullmatch(r"[\w./:-]+", text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def launch_search(overrides: list[str], sweep_dir: Path, **settings) -> str:
    """Run the search over the cache space (settings: hydra.sweeper.* of conf/hydra/sweeper/search.yaml,
    e.g. trials=12, memory_budget="2GiB"; None is left at its default) with the user's overrides; its
    trials are a sweep's jobs in sweep_dir. Returns the sweep's MLflow parent run id. A search whose
    trials failed ends like a sweep with failed jobs: its parent is returned all the same."""
    from kvpipe.orchestrate.sweepers import register_search_sweeper

    register_search_sweeper()
    words = ["hydra/sweeper=search", *overrides]
    words += [f"hydra.sweeper.{name}={value}" for name, value in settings.items() if value is not None]
    return launch_sweep(words, sweep_dir)


def launch_sweep(overrides: list[str], sweep_dir: Path) -> str:
    """Run the sweep the overrides describe (`cache=dynamic,paged load.concurrency=1,4`: every
    combination, with the default grid sweeper) in sweep_dir (sweep_dir_of: the user's hydra.sweep.dir,
    where given); returns its MLflow parent run id."""
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from kvpipe.jobspec import register_schemas
    from kvpipe.orchestrate.sweepers import register_grid_sweeper
    from kvpipe.orchestrate.task import run_task, user_error

    register_schemas()
    register_grid_sweeper()
    GlobalHydra.instance().clear()
    try:
        # hydra.mode: what `-m` sets on the command line, which each job reads to run as a sweep's. The
        # user's hydra.sweep.dir gives way to sweep_dir (sweep_dir_of read it), where the state is read.
        given = [o.input_line for o in _parsed(overrides) if o.key_or_group != SWEEP_DIR]
        words = ["hydra.mode=MULTIRUN", *given, f"{SWEEP_DIR}={_hydra_quoted(sweep_dir)}"]
        with initialize_config_module(config_module="kvpipe.conf", version_base="1.3", job_name="kvpipe"):
            GlobalHydra.instance().hydra.multirun(
                config_name="config", task_function=run_task, overrides=words, with_log_configuration=True
            )
    except SystemExit as exc:  # the sweep's exit status: 1 when some trials failed
        if exc.code not in (0, 1, None):
            raise KvpipeError(f"the sweep stopped (exit {exc.code}); see its log in {sweep_dir}") from None
    except KvpipeError:
        raise
    except Exception as exc:  # noqa: BLE001 - Hydra's and OmegaConf's user errors as one line
        message = user_error(exc)
        if message is None:
            raise
        raise KvpipeError(message) from None
    finally:
        GlobalHydra.instance().clear()
    state = SweepState.load(sweep_dir)
    if state is None or not state.parent_run_id:
        raise KvpipeError(f"the sweep in {sweep_dir} has no MLflow parent run; its results are on disk there")
    return state.parent_run_id
