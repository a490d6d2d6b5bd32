"""Composed config -> validated, typed Spec: what one job will do. Pure Python: no torch,
transformers or mlflow.

Every mistake a user can make in a config surfaces here as a one-line ConfigError, in well under a
second, before any heavy import. Checks that need the model's shape (head_dim, sliding-window
layers) are the strategy's `check_for_model`, run before the weights load.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Sequence

from omegaconf import DictConfig, OmegaConf

from kvpipe import cache as cache_strategies
from kvpipe import config
from kvpipe import engine as engines
from kvpipe import load as loads
from kvpipe import workload as workloads
from kvpipe.cache import presses
from kvpipe.errors import ConfigError, KvpipeError, choices, require_choice
from kvpipe.jobspec import options, schema
from kvpipe.jobspec.key import measurement_key
from kvpipe.jobspec.names import hf_model_name, looks_local
from kvpipe.units import param_text


@dataclass(frozen=True)
class Spec:
    """What one job will do: the typed config, validated, plus notes for the user. Each plugged
    group holds its chosen option's own config (kvpipe.config.option_schema: its fields only). Its
    strategy, bound workload and bound load are built once, on first use; `replace` makes a new
    Spec, which builds its own."""

    model: config.ModelConfig
    cache: Any  # the chosen strategy's config (schema.option_schema)
    backend: Any  # the chosen backend's, likewise
    axis: config.AxisConfig
    workload: Any  # the chosen workload kind's, with the settings every kind reads
    quality: config.QualityConfig
    tracking: config.TrackingConfig
    fallback: tuple[str, ...] = ()
    load: Any = None  # the chosen load's (how requests arrive), or None: the workload's batches one after another
    press: Any = None  # the chosen press's (eviction from the cache's layers), or None: press=none
    engine: Any = None  # the chosen engine's (a server of its own), or None: engine=transformers, in this process
    warnings: tuple[str, ...] = field(default=())
    overrides: tuple[str, ...] = field(default=())  # the user's Hydra overrides that made this job

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("warnings"), data.pop("overrides")
        if self.load is None:
            data.pop("load")  # result.json as it was before loads: a job without one has no load key
        if self.press is None:
            data.pop("press")  # likewise before presses
        if self.engine is None:
            data.pop("engine")  # and before engines
        return data

    def __getstate__(self) -> dict:
        # the fields only: a process it is shipped to (a launcher's worker) builds its own strategy
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @cached_property
    def cache_choice(self) -> cache_strategies.CacheChoice:
        """What its cache strategy reads of it: the cache, backend and axis groups and the new tokens."""
        return cache_strategies.CacheChoice(
            self.cache, self.backend, self.axis, self.workload.max_new_tokens, self.press
        )

    @property
    def strategy(self) -> cache_strategies.CacheStrategy:
        """The cache strategy this spec names, bound to its choice (the same object on every access)."""
        return self.cache_choice.strategy

    @cached_property
    def bound_workload(self) -> workloads.Workload:
        """The workload this spec names, bound to its settings."""
        return workloads.get(self.workload.kind)(self.workload)

    @cached_property
    def bound_engine(self) -> engines.Engine | None:
        """The engine this spec names, bound to its settings; None for transformers in this process."""
        return None if self.engine is None else engines.get(self.engine.name)(self.engine)

    @cached_property
    def bound_load(self) -> loads.Load | None:
        """The load this spec names, bound to its settings; None without one."""
        return None if self.load is None else loads.get(self.load.kind)(self.load)

    def with_strategy(self, name: str, defaults: bool = False, **groups) -> "Spec":
        """This spec with another cache strategy (the settings both declare kept, or every one at
        its default with defaults=True) and optionally other groups replaced, e.g. backend=..."""
        option = schema.option_schema(cache_strategies.get(name))
        cache = option() if defaults else config.retyped(self.cache, option)
        return replace(self, cache=cache, **groups)

    @property
    def residual_length(self) -> int:
        """The full-precision tokens the backend keeps, which quality's scored tokens outlast
        (config.QualityConfig.default_scored_tokens); a backend with none counts as the flat
        schema's default did (quanto's), so such jobs score as many tokens as they always have."""
        residual = cache_strategies.backends.get(self.backend.name)(self.backend, self.axis).residual_length()
        return UNRESIDUAL_LENGTH if residual is None else residual

    def with_choice(self, choice: cache_strategies.CacheChoice) -> "Spec":
        """This spec with a choice's cache, backend, axis and press groups (`kvpipe plan`'s rows)."""
        return replace(self, cache=choice.cache, backend=choice.backend, axis=choice.axis, press=choice.press)

    def read_fields(self) -> tuple[str, ...]:
        """The cache, backend and axis fields this job's strategy reads (from the registry); with
        every other group except tracking and the fallback chain, they define what it measures."""
        return self.cache_choice.read_fields()

    def measurement_key(self) -> str:
        """Hash of what is measured: equal for configs that measure the same thing (kvpipe.jobspec.key).
        Used to skip duplicates and to resume."""
        return measurement_key(self)

    def params(self) -> dict[str, str]:
        """The settings this job reads, as plain-text MLflow params: the cache, backend and axis
        fields its strategy reads (its CacheChoice's params), the workload fields its kind reads,
        the model fields its source reads, quality's when on; never tracking, never a setting with
        no value. The runner adds what it resolved (dtype, device, the model's architecture)."""
        data = self.as_dict()
        owned = {"model": (config.SOURCE_FIELDS, self.model.source)}
        params = {}
        for group in ("model", "workload", "quality", "load", "engine"):
            if group == "workload":  # after the model's: the cache, backend and axis fields its strategy reads
                params.update(self.cache_choice.params())
            if group in ("load", "engine") and getattr(self, group) is None:
                continue
            for key, value in data[group].items():
                name = f"{group}.{key}"
                if group in owned and not config.reads(*owned[group], key):
                    continue
                if group == "workload" and not workloads.reads(self.workload.kind, key):
                    continue
                if group == "workload" and key in workloads.AUTO_REPEATS and self.workload.repeats != "auto":
                    continue
                if group == "workload" and key == "decide_within" and value == workloads.Common.decide_within:
                    continue  # added later: at its default, params stay as runs made before it had them
                if group == "quality" and key != "enabled" and not self.quality.enabled:
                    continue
                if group == "load" and f"load.{key}" not in self.bound_load.read_fields():
                    continue
                if group == "engine" and f"engine.{key}" not in self.bound_engine.read_fields():
                    continue
                if isinstance(value, dict):  # model.architecture: the runner logs the real config's
                    continue
                text = param_text(value)
                if text is not None:
                    params[name] = text
        return params


# The groups whose fields a strategy reads; the measurement key keeps only those it reads.
STRATEGY_GROUPS = cache_strategies.CacheChoice.GROUPS
# What a backend without a residual counts as, for quality's scored tokens (Spec.residual_length).
UNRESIDUAL_LENGTH = 128


def make_spec(cfg: DictConfig | schema.KvpipeConfig, overrides: list[str] = ()) -> Spec:
    """Validate a composed config; raise ConfigError naming the first bad field.

    `overrides` are the user's command-line overrides, used only to warn about settings
    that the chosen strategy ignores."""
    if isinstance(cfg, DictConfig):
        reject_unknown_keys(cfg)
    typed = OmegaConf.to_object(cfg) if isinstance(cfg, DictConfig) else cfg
    chosen = {
        group: options.typed(group, getattr(typed, group))
        for group in schema.PLUGGED
        if getattr(typed, group) is not None
    }
    for group, option in chosen.items():
        setattr(typed, group, option.option)
    _check_model(typed.model)
    if typed.model.source == "hf" and typed.model.name == "hf":  # conf/model/hf.yaml: named after what it loads
        typed.model = replace(typed.model, name=hf_model_name(typed.model.name_or_path))
    typed.workload = _check_workload(typed.workload)
    _check_quality(typed.quality)
    _check_load(typed.load, typed.workload)
    batch_caches = [s.name for s in cache_strategies.registered() if not s.continuous]
    for index, strategy in enumerate(typed.fallback):
        require_choice(f"fallback[{index}]", strategy, cache_strategies.names())
        require_choice(f"fallback[{index}]", strategy, batch_caches)  # it retries one batch: no continuous one
    mapping = _engine_cache(typed, overrides)  # kvpipe's cache choice as the engine's own settings, where one is
    # press.rolling as the protocol means it, so that the spec, its key and its params say what runs
    press_class = presses.get(typed.press.name)
    typed.press = replace(typed.press, rolling=press_class.resolved_rolling(typed.press.protocol, typed.press.rolling))
    spec = Spec(
        model=typed.model,
        cache=typed.cache,
        backend=typed.backend,
        axis=typed.axis,
        workload=typed.workload,
        quality=typed.quality,
        tracking=typed.tracking,
        fallback=tuple(typed.fallback),
        load=typed.load,
        press=None if typed.press.name == "none" else typed.press,
        engine=None
        if engines.get(typed.engine.name).in_process
        else engines.get(typed.engine.name).resolved(typed.engine),
    )
    _check_engine(spec)
    _check_serving(spec)
    _check_stop_when_missed(spec)
    # the groups and the settings the user named: a warning about a setting only where it was given
    # (a cache choice that runs as an engine's own settings says so in its note, not as ignored settings)
    said = [o for o in overrides if not (mapping and override_group(o) in ("cache", "backend", "axis"))]
    overridden = frozenset(override_group(o) for o in said) | frozenset(override_key(o) for o in said)
    warnings = options.ignored_warnings("cache", chosen["cache"]) + spec.strategy.check(overridden)
    for group in [g for g in chosen if g != "cache"]:
        warnings += options.ignored_warnings(group, chosen[group])
    naming = tuple(kind.name for kind in workloads.registered() if kind.names_question)
    warnings += press_class.check_protocol(typed.press.protocol, spec.bound_workload, naming)
    warnings += spec.bound_workload.notes() + mapping
    _check_questions_after_context(spec)
    _check_sessions(spec)
    return replace(spec, warnings=tuple(warnings), overrides=tuple(overrides))


def spec_from(overrides: Sequence[str]) -> Spec:
    """The validated spec of these overrides, composed as `kvpipe OVERRIDES` composes them; a
    composition error is one line, as every user mistake is."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    words = list(overrides)
    try:
        return make_spec(schema.compose(words), words)
    except (HydraException, OmegaConfBaseException) as exc:
        raise KvpipeError(config.from_hydra(exc) or str(exc)) from exc


def override_group(override: str) -> str:
    """The config group an override sets: `cache` for `cache.compile=true` or `+cache=static`."""
    return override_key(override).split(".")[0]


def override_key(override: str) -> str:
    """The key an override sets: `press.ratio` for `press.ratio=0.5`, `cache` for `+cache=static`."""
    return override.lstrip("+~").split("=")[0]


def _type_name(annotation: str) -> str:
    """`Optional[LoadConfig]` -> `LoadConfig`: the schema class a field's annotation names."""
    return annotation.removeprefix("Optional[").removesuffix("]")


def reject_unknown_keys(cfg: DictConfig) -> None:
    """`+group.key=...` adds keys past the schema; OmegaConf would drop them silently. A misspelt
    `+group=option` (`+experimnt=needle`) adds a top-level key, which would run a default job."""
    top_level = {f.name for f in fields(schema.KvpipeConfig)}
    for key in cfg.keys():
        if key not in top_level and key != "hydra":
            groups = sorted(set(top_level) | {"experiment"})
            raise ConfigError(str(key), cfg.get(key), "not a known config group or key; " + choices(groups, given=key))
    for group in fields(schema.KvpipeConfig):
        node = cfg.get(group.name)
        if not isinstance(node, DictConfig):
            continue
        named = group.type if isinstance(group.type, type) else getattr(schema, _type_name(group.type))
        known = {f.name for f in fields(named)}
        for key in node.keys():
            if key not in known:
                raise ConfigError(
                    f"{group.name}.{key}",
                    node.get(key),
                    "not a known key; " + choices(sorted(known), given=key),
                )


def _check_model(model: config.ModelConfig) -> None:
    require_choice("model.source", model.source, config.MODEL_SOURCES)
    require_choice("model.dtype", model.dtype, config.DTYPES)
    require_choice("model.device", model.device, config.DEVICES)
    require_choice("model.attn_implementation", model.attn_implementation, config.ATTN_IMPLEMENTATIONS)
    if model.threads is not None and model.threads <= 0:
        raise ConfigError("model.threads", model.threads, "expected a positive number of torch threads, or null")
    if model.source == "hf":
        _check_model_location(model.name_or_path)
    if model.device_map is not None:
        require_choice("model.device_map", model.device_map, config.DEVICE_MAPS)
        if model.source != "hf":
            raise ConfigError("model.device_map", model.device_map, "only for model=hf (a model too big for one GPU)")
    if model.source == "random":
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads"):
            if getattr(model, name) <= 0:
                raise ConfigError(f"model.{name}", getattr(model, name), "expected a positive integer")
        _check_layer_types(model)
        if model.num_attention_heads % model.num_key_value_heads:
            raise ConfigError(
                "model.num_key_value_heads",
                model.num_key_value_heads,
                f"expected a divisor of model.num_attention_heads={model.num_attention_heads}",
            )


RANDOM_LAYER_TYPES = ("full_attention", "sliding_attention")  # what a random Gemma 3 text model builds


def _check_layer_types(model: config.ModelConfig) -> None:
    """A random model's layer_types: one per layer, each a type Gemma 3 builds, a window for sliding ones."""
    if model.layer_types is None:
        return
    if len(model.layer_types) != model.num_hidden_layers:
        raise ConfigError(
            "model.layer_types",
            list(model.layer_types),
            f"expected one type per layer: {model.num_hidden_layers} (model.num_hidden_layers)",
        )
    for index, kind in enumerate(model.layer_types):
        require_choice(f"model.layer_types[{index}]", kind, RANDOM_LAYER_TYPES)
    if "sliding_attention" in model.layer_types and not model.sliding_window:
        raise ConfigError(
            "model.sliding_window", model.sliding_window, "expected a window in tokens for the sliding_attention layers"
        )


def _check_model_location(name_or_path: str | None) -> None:
    if not name_or_path:
        raise ConfigError("model.name_or_path", name_or_path, "expected a local model folder or a hub id like org/name")
    if looks_local(name_or_path):
        folder = Path(name_or_path).expanduser()
        if not folder.is_dir():
            raise ConfigError(
                "model.name_or_path", name_or_path, "no such folder; expected a local model folder holding config.json"
            )
        if not (folder / "config.json").is_file():
            raise ConfigError(
                "model.name_or_path",
                name_or_path,
                "the folder has no config.json; expected a transformers model folder",
            )


def _check_workload(workload):
    """The workload's own checks (kvpipe.workload); the config with what they normalised."""
    normalised = workloads.get(workload.kind)(workload).check()
    return replace(workload, **normalised)


def _check_quality(quality: config.QualityConfig) -> None:
    if quality.windows < 1:
        raise ConfigError("quality.windows", quality.windows, "expected a positive integer (3 or more for a spread)")
    if quality.scored_tokens is not None and quality.scored_tokens < 2:
        raise ConfigError("quality.scored_tokens", quality.scored_tokens, "expected 2 or more, or null for the default")


def _check_load(load, workload) -> None:
    """The load's own checks (kvpipe.load), and one setting said once: under a load, the load decides
    how many requests are served together, so workload.batch_size stays at 1."""
    if load is None:
        return
    loads.get(load.kind)(load).check()
    if workload.batch_size != 1:
        raise ConfigError(
            "workload.batch_size",
            workload.batch_size,
            f"under load={load.kind} the load decides how many requests are served together "
            "(load.concurrency); expected workload.batch_size=1",
        )


def _check_questions_after_context(spec: Spec) -> None:
    """A workload that answers many questions from forks of one context's cache needs layers that grow
    by replacing their tensors (those a press composes with), batch by batch."""
    workload, strategy = spec.bound_workload, spec.strategy
    if not workload.questions_after_context:
        return
    if spec.load is not None:
        raise ConfigError(
            "load.kind", spec.load.kind,
            f"workload={workload.name} reads each context once and answers its questions one after another; "
            "expected load=null",
        )  # fmt: skip
    if strategy.press_layers is None:
        growing = [s.name for s in cache_strategies.registered() if s.press_layers is not None]
        raise ConfigError(
            "cache.strategy", strategy.name,
            f"workload={workload.name} answers each question from a fork of the context's cache, whose layers "
            f"cache={strategy.name} preallocates or moves; expected {' or '.join(f'cache={n}' for n in growing)}",
        )  # fmt: skip


def _check_sessions(spec: Spec) -> None:
    """A workload of sessions is served under a load that starts them (one that replays the workload's
    own arrival times has none to read); a kept session cache needs a strategy that can continue one."""
    workload, strategy = spec.bound_workload, spec.strategy
    if not workload.in_sessions:
        return
    starting = ", ".join(f"load={load.name}" for load in loads.registered() if load.any_workload)
    if spec.load is None or not loads.get(spec.load.kind).any_workload:
        raise ConfigError(
            "load.kind", None if spec.load is None else spec.load.kind,
            f"workload={workload.name} serves sessions turn by turn; choose how sessions start: {starting}",
        )  # fmt: skip
    if workload.keeps_session_cache and not strategy.continues_cache:
        able = " or ".join(f"cache={s.name}" for s in cache_strategies.registered() if s.continues_cache)
        raise ConfigError(
            "workload.keep_session_cache", True,
            f"cache={strategy.name} cannot continue from a cache it returned; expected {able}, or "
            "workload.keep_session_cache=false (cache=paged shares prefixes through cache.allow_block_sharing)",
        )  # fmt: skip


def _engine_cache(typed, overrides: Sequence[str]) -> list[str]:
    """Through an engine's server, a kvpipe cache choice that means one of the engine's own settings
    (Engine.mapped_cache) runs as that setting, on the engine's one cache (`typed` changed in place):
    the spec, its key and its params say what runs, and its note says what it was given as. A setting
    given both ways, differently, is refused in one line."""
    engine = engines.get(typed.engine.name)
    if engine.in_process or typed.cache.strategy == cache_strategies.DEFAULT_BASELINE:
        return []
    mapped = engine.mapped_cache(typed.cache, typed.backend)
    if not mapped:
        return []  # refused by _check_engine, naming what maps
    given = {override_key(o) for o in overrides}
    for name, value in mapped.items():
        if f"engine.{name}" in given and getattr(typed.engine, name) != value:
            raise ConfigError(
                f"engine.{name}", getattr(typed.engine, name),
                f"cache={typed.cache.strategy} means engine.{name}={param_text(value)} on engine={engine.name}: give one of them",
            )  # fmt: skip
    chosen = " ".join(w for w in overrides if override_group(w) in ("cache", "backend"))
    typed.engine = replace(typed.engine, **mapped)
    typed.cache = schema.option_schema(cache_strategies.get(cache_strategies.DEFAULT_BASELINE))()
    settings = " ".join(f"engine.{name}={param_text(value)}" for name, value in mapped.items())
    return [f"{chosen} runs as {engine.name}'s own {settings}"]


def _check_engine(spec: Spec) -> None:
    """An engine with a server of its own keeps its own KV cache: kvpipe's caches and presses are
    refused, and what the engine itself cannot do, before anything starts."""
    engine = spec.bound_engine
    if engine is None:
        return
    if spec.cache.strategy != cache_strategies.DEFAULT_BASELINE:
        raise ConfigError(
            "cache", spec.cache.strategy,
            f"engine={engine.name} keeps its own KV cache: leave cache={cache_strategies.DEFAULT_BASELINE} and "
            f"choose it with {engine.kv_settings}" + (f"; {engine.maps} map to them" if engine.maps else ""),
        )  # fmt: skip
    if spec.press is not None:
        raise ConfigError("press", spec.press.name, f"engine={engine.name} evicts nothing: expected press=none")
    engine.check(spec)


def _check_stop_when_missed(spec: Spec) -> None:
    """load.stop_when_missed_at ends one pass of requests served by kvpipe's own servers early."""
    stop_at = None if spec.load is None else getattr(spec.load, "stop_when_missed_at", None)
    if stop_at is None:
        return
    why = None
    if spec.workload.repeats != 1:
        why = f"it ends one pass early; expected workload.repeats=1 (got {spec.workload.repeats})"
    why = why or cannot_stop_early(spec)
    if why:
        raise ConfigError("load.stop_when_missed_at", stop_at, why)


def cannot_stop_early(spec: Spec) -> str | None:
    """Why the spec's requests are not served by a server of kvpipe's that can stop letting them in
    (load.stop_when_missed_at), or None where they are."""
    if spec.bound_workload.in_sessions:
        return f"workload={spec.workload.kind}'s turns arrive after their answers; expected null"
    return None


def _check_serving(spec: Spec) -> None:
    """A strategy that serves requests by continuous batching runs only under a load, and only with
    an attention implementation it can page."""
    strategy = type(spec.strategy)
    if strategy.continuous and spec.load is None:
        raise ConfigError(
            "cache.strategy",
            strategy.name,
            f"cache={strategy.name} serves many requests at once by continuous batching; choose how they arrive: "
            + ", ".join(f"load={load.name}" for load in loads.registered() if load.any_workload),
        )
    if spec.press is not None and spec.load is not None:
        # under a load a pressed cache serves one request per call (kvpipe.job.servers): each prompt
        # is pressed whole and alone, so the question cannot come after the compressed context, and a
        # session's kept cache would be pressed again at every turn
        if spec.strategy.press.question_after_context:
            raise ConfigError("press.protocol", spec.press.protocol, f"under load={spec.load.kind} each "
                              "request's prompt is pressed whole; expected press.protocol=query_aware, or load=null")  # fmt: skip
        if spec.bound_workload.in_sessions:
            raise ConfigError("press.name", spec.press.name, f"workload={spec.workload.kind}'s turns resume the "
                              "cache their last turn left, which a press would compress again; expected press=none")  # fmt: skip
    attention = spec.model.attn_implementation
    reason = strategy.attention_refusal(attention) or spec.strategy.press.attention_refusal(attention)
    if reason:
        raise ConfigError("model.attn_implementation", spec.model.attn_implementation, reason)
