"""Each packaged config file parsed once per process.

Hydra reads and parses every YAML file a composition names, each time it composes: about 17 files of
kvpipe's tree, 40% of a composition's 0.25 s on 2 cores. A sweep composes each job's config, and the
test suite composes hundreds. Files inside installed packages (Hydra's `pkg://` sources: kvpipe's
conf/ and Hydra's own) do not change while a process runs, so their parse is kept and each caller
gets a copy of its own; a folder on disk (`file://`, a user's hydra.searchpath) is read every time.
"""

from __future__ import annotations

import copy

_PARSED: dict[tuple[str, str], object] = {}


def install() -> None:
    """From now on, a packaged config file is parsed at its first load in this process (idempotent).
    The class patched is the one Hydra resolves `pkg://` sources to: its plugin scan executes its core
    plugins' modules again, and registers the class that run makes, not the one imported here."""
    from hydra._internal.sources_registry import SourcesRegistry
    from hydra.core.plugins import Plugins

    Plugins.instance()  # Hydra's plugin scan, which registers its config sources (once per process)
    source = SourcesRegistry.instance().resolve("pkg")
    if getattr(source.load_config, "parsed_once", False):
        return
    parse = source.load_config

    def load_config(self, config_path: str):
        key = (self.path, config_path)
        if key not in _PARSED:  # a file that is not there raises, every time, as Hydra's own does
            _PARSED[key] = parse(self, config_path)
        return copy.deepcopy(_PARSED[key])

    load_config.parsed_once = True
    source.load_config = load_config
