"""Hydra finds launchers only in the hydra_plugins namespace: this names kvpipe's default launcher
there (hydra/launcher=interleaved, conf/hydra/launcher/interleaved.yaml). The launcher itself is
kvpipe.orchestrate.interleave."""

from kvpipe.orchestrate.interleave import InterleavedLauncher


class KvpipeInterleavedLauncher(InterleavedLauncher):
    pass
