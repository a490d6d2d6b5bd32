"""The search: `kvpipe advise` and hydra/sweeper=search look through the cache space for the Pareto
front under the user's limits (space.py: what is searched; objectives.py: what is minimised;
study.py: the Optuna study; rounds.py: its ask/launch/tell rounds; progress.py: what it prints;
sweeper.py: the Hydra sweeper that runs them; launch.py: a search as a Python call)."""
