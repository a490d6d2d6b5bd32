"""One search: the space, the Optuna study, and the rounds of ask, launch and tell (see sweeper.py)."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kvpipe.decide.recommend import Limits, limits_from
from kvpipe.errors import ConfigError, KvpipeError
from kvpipe.orchestrate.search import objectives
from kvpipe.orchestrate.search.space import DIMENSIONS, Point, Space, build
from kvpipe.record.result import Result
from kvpipe.units import human_bytes
from kvpipe.workload import longest_prompt_of

log = logging.getLogger(__name__)

STUDY_FILE = "optuna.db"
# What a trial's user attributes hold (Optuna's own storage keeps them across processes)
POINT, OUTCOME, CONSTRAINTS, DETAIL = "point", "outcome", "constraints", "detail"
MEASURED, REUSED, PRUNED, INFERRED, FAILED = "measured", "reused", "pruned", "inferred", "failed"  # outcomes
SAMPLERS = ("frontier", "nsga2")


@dataclass
class Seen:
    """A point's outcome in this study: its values and constraints, or why it has none."""

    outcome: str
    values: list[float] | None = None
    constraints: list[float] | None = None
    detail: str = ""
    label: str = ""


def split_arguments(arguments: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """(fixed overrides, the space's dimensions the user narrowed): `backend=hqq` or
    `backend.nbits=2,4` restrict the search; every other override is fixed for every trial."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    fixed, restrict = [], {}
    for override in OverridesParser.create().parse_overrides(arguments):
        key = override.get_key_element()
        swept = override.is_sweep_override()
        if key in DIMENSIONS:
            values = list(override.sweep_string_iterator()) if swept else [override.get_value_element_as_str()]
            restrict[key] = values
        elif swept:
            value = override.input_line.split("=", 1)[-1]
            raise ConfigError(
                key, value, f"a search sweeps only the cache space ({', '.join(DIMENSIONS)}); give it one value"
            )
        else:
            fixed.append(override.input_line)
    return fixed, restrict


def limits_of(settings) -> Limits:
    return limits_from(settings.memory_budget, settings.max_tpot_ms, settings.max_kl, settings.min_accuracy)


def default_storage(tracking_uri: str, launch_dir: Path, store_dir: str) -> str:
    """The study's home: beside an SQLite tracking store, else in the launch dir's store folder."""
    if tracking_uri.startswith("sqlite:///"):
        folder = Path(tracking_uri.removeprefix("sqlite:///")).parent
    else:
        folder = (launch_dir / store_dir).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / STUDY_FILE}"


def study_name(spec, space: Space, limits: Limits, fixed: list[str]) -> str:
    """Equal for the same search asked again: the model, the fixed overrides, the space and the limits."""
    digest = hashlib.sha256(
        json.dumps([fixed, [p.label() for p in space.points], limits.describe()]).encode()
    ).hexdigest()[:10]
    return f"advise {spec.model.name} {spec.workload.kind} {digest}"


class Search:
    def __init__(self, settings, fixed, spec, space, limits, device, study, launch_dir, sweep_dir):
        self.settings, self.fixed, self.spec, self.space = settings, fixed, spec, space
        self.limits, self.device, self.study = limits, device, study
        self.launch_dir, self.sweep_dir = launch_dir, sweep_dir
        # a workload that scores retrieval: its quality objective is 1 - accuracy (objectives.values)
        self.passkey = any(m.name == "retrieval_accuracy" for m in spec.workload_kind.metrics)
        self.seen: dict[Point, Seen] = self._seen_before() if study is not None else {}
        self._bytes = None  # (weights, kv shape, longest prompt): made on the first pruning check
        self.started = time.monotonic()

    @classmethod
    def start(cls, settings, arguments: list[str], launch_dir: Path, sweep_dir: Path) -> "Search":
        import optuna

        from kvpipe import model
        from kvpipe.record.tracking import resolve_uri
        from kvpipe.spec import compose, make_spec

        fixed, restrict = split_arguments(arguments)
        spec = make_spec(compose(fixed), fixed)
        shape = model.describe(spec.model)
        device = model.resolve_device(spec.model.device) if spec.model.device == "auto" else spec.model.device
        space = build(shape.head_dim, device, restrict, settings.group_sizes, settings.residual_lengths)
        if not space.points:
            raise KvpipeError(f"the search space is empty after {restrict}; loosen the restriction")
        fixed = _scored_alike(fixed, spec, space)
        limits = limits_of(settings)
        uri, _ = resolve_uri(spec.tracking.uri, launch_dir, store_dir=spec.tracking.store_dir)
        storage = settings.storage or default_storage(uri, launch_dir, spec.tracking.store_dir)
        name = settings.study_name or study_name(spec, space, limits, fixed)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        search = cls(settings, fixed, spec, space, limits, device, None, launch_dir, sweep_dir)
        search.study = optuna.create_study(
            storage=storage, study_name=name, directions=["minimize"] * 3, sampler=search._sampler(),
            load_if_exists=True,
        )  # fmt: skip
        search.seen = search._seen_before()
        log.info(
            "search %r: %d configurations (%s), study in %s; objectives: %s",
            name, len(space.points), "every one measured" if search.exhaustive else f"at most {settings.trials} measured",
            storage, ", ".join(objectives.axis_names(device, search.passkey)),
        )  # fmt: skip
        for note in space.left_out:
            log.info("left out of the space: %s", note)
        return search

    def _sampler(self):
        import optuna

        from kvpipe.orchestrate.search.frontier import FrontierSampler

        if self.settings.sampler not in SAMPLERS:
            raise ConfigError("hydra.sweeper.sampler", self.settings.sampler, f"expected one of {', '.join(SAMPLERS)}")
        if self.settings.sampler == "frontier":
            return FrontierSampler(self.space, self.predicted_memory, self.quality_limit, seed=self.settings.seed)
        population = self.settings.population_size or max(
            4, min(len(self.space.points), self.settings.trials // 3 or 4)
        )
        return optuna.samplers.NSGAIISampler(
            population_size=population, seed=self.settings.seed, constraints_func=_constraints
        )

    @property
    def quality_limit(self) -> float | None:
        """The limit on the quality objective (KL, or 1 - retrieval accuracy)."""
        if self.passkey:
            return None if self.limits.accuracy is None else 1 - self.limits.accuracy
        return self.limits.kl

    @property
    def exhaustive(self) -> bool:
        return len(self.space.points) <= self.settings.trials

    # ---- the study's memory --------------------------------------------------------------------

    def _seen_before(self) -> dict[Point, Seen]:
        """Points this study has an outcome for (from earlier processes too); trials a kill left
        RUNNING are failed, so that their points are asked again."""
        from optuna.trial import TrialState

        labels = {p.label(): p for p in self.space.points}
        seen = {}
        for trial in self.study.get_trials(deepcopy=False):
            if trial.state == TrialState.RUNNING:
                self.study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
                continue
            point = labels.get(trial.user_attrs.get(POINT, ""))
            if point is None or OUTCOME not in trial.user_attrs or point in seen:
                continue
            seen[point] = Seen(
                trial.user_attrs[OUTCOME], list(trial.values) if trial.values else None,
                trial.user_attrs.get(CONSTRAINTS), trial.user_attrs.get(DETAIL, ""),
            )  # fmt: skip
        return seen

    def measured(self) -> int:
        return sum(s.outcome == MEASURED for s in self.seen.values())

    # ---- rounds ----------------------------------------------------------------------------------

    def run(self, launch: Callable, batch_size: int):
        from optuna.distributions import CategoricalDistribution

        distributions = {name: CategoricalDistribution(values) for name, values in self.space.choices().items()}
        self._enqueue_first_generation()
        returns, job_index = [], self._next_job_index()
        while self.measured() < self.settings.trials and self._left():
            if self.settings.timeout_s and time.monotonic() - self.started > self.settings.timeout_s:
                log.warning("search: timeout of %gs reached; no new trials", self.settings.timeout_s)
                break
            batch = self._ask(distributions, min(batch_size, self.settings.trials - self.measured()))
            if not batch:
                break
            jobs = [[*self.fixed, *point.overrides(), "resume=true"] for _, point in batch]
            results = launch(jobs, job_index)
            job_index += len(jobs)
            returns.append(results)
            for (trial, point), job in zip(batch, results, strict=True):
                self._tell(trial, point, self._outcome(point, job))
        self._print_front()
        return returns

    def _left(self) -> list[Point]:
        """Points still worth a job: not seen, and (unless every point is measured) not inferred to miss."""
        inferred = {} if self.exhaustive else self._inferred()
        return [p for p in self.space.points if p not in self.seen and p not in inferred]

    def _inferred(self) -> dict:
        from kvpipe.orchestrate.search.frontier import inferred_misses

        measured = {p: s.values for p, s in self.seen.items() if s.values}
        return inferred_misses(self.space, measured, self.quality_limit)

    def _enqueue_first_generation(self) -> None:
        """Every unseen point when the budget covers the space; else, for NSGA-II, the space's extremes
        first (the frontier walk chooses its own)."""
        if not self.exhaustive and self.settings.sampler != "nsga2":
            return
        unseen = [p for p in self.space.points if p not in self.seen]
        first = unseen if self.exhaustive else _extremes(unseen)
        for point in first:
            self.study.enqueue_trial(self.space.encode(point), skip_if_exists=True)

    def _ask(self, distributions, size: int) -> list:
        """Up to `size` trials at points not yet measured; the rest of what the study asks is told
        at once (a point seen before, or one the plan prunes)."""
        batch, tries = [], 0
        while len(batch) < size and tries < 50 * size:
            tries += 1
            trial = self.study.ask(distributions)
            point = self.space.decode(trial.params)
            trial.set_user_attr(POINT, point.label())
            if point in self.seen:
                self._tell(trial, point, self.seen[point], again=True)
            elif any(point == p for _, p in batch):
                self.study.tell(trial, state=_state("FAIL"))  # asked twice in one batch: the first one measures it
            elif (pruned := self._pruned(point)) is not None:
                self._tell(trial, point, pruned)
            elif not self.exhaustive and (missed := self._inferred().get(point)) is not None:
                self._tell(trial, point, _inferred_miss(missed, self.quality_limit, self.passkey))
            else:
                batch.append((trial, point))
            if tries == 25 * size and not batch:  # the sampler keeps to seen points: take an unseen one
                left = self._left()
                if left:
                    self.study.enqueue_trial(self.space.encode(random.Random(tries).choice(left)))
                else:
                    break
        return batch

    def _tell(self, trial, point: Point, seen: Seen, again: bool = False) -> None:
        trial.set_user_attr(OUTCOME, seen.outcome)
        trial.set_user_attr(DETAIL, seen.detail)
        if seen.constraints is not None:
            trial.set_user_attr(CONSTRAINTS, seen.constraints)
        if seen.values is not None and not any(math.isnan(v) for v in seen.values):
            self.study.tell(trial, seen.values)
        else:
            self.study.tell(trial, state=_state("PRUNED" if seen.outcome in (PRUNED, INFERRED) else "FAIL"))
        if not again:
            self.seen[point] = seen
            self._progress(point, seen)

    # ---- outcomes --------------------------------------------------------------------------------

    def _outcome(self, point: Point, job) -> Seen:
        """What the launched job measured, or the record it was skipped for."""
        run_dir = Path(job.hydra_cfg.hydra.runtime.output_dir)
        try:
            result = Result.load(run_dir / "result.json")
        except (OSError, ValueError) as exc:
            return Seen(FAILED, detail=f"no result.json in {run_dir}: {exc}")
        if result.status == "FINISHED":
            tags = {f"kvpipe.{k}": v for k, v in result.tags.items()}
            return self._seen_from(MEASURED, result.metrics, result.params, tags, f"job {run_dir.name}")
        if result.status == "SKIPPED" and result.measurement_key and "already FINISHED" in (result.reason or ""):
            run = self._finished_run(result.measurement_key)
            if run is not None:
                data = run.data
                return self._seen_from(REUSED, data.metrics, data.params, data.tags, f"run {run.info.run_id[:8]}")
        return Seen(FAILED, detail=f"{result.status}: {result.reason or ''}".strip())

    def _seen_from(self, outcome: str, metrics, params, tags, where: str) -> Seen:
        run = objectives.row(metrics, params, tags)
        values = objectives.values(run, self.device)
        if any(math.isnan(v) for v in values):
            missing = [n for n, v in zip(objectives.axis_names(self.device, self.passkey), values) if math.isnan(v)]
            return Seen(FAILED, detail=f"{where} has no {', '.join(missing)} (run it with quality=on)")
        return Seen(outcome, values, objectives.constraints(run, self.limits), where, run["label"])

    def _finished_run(self, key: str):
        from kvpipe.record import tracking

        return tracking.finished_run_with_key(self.spec.tracking, self.launch_dir, key)

    def _pruned(self, point: Point) -> Seen | None:
        """Pruned where the plan's exact prediction of weights plus KV cache exceeds the budget."""
        if self.limits.memory_bytes is None:
            return None
        predicted = self.predicted_bytes(point)
        if predicted <= self.limits.memory_bytes:
            return None
        detail = f"predicted {human_bytes(predicted)} (weights + KV cache) > {human_bytes(self.limits.memory_bytes)}"
        self._record_pruned(point, detail)
        return Seen(PRUNED, detail=detail)

    def predicted_memory(self, point: Point) -> float:
        """The memory objective before the job runs: the plan's KV cache bytes on CPU, and on CUDA
        weights plus KV cache (the measured peak adds the activations)."""
        total = self.predicted_bytes(point)
        return total if self.device == "cuda" else total - self._bytes[0]

    def predicted_bytes(self, point: Point) -> int:
        """Weights plus the KV cache that `kvpipe plan` predicts for this point and the workload."""
        from kvpipe import model
        from kvpipe.cache.accounting import kv_shape
        from kvpipe.model.weights import weights
        from kvpipe.spec import compose, make_spec

        if self._bytes is None:
            dtype = model.dtype_name(self.spec.model.dtype, self.device)
            tokenizer = model.load_tokenizer(self.spec.model)
            batches = self.spec.workload_kind.batches(tokenizer, "cpu")
            new = self.spec.workload.max_new_tokens
            longest = longest_prompt_of(batches, new)
            shape = model.describe(self.spec.model)
            self._bytes = (weights(self.spec.model, dtype).bytes, kv_shape(shape, self.spec.workload.batch_size, dtype),
                           longest)  # fmt: skip
        weight_bytes, kv, longest = self._bytes
        overrides = [*self.fixed, *point.overrides()]
        strategy = make_spec(compose(overrides), overrides).strategy
        on_device = strategy.device_kv_shape(kv, self.device)
        return weight_bytes + strategy.predict_kv_bytes(on_device, longest, self.spec.workload.max_new_tokens)

    def _record_pruned(self, point: Point, detail: str) -> None:
        overrides = [*self.fixed, *point.overrides()]
        folder = self.sweep_dir / "pruned" / hashlib.sha256(point.label().encode()).hexdigest()[:12]
        Result.unfinished({"overrides": overrides}, "SKIPPED", f"pruned: {detail}", overrides=overrides).save(folder)

    def _next_job_index(self) -> int:
        numbers = [int(p.name) for p in self.sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()]
        return max(numbers, default=-1) + 1

    # ---- what the user sees ----------------------------------------------------------------------

    def _progress(self, point: Point, seen: Seen) -> None:
        # an exhaustive pass counts every point it has covered; a budgeted one, the jobs it measured
        done = len(self.seen) if self.exhaustive else self.measured()
        total = len(self.space.points) if self.exhaustive else self.settings.trials
        counted = self.exhaustive or seen.outcome == MEASURED
        figures = ""
        if seen.values:
            memory, tpot, quality = seen.values
            figures = f" · {human_bytes(memory)}, TPOT {tpot:.1f} ms, {'1-acc' if self.passkey else 'KL'} {quality:.3g}"
        best = self._best()
        line = (
            (f"trial {done}/{total} {seen.outcome}" if counted else f"not counted, {seen.outcome}")
            + f": {point.label()}{figures}"
            + (f" ({seen.detail})" if seen.outcome in (PRUNED, INFERRED, FAILED) else "")
            + (f" · best so far: {best}" if best else "")
            + (
                f" · ETA {_eta(time.monotonic() - self.started, self.measured(), self.measured() + total - done)}"
                if seen.outcome == MEASURED
                else ""
            )
        )
        print(line, file=sys.stderr, flush=True)

    def _best(self) -> str:
        """The fastest point that meets every limit, so far."""
        ok = [
            (s.values[1], p, s) for p, s in self.seen.items() if s.values and all(c <= 0 for c in s.constraints or [])
        ]
        if not ok:
            return ""
        tpot, point, seen = min(ok, key=lambda item: item[0])
        return f"{seen.label or point.label()} TPOT {tpot:.1f} ms"

    def front(self) -> list[tuple[Point, Seen]]:
        """The feasible points no other feasible point beats on every objective."""
        from kvpipe.decide.runs import non_dominated

        ok = [(p, s) for p, s in self.seen.items() if s.values and all(c <= 0 for c in s.constraints or [])]
        return [item for item, kept in zip(ok, non_dominated([s.values for _, s in ok])) if kept]

    def _print_front(self) -> None:
        counts = {o: sum(s.outcome == o for s in self.seen.values()) for o in (MEASURED, REUSED, PRUNED, FAILED)}
        inferred = {} if self.exhaustive else self._inferred()
        counts[INFERRED] = len([p for p in inferred if p not in self.seen or self.seen[p].outcome == INFERRED])
        print(
            f"search: {len(self.seen)} of {len(self.space.points)} configurations seen ("
            + ", ".join(f"{n} {o}" for o, n in counts.items())
            + f"); Pareto front of those within the limits: {len(self.front())}",
            file=sys.stderr,
            flush=True,
        )


def _scored_alike(fixed: list[str], spec, space: Space) -> list[str]:
    """The fixed overrides, with quality.scored_tokens set (unless the user set it) to the most any
    configuration of the space scores by default: the default follows each one's residual, and KL over
    different tokens would not compare across the front."""
    from kvpipe.config import QualityConfig

    if not spec.quality.enabled or spec.quality.scored_tokens is not None:
        return fixed
    residuals = [int(p.get("backend.residual_length")) for p in space.points if p.get("backend.residual_length")]
    tokens = QualityConfig.default_scored_tokens(max([spec.backend.residual_length, *residuals]))
    log.info(
        "quality: every trial scores %d tokens (quality.scored_tokens), the most any of the space scores by default",
        tokens,
    )
    return [*fixed, f"quality.scored_tokens={tokens}"]


def _inferred_miss(missed: tuple[Point, float], limit: float, passkey: bool) -> Seen:
    point, loss = missed
    what = "1 - retrieval accuracy" if passkey else "KL"
    detail = f"inferred: no better than {point.label()} ({what} {loss:.3g} > {limit:g}), which keeps more exact"
    return Seen(INFERRED, detail=detail)


def _constraints(trial) -> list[float]:
    return trial.user_attrs.get(CONSTRAINTS, [0.0])


def _state(name: str):
    from optuna.trial import TrialState

    return getattr(TrialState, name)


def _extremes(points: list[Point]) -> list[Point]:
    """A first generation that spans the space: every dense point, and each backend's fewest and most
    bits at its first layout, group size and residual length."""
    dense = [p for p in points if p.get("backend") is None]
    quantized: dict[str, list[Point]] = {}
    for point in points:
        if point.get("backend") is not None:
            quantized.setdefault(point.get("backend"), []).append(point)
    ends = []
    for group in quantized.values():
        bits = sorted({int(p.get("backend.nbits")) for p in group})
        for nbits in dict.fromkeys((bits[0], bits[-1])):
            ends.append(next(p for p in group if int(p.get("backend.nbits")) == nbits))
    return dense + ends


def _eta(elapsed_s: float, done: int, total: int) -> str:
    from kvpipe.orchestrate.sweep import duration_text

    return duration_text(math.ceil(elapsed_s / done * (total - done))) if 0 < done < total else "0s"
