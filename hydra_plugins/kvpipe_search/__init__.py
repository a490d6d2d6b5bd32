"""Hydra finds sweepers only in the hydra_plugins namespace: this names kvpipe's searches there
(hydra/sweeper=search, conf/hydra/sweeper/search.yaml; hydra/sweeper=capacity, conf/hydra/sweeper/capacity.yaml).
The searches themselves are kvpipe.orchestrate.search and kvpipe.orchestrate.capacity."""

from kvpipe.orchestrate.capacity.sweeper import CapacitySweeper
from kvpipe.orchestrate.search.sweeper import SearchSweeper


class KvpipeSearchSweeper(SearchSweeper):
    pass


class KvpipeCapacitySweeper(CapacitySweeper):
    """hydra/sweeper=capacity (kvpipe.orchestrate.capacity): here beside the search, so that an install
    made before it existed finds it too."""
