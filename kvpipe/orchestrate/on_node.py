"""Paired on every node (`pair_on_node`, on by default): where a launcher runs each job in a process of
its own (joblib, submitit, Ray), jobs cannot take turns with one another, so each job takes turns by
call with a copy of the sweep's baseline configuration, in its own process, on its own machine, with
one model load. Its run then carries the baseline's calls beside its own, and compare reads its
ratio from that pair: measured on one machine at one time, whatever machine the other jobs ran on.

The baseline is compare's: the sweep's dynamic cache where it has one, else its first job's cache;
only the cache's own settings are taken from it (`cache`, `backend`, `axis`, `press` and their keys),
so the copy runs the job's own model, workload and load. A job whose cache is the baseline's is
measured alone. What the copy measured is kept on the job's run only (`kvpipe.pair.*` tags), not as
a run of its own: the sweep holds each configuration once.
"""

from __future__ import annotations

from omegaconf import DictConfig, open_dict

from kvpipe.jobspec import STRATEGY_GROUPS, override_group
from kvpipe.measure.round_figures import CALL_PREFIX, PAIR_PREFIX, TAG_PREFIX, call_tags, round_tags

MEASURED_ORDER = "paired_on_node"
DYNAMIC = ("cache=dynamic",)


def strategy_overrides(overrides: list[str]) -> list[str]:
    """The overrides that choose and set the cache (cache, backend, axis, press and their keys)."""
    return [o for o in overrides if override_group(o) in STRATEGY_GROUPS and o != "press=none"]


def baseline_strategy(planned: list[list[str]] | None) -> list[str]:
    """The baseline's cache overrides: the first planned job on the dynamic cache (no cache override,
    or cache=dynamic, with no cache key and no press), else the first planned job's; a search plans
    no jobs, and is weighed against the dynamic cache."""
    jobs = [strategy_overrides(job) for job in planned or []]
    for strategy in jobs:
        if _is_dynamic(strategy):  # a backend or axis means nothing to the dynamic cache
            return [o for o in strategy if override_group(o) == "cache"] or list(DYNAMIC)
    return jobs[0] if jobs else list(DYNAMIC)


def _is_dynamic(strategy: list[str]) -> bool:
    settings = [o for o in strategy if override_group(o) in ("cache", "press")]
    return all(o.lstrip("+") == "cache=dynamic" for o in settings)


def partner_overrides(overrides: list[str], planned: list[list[str]] | None) -> list[str] | None:
    """The baseline copy's overrides for a job (its own, with the baseline's cache), or None where the
    job's cache is the baseline's (it is measured alone)."""
    base = baseline_strategy(planned)
    own = strategy_overrides(overrides)
    if sorted(own) == sorted(base) or (_is_dynamic(own) and _is_dynamic(base)):
        return None
    return [o for o in overrides if o not in own] + base


def compose_partner(hydra_cfg, overrides: list[str]) -> DictConfig:
    """The copy's config, composed as the job's was: from the same config sources, in the same order
    (`hydra.runtime.config_sources`: a user's --config-dir and search path hold), with Hydra's own
    loader. A launcher's job process need not hold the sweep's Hydra app (joblib's workers do not)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.config_search_path_impl import ConfigSearchPathImpl
    from hydra.types import RunMode

    search_path = ConfigSearchPathImpl()
    for source in hydra_cfg.runtime.config_sources:
        search_path.append(source.provider, f"{source.schema}://{source.path}")
    config = ConfigLoaderImpl(config_search_path=search_path).load_configuration(
        config_name=hydra_cfg.job.config_name,
        overrides=[*hydra_cfg.overrides.hydra, *overrides],
        run_mode=RunMode.RUN,  # as Hydra's load_sweep_config composes a job's
    )
    with open_dict(config):
        del config["hydra"]
    return config


def pair_tags(baseline, label: str, overrides: list[str]) -> dict[str, str]:
    """The copy's calls and rounds as the job's tags (`pair.call_tpot_ms`…), with its label and overrides."""
    series = {**round_tags(baseline.per_round), **call_tags(baseline.paired_calls(), baseline.call_keys())}
    # the series, and call_keys; not round_tags' interval_over
    kept = {name: value for name, value in series.items() if name.startswith((TAG_PREFIX, CALL_PREFIX))}
    return {
        PAIR_PREFIX + "label": label,
        PAIR_PREFIX + "overrides": " ".join(overrides) or "(defaults)",
        **{PAIR_PREFIX + name: value for name, value in kept.items()},
    }


def limits_line(launcher: str, base: list[str]) -> str:
    """What a sweep in processes of its own can and cannot say, in one line at its start."""
    return (
        f"hydra/launcher={launcher} runs each job in a process of its own, so jobs cannot take turns with one "
        f"another: each job takes turns by call with a copy of the baseline ({' '.join(base)}) in its own "
        "process (pair_on_node=true), and compare reads each job's ratio from that pair; raw timings of jobs "
        "measured on different hosts or devices are shown, never ranked against one another"
    )
