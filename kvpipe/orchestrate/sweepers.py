"""kvpipe's Hydra plugins, registered by name: three sweepers, the grid (the default,
kvpipe.orchestrate.grid), the search (hydra/sweeper=search, kvpipe.orchestrate.search.sweeper) and the
capacity walks (hydra/sweeper=capacity, kvpipe.orchestrate.capacity.sweeper),
and the interleaving launcher (the default, kvpipe.orchestrate.interleave), and the launcher onto a Ray
cluster (hydra/launcher=ray_cluster, kvpipe.orchestrate.cluster)."""

from kvpipe.errors import KvpipeError


def register_search_sweeper() -> None:
    """Hydra finds plugins by scanning the hydra_plugins namespace, which an editable install's
    import hook hides from it; registering the class by name works for every install."""
    from hydra.core.plugins import Plugins

    from hydra_plugins.kvpipe_search import KvpipeSearchSweeper

    Plugins.instance().register(KvpipeSearchSweeper)


def register_capacity_sweeper() -> None:
    """hydra/sweeper=capacity (kvpipe.orchestrate.capacity), registered as the search is."""
    from hydra.core.plugins import Plugins

    from hydra_plugins.kvpipe_search import KvpipeCapacitySweeper

    Plugins.instance().register(KvpipeCapacitySweeper)


def register_grid_sweeper() -> None:
    """The default sweeper and launcher, and the Ray cluster's launcher, registered as the search is."""
    from hydra.core.plugins import Plugins

    try:
        from hydra_plugins.kvpipe_grid import KvpipeGridSweeper
        from hydra_plugins.kvpipe_interleaved import KvpipeInterleavedLauncher
        from hydra_plugins.kvpipe_ray import KvpipeRayLauncher  # imports nothing of Ray until it launches
    except ImportError as exc:  # an editable install made before the module existed maps only the older ones
        raise KvpipeError(
            f"this kvpipe install predates one of its Hydra plugins ({exc.name} is missing): "
            "install it again (make venv, or pip install -e .)"
        ) from exc
    Plugins.instance().register(KvpipeGridSweeper)
    Plugins.instance().register(KvpipeInterleavedLauncher)
    Plugins.instance().register(KvpipeRayLauncher)
