"""The search stage: `kvpipe advise` and hydra/sweeper=search look through the cache space for the
Pareto front under the user's limits (space.py: what is searched; objectives.py: what is minimised;
search.py: the Optuna study and its rounds; sweeper.py: the Hydra sweeper that runs them)."""

from kvpipe.errors import KvpipeError


def register_sweeper() -> None:
    """Hydra finds plugins by scanning the hydra_plugins namespace, which an editable install's
    import hook hides from it; registering the class by name works for every install."""
    from hydra.core.plugins import Plugins

    from hydra_plugins.kvpipe_search import KvpipeSearchSweeper

    Plugins.instance().register(KvpipeSearchSweeper)


def register_grid_sweeper() -> None:
    """The default sweeper (kvpipe.grid), registered as register_sweeper registers the search."""
    from hydra.core.plugins import Plugins

    try:
        from hydra_plugins.kvpipe_grid import KvpipeGridSweeper
    except ImportError as exc:  # an editable install made before the module existed maps only the older ones
        raise KvpipeError(
            "this kvpipe install predates its grid sweeper (hydra_plugins.kvpipe_grid is missing): "
            "install it again (make venv, or pip install -e .)"
        ) from exc
    Plugins.instance().register(KvpipeGridSweeper)
