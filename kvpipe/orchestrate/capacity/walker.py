"""The capacity sweeper's batches: each cache's walk says its next load, every cache still walking is
launched in one batch (they take turns), each job's figures are read back (from its result.json, or,
reused with resume=true, from its FINISHED run in MLflow) and told to its walk; progress on stderr;
what was found in capacity.json."""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time
from pathlib import Path
from typing import Callable

from kvpipe.decide.capacity import Point, Targets
from kvpipe.decide.limits import limits_of
from kvpipe.errors import ConfigError
from kvpipe.jobspec.validated import override_key
from kvpipe.orchestrate.capacity.walks import ConcurrencyWalk, Figures, RateWalk
from kvpipe.orchestrate.launched import read_back
from kvpipe.record.result import Result
from kvpipe.units import duration_text

log = logging.getLogger(__name__)

RESULT_FILE = "capacity.json"
WALKS = ("rate", "concurrency")  # hydra.sweeper.walk
SERVED = "dynamic,paged,quantized"  # the caches a service question measures unless cache= narrows them
# the load settings a walk sets for each point: given by the user, they would fight it
WALK_SETS = ("load", "load.kind", "load.rate", "load.concurrency", "load.requests", "load.duration_s",
             "load.max_ttft_ms", "load.max_tpot_ms")  # fmt: skip


def split_arguments(arguments: list[str]) -> tuple[list[str], list[str]]:
    """(the choices walked: caches by name (`dynamic`), any other choice as its override (through an
    engine's server, the values of the one engine setting listed, `engine.cache_type=q8_0`, or of
    engine= itself); through an engine with none listed, its own cache alone (`dynamic`: its settings
    choose it); every other override, fixed for every point). Only one of cache=, engine= or an
    engine.* setting may list several values. Without one, dynamic, paged and quantized."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from kvpipe.cache import DEFAULT_BASELINE

    parsed = OverridesParser.create().parse_overrides(arguments)
    served_by_engine = any(
        o.get_key_element() == "engine" and (o.is_sweep_override() or o.get_value_element_as_str() != "transformers")
        for o in parsed
    )
    choices, fixed, walked, one_cache = [], [], None, None
    for override in parsed:
        key = override.get_key_element()
        if key in WALK_SETS:
            raise ConfigError(key, override.input_line.split("=", 1)[-1], "the walk sets the load of each point "
                              "itself; leave it out (the targets are --max-ttft-ms and --max-tpot-ms)")  # fmt: skip
        if not override.is_sweep_override():
            one_cache = override.input_line if key == "cache" else one_cache
            fixed += [] if key == "cache" else [override.input_line]
            continue
        if not (key in ("cache", "engine") or key.startswith("engine.")) or walked:
            raise ConfigError(key, override.input_line.split("=", 1)[-1], "only one of cache=, engine= or an "
                              "engine.* setting may list several values")  # fmt: skip
        walked = key
        choices = [value if key == "cache" else f"{key}={value}" for value in override.sweep_string_iterator()]
    if choices:
        fixed += [one_cache] if one_cache else []  # cache=dynamic beside an engine setting's values
    elif one_cache:
        choices = [one_cache.split("=", 1)[1]]
    else:
        choices = [str(DEFAULT_BASELINE)] if served_by_engine else SERVED.split(",")
    return choices, fixed


def as_override(choice: str) -> str:
    """A choice as the override that sets it: a cache's name is cache=<name>."""
    return choice if "=" in choice else f"cache={choice}"


def swept(choices: list[str]) -> str:
    """The choices as one sweep override again (`cache=dynamic,paged`), for the sweeper to split."""
    key = as_override(choices[0]).split("=", 1)[0]
    return f"{key}={','.join(as_override(choice).split('=', 1)[1] for choice in choices)}"


def shown(choice: str, fixed: list[str]) -> str:
    """How progress and tables name a choice: a cache by its name (`paged`); through an engine's
    server, the engine's own KV choice (`llama_cpp q8_0`)."""
    from kvpipe.jobspec import spec_from

    engine = spec_from([*fixed, as_override(choice), "load=rate"]).bound_engine
    return engine.label() if engine is not None else choice


class Walker:
    """One capacity sweep: `Walker.start(...)` sets its walks up, `run(launch)` its batches."""

    def __init__(self, settings, caches: list[str], fixed: list[str], spec, walks: dict, sweep_dir: Path,
                 launch_dir: Path, jobs_run_here: bool = False):  # fmt: skip
        self.settings, self.caches, self.fixed, self.spec, self.walks = settings, caches, fixed, spec, walks
        self.sweep_dir, self.launch_dir = sweep_dir, launch_dir
        self.jobs_run_here = jobs_run_here  # the launcher runs every job in this process
        self.names = {cache: shown(cache, fixed) for cache in caches}  # how progress names each choice
        self.warm: set[str] = set()  # the caches a job of this process has served (not reused from a store)
        self.started = time.monotonic()
        self.launched = self.reused = 0
        self.name = "capacity" if settings.walk == "rate" else "advise"

    @classmethod
    def start(cls, settings, arguments: list[str], launch_dir: Path, sweep_dir: Path,
              jobs_run_here: bool = False) -> Walker:  # fmt: skip
        from kvpipe.jobspec import spec_from

        if settings.walk not in WALKS:
            raise ConfigError("hydra.sweeper.walk", settings.walk, f"expected one of {', '.join(WALKS)}")
        caches, fixed = split_arguments(arguments)
        spec = spec_from([*fixed, as_override(caches[0]), "load=rate"])
        if settings.walk == "concurrency":
            figure = "goodput_requests_per_s" if settings.objective == "goodput" else "output_tokens_per_s"
            limits = limits_of(settings)
            walks = {cache: ConcurrencyWalk(cache, sorted(settings.levels), limits, figure) for cache in caches}
        else:
            targets = targets_of(settings)
            if not 0 < settings.resolution < 1:
                raise ConfigError("hydra.sweeper.resolution", settings.resolution,
                                  "expected a share of the rate above 0 and below 1, e.g. 0.1")  # fmt: skip
            if settings.requests < 2:
                raise ConfigError("hydra.sweeper.requests", settings.requests, "expected 2 or more requests per rate")
            bounds = memory_bounds(spec, fixed, caches, settings.memory_budget)
            walks = {c: RateWalk(c, targets, settings.resolution, settings.requests, bounds[c]) for c in caches}
        return cls(settings, caches, fixed, spec, walks, sweep_dir, launch_dir, jobs_run_here)

    def target_overrides(self) -> list[str]:
        """The targets every point's goodput counts against."""
        given = (("load.max_ttft_ms", self.settings.max_ttft_ms), ("load.max_tpot_ms", self.settings.max_tpot_ms))
        return [f"{key}={value:g}" for key, value in given if value is not None]

    def point_overrides(self, cache: str, load: list[str]) -> list[str]:
        """The targets, and what a rate point measures less of than a plain job unless the user set it:
        - one pass over its requests (a point's seeded arrivals are the same every pass, so more passes
          only re-time one schedule: the chat workload's 3 took 152 s of a 164 s point at 0.3 req/s,
          embedded model, 2-core VM);
        - no quality pass, but on the ceilings where --max-accuracy-drop needs full precision's accuracy
          (what a cache does to the answers does not change with the rate, and a labelled workload's
          accuracy is its own scoring, which every point keeps): on the default chat workload the
          ceilings' quality passes took 73 s of a 110 s first batch, 1 of 9 minutes (embedded model,
          2-core VM, 2026-12-08), for figures the verdict never read;
        - no warm-up where a job of this process has served the cache already (its ceiling, warmed up):
          the model, its kernels and the allocator are warm; a warm-up pass is every request at once,
          another ceiling's worth of time (~6 s a point, embedded model, 2-core VM);
        - no more requests let in once the targets are missed at the search's percentile whatever the
          rest do (stops_early)."""
        if self.settings.walk != "rate":
            return self.target_overrides()
        given = {override_key(o) for o in self.fixed}
        fewer = [] if "workload.repeats" in given else ["workload.repeats=1"]
        at_rate = "load=rate" in load
        quality_given = any(key == "quality" or key.startswith("quality.") for key in given)
        if not quality_given and (at_rate or self.settings.max_accuracy_drop is None):
            fewer.append("quality=off")
        if at_rate and cache in self.warm and "workload.warmup" not in given:
            fewer.append("workload.warmup=0")
        if at_rate and "workload.repeats" not in given and self.stops_early():
            fewer.append(f"load.stop_when_missed_at={self.settings.percentile}")
        return [*self.target_overrides(), *fewer]

    def stops_early(self) -> bool:
        """Whether a rate point may end once it has missed a target at the search's percentile,
        whatever its other requests do (load.stop_when_missed_at): its verdict is already "misses",
        and the rest of its requests would only queue. kvpipe's own servers and an engine's can (not a
        conversation's turns, which arrive after their answers)."""
        from kvpipe.jobspec.validated import cannot_stop_early

        return cannot_stop_early(self.spec) is None

    def run(self, launch: Callable) -> list:
        """Batches until every walk is done or the job budget is spent; `launch(jobs, first_index)`
        runs a batch of jobs (their overrides) and returns their JobReturns."""
        returns, job_index, batch_number = [], _next_job_index(self.sweep_dir), 0
        while batch := [(cache, *point) for cache, walk in self.walks.items() if (point := walk.next_load())]:
            if self.launched + len(batch) > self.settings.trials:
                self._say(f"stopped: the next batch would pass the budget of {self.settings.trials} jobs")
                break
            batch_number += 1
            points = ", ".join(f"{self.names[cache]} at {what}" for cache, what, _ in batch)
            self._say(f"batch {batch_number}: {points} · {duration_text(time.monotonic() - self.started)} elapsed")
            jobs = [[*self.fixed, as_override(cache), *load, *self.point_overrides(cache, load), "resume=true"]
                    for cache, _, load in batch]  # fmt: skip
            results = launch(jobs, job_index)
            job_index += len(jobs)
            self.launched += len(jobs)
            returns.append(results)
            for (cache, what, _), job in zip(batch, results, strict=True):
                reused = self.reused
                figures = self._figures(job)
                if self.jobs_run_here and figures.metrics is not None and self.reused == reused:
                    self.warm.add(cache)  # served here, not read back from an earlier search
                self._share_reference(figures)
                self._say_point(cache, what, figures, self.walks[cache].tell(figures))
        self._save()
        return returns

    def _share_reference(self, figures: Figures) -> None:
        """--max-accuracy-drop's reference: the full-precision answers' accuracy that a ceiling's
        quality pass measured (the same model and prompts for every cache), given to every rate walk
        before any rate is judged (the ceilings are the first batch)."""
        reference = (figures.metrics or {}).get("reference_accuracy")
        if reference is None or reference != reference:
            return
        for walk in self.walks.values():
            targets = getattr(walk, "targets", None)
            if targets is not None and targets.max_accuracy_drop is not None and targets.reference_accuracy is None:
                walk.targets = dataclasses.replace(targets, reference_accuracy=reference)

    # ---- reading a job back ----------------------------------------------------------------------

    def _figures(self, job) -> Figures:
        measured, result, why_not = read_back(job, self.spec, self.launch_dir)
        if measured is not None:
            self.reused += measured.reused
            return Figures(_numbers(measured.metrics), where=measured.where)
        where = f"job {Path(job.hydra_cfg.hydra.runtime.output_dir).name}"
        reason = (result.reason or "") if result is not None else ""
        if result is not None and result.status == "SKIPPED" and reason.startswith("measures the same as job "):
            # an earlier job of this folder (the same walk asked again in it) measured it: reused
            self.reused += 1
            earlier = reason.removeprefix("measures the same as job ").split(" ")[0]
            return Figures(_numbers(Result.load(self.sweep_dir / earlier / "result.json").metrics),
                           where=f"job {earlier}")  # fmt: skip
        return Figures(None, why_not, where)

    # ---- what it says ----------------------------------------------------------------------------

    def _say(self, text: str) -> None:
        print(f"{self.name}: {text}", file=sys.stderr, flush=True)

    def _say_point(self, cache: str, what: str, figures: Figures, point: Point | None) -> None:
        if figures.metrics is None:
            self._say(f"{self.names[cache]} at {what} failed ({figures.where}): {figures.failure}")
            return
        metrics, name = figures.metrics, self.names[cache]
        if self.settings.walk == "concurrency":
            stopped = self.walks[cache].stopped
            self._say(f"{name} at {what}: {metrics.get('output_tokens_per_s', float('nan')):.1f} tok/s, "
                      f"TPOT {metrics.get('tpot_ms', float('nan')):.1f} ms ({figures.where})"
                      + (f"; its walk stops: {stopped}" if stopped else ""))  # fmt: skip
            return
        if point is None:
            self._say(f"{name} serves {metrics.get('requests_per_s', float('nan')):.3g} requests/s with every "
                      f"request at once ({figures.where}): the search's ceiling")  # fmt: skip
            return
        p = self.settings.percentile
        measured = (f"TTFT p{p} {metrics.get(f'ttft_p{p}_ms', float('nan')):.0f} ms, "
                    f"TPOT p{p} {metrics.get(f'tpot_p{p}_ms', float('nan')):.1f} ms, "
                    f"{metrics.get('within_targets', float('nan')):.0%} within targets")  # fmt: skip
        outcome = "meets" if point.meets else "misses " + "; ".join(m.text() for m in point.misses)
        self._say(f"{name} at {what}: {outcome} ({measured}; {figures.where})")

    def _save(self) -> None:
        """capacity.json: the walks' findings, for `kvpipe capacity` and `kvpipe advise` to print."""
        found = {
            "walk": self.settings.walk,
            "targets": targets_of(self.settings).describe() if self.settings.walk == "rate" else None,
            "fixed": self.fixed,
            "jobs": self.launched,
            "reused": self.reused,
            "wall_s": time.monotonic() - self.started,
            "caches": [walk.as_dict() for walk in self.walks.values()],
        }
        (self.sweep_dir / RESULT_FILE).write_text(json.dumps(found, indent=2) + "\n")


def targets_of(settings) -> Targets:
    """The rate search's targets from the sweeper's settings, checked (one line naming the field)."""
    return Targets(settings.max_ttft_ms, settings.max_tpot_ms, settings.percentile, settings.min_goodput,
                   settings.min_accuracy, settings.max_accuracy_drop).check("hydra.sweeper.")  # fmt: skip


def memory_bounds(spec, fixed: list[str], caches: list[str], budget: str | None) -> dict[str, int | None]:
    """Per cache, plan's memory-bound capacity (kvpipe.predict.in_flight): the most requests of the
    workload's longest context that fit `budget` (default: the device's whole memory) beside the weights;
    none through an engine's server, whose cache plan does not predict."""
    from kvpipe import model
    from kvpipe.jobspec import spec_from
    from kvpipe.predict.hardware import device_memory
    from kvpipe.predict.in_flight import requests_in_flight
    from kvpipe.units import parse_bytes
    from kvpipe.workload import longest_prompt_of

    if spec.bound_engine is not None:  # an engine's server sizes its own cache: plan predicts kvpipe's
        return dict.fromkeys(caches)
    device = model.resolve_device(spec.model.device)
    dtype = model.dtype_name(spec.model.dtype, device)
    memory = parse_bytes(budget, "--memory-budget") if budget is not None else device_memory(device)[0]
    new_tokens = spec.workload.max_new_tokens
    batches = spec.bound_workload.batches(model.load_tokenizer(spec.model), "cpu")
    context = longest_prompt_of(batches, new_tokens) + new_tokens
    bounds = {}
    for cache in caches:
        one = spec_from([*fixed, as_override(cache), "load=rate"])
        bounds[cache] = requests_in_flight(one, one.strategy, device, dtype, context, memory).requests
    return bounds


def _numbers(metrics: dict) -> dict[str, float]:
    return {name: float("nan") if value is None else float(value) for name, value in metrics.items()}


def _next_job_index(sweep_dir: Path) -> int:
    numbers = [int(p.name) for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()]
    return max(numbers, default=-1) + 1
