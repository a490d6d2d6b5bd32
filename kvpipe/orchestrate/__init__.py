"""Orchestration: Hydra's side of kvpipe. One job end to end (pipeline), a sweep's parent run and its
skip and resume rules (sweep), the grid and search sweepers, and the search as a Python call."""
