"""Hydra finds sweepers only in the hydra_plugins namespace: this names kvpipe's search there
(hydra/sweeper=search, conf/hydra/sweeper/search.yaml). The search itself is kvpipe.orchestrate.search."""

from kvpipe.orchestrate.search.sweeper import SearchSweeper


class KvpipeSearchSweeper(SearchSweeper):
    pass
