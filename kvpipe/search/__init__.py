"""The search stage: `kvpipe advise` and hydra/sweeper=search look through the cache space for the
Pareto front under the user's limits (space.py: what is searched; objectives.py: what is minimised;
search.py: the Optuna study and its rounds; sweeper.py: the Hydra sweeper that runs them)."""


def register_sweeper() -> None:
    """Hydra finds plugins by scanning the hydra_plugins namespace, which an editable install's
    import hook hides from it; registering the class by name works for every install."""
    from hydra.core.plugins import Plugins

    from hydra_plugins.kvpipe_search import KvpipeSearchSweeper

    Plugins.instance().register(KvpipeSearchSweeper)


def register_grid_sweeper() -> None:
    """The default sweeper (kvpipe.grid), registered as register_sweeper registers the search."""
    from hydra.core.plugins import Plugins

    from hydra_plugins.kvpipe_grid import KvpipeGridSweeper

    Plugins.instance().register(KvpipeGridSweeper)
