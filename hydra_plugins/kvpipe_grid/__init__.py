"""Hydra finds sweepers only in the hydra_plugins namespace: this names kvpipe's default grid
sweeper there (hydra/sweeper=grid, conf/hydra/sweeper/grid.yaml). The sweeper itself is kvpipe.orchestrate.grid."""

from kvpipe.orchestrate.grid import GridSweeper


class KvpipeGridSweeper(GridSweeper):
    pass
