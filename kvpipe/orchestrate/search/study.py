"""A search's Optuna study: where it is stored and what it is named, its sampler, what it has seen
before (from earlier processes too: a killed search resumes), what the plan predicts of a point before
it runs, and the set-up from the sweeper's settings. Its rounds are rounds.py's."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from kvpipe.decide.limits import Limits, limits_of
from kvpipe.errors import ConfigError, KvpipeError
from kvpipe.orchestrate.search import objectives
from kvpipe.orchestrate.search.space import DIMENSIONS, Point, Space, build
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


class SearchStudy:
    """One search's settings, space, limits and Optuna study, and the outcome of each point it has seen
    (rounds.Search runs its rounds)."""

    def __init__(self, settings, fixed, spec, space, limits, device, study, launch_dir, sweep_dir):
        self.settings, self.fixed, self.spec, self.space = settings, fixed, spec, space
        self.limits, self.device, self.study = limits, device, study
        self.launch_dir, self.sweep_dir = launch_dir, sweep_dir
        # a workload that judges its answers (passkey): its own metric is the quality objective (objectives.values)
        self.quality = spec.bound_workload.quality
        self.seen: dict[Point, Seen] = self._seen_before() if study is not None else {}
        self._bytes = None  # (weights bytes, the model's costs, longest prompt): made on the first prediction
        self.started = time.monotonic()

    @classmethod
    def start(cls, settings, arguments: list[str], launch_dir: Path, sweep_dir: Path):
        """The search the sweeper's settings and the user's overrides ask for, its study created or,
        asked again, loaded with what it has seen."""
        import optuna

        from kvpipe import model
        from kvpipe.jobspec import spec_from
        from kvpipe.record.store import resolve_uri

        fixed, restrict = split_arguments(arguments)
        spec = spec_from(fixed)
        shape = model.read_shape(spec.model)
        device = model.resolve_device(spec.model.device) if spec.model.device == "auto" else spec.model.device
        space = build(shape.head_dim, device, restrict, settings.group_sizes, settings.residual_lengths, shape)
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
            storage, ", ".join(objectives.axis_names(device, search.quality)),
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
        """The limit on the quality objective (KL, or the workload's own: 1 - retrieval accuracy)."""
        if self.quality:
            return None if self.limits.accuracy is None else self.quality.loss(self.limits.accuracy)
        return self.limits.kl

    @property
    def exhaustive(self) -> bool:
        return len(self.space.points) <= self.settings.trials

    # ---- what the study has seen -----------------------------------------------------------------

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

    # ---- what is known of a point before it runs -------------------------------------------------

    def predicted_memory(self, point: Point) -> float:
        """The memory objective before the job runs: the plan's KV cache bytes on CPU, and on CUDA
        weights plus KV cache (the measured peak adds the activations)."""
        total = self.predicted_bytes(point)
        return total if self.device == "cuda" else total - self._bytes[0]

    def predicted_bytes(self, point: Point) -> int:
        """Weights plus the KV cache that `kvpipe plan` predicts for this point and the workload
        (kvpipe.predict.costs, as plan counts them), at the workload's longest prompt."""
        from kvpipe import model
        from kvpipe.jobspec import spec_from
        from kvpipe.predict.costs import costs_for

        if self._bytes is None:
            tokenizer = model.load_tokenizer(self.spec.model)
            batches = self.spec.bound_workload.batches(tokenizer, "cpu")
            longest = longest_prompt_of(batches, self.spec.workload.max_new_tokens)
            costs = costs_for(self.spec, self.device)
            self._bytes = (costs.weights_bytes, costs, longest)
        _, costs, longest = self._bytes
        overrides = [*self.fixed, *point.overrides()]
        cost = costs.at(spec_from(overrides).strategy, longest, self.spec.workload.max_new_tokens)
        return cost.weights_bytes + cost.kv_cache_bytes


def _scored_alike(fixed: list[str], spec, space: Space) -> list[str]:
    """The fixed overrides, with quality.scored_tokens set (unless the user set it) to the most any
    configuration of the space scores by default: the default follows each one's residual, and KL over
    different tokens would not compare across the front."""
    from kvpipe.config import QualityConfig

    if not spec.quality.enabled or spec.quality.scored_tokens is not None:
        return fixed
    residuals = [int(p.get("backend.residual_length")) for p in space.points if p.get("backend.residual_length")]
    tokens = QualityConfig.default_scored_tokens(max([spec.residual_length, *residuals]))
    log.info(
        "quality: every trial scores %d tokens (quality.scored_tokens), the most any of the space scores by default",
        tokens,
    )
    return [*fixed, f"quality.scored_tokens={tokens}"]


def _constraints(trial) -> list[float]:
    return trial.user_attrs.get(CONSTRAINTS, [0.0])
