"""What a cache strategy is: one class that knows everything kvpipe asks about it.

A strategy owns its settings (the `cache.*` fields it reads), its checks (against the config alone
and against the model's shape), how it builds the transformers cache and the `generate` arguments,
its KV-byte prediction for `kvpipe plan`, the parameters that define what it measures, and what
`recommend` should think of it (family, lossless). Subclassing registers it under `name`; every
other module asks the registry (`kvpipe.cache.get`, `kvpipe.cache.registered`) and never spells a
strategy's name. Pure Python at import: torch and transformers load inside `build`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping

from kvpipe.cache.accounting import dense_bytes
from kvpipe.errors import ConfigError, require_choice
from kvpipe.units import param_text

if TYPE_CHECKING:
    from kvpipe.cache.accounting import KvShape
    from kvpipe.model.loading import LoadedModel
    from kvpipe.model.shape import ModelShape
    from kvpipe.spec import Spec

REGISTRY: dict[str, type[CacheStrategy]] = {}
# What recommend weighs a strategy as (the KV-cache guide's rules are written for these four):
# grows as needed, preallocated, offloaded to the host, or quantized.
FAMILIES = ("dynamic", "static", "offloaded", "quantized")


@dataclass
class CacheSetup:
    """What generate() gets: a fresh cache per call, plus generation kwargs."""

    requested: str
    effective: str
    make_cache: Callable[..., Any]  # (capacity=0) -> a fresh Cache holding at least `capacity` tokens
    generate_kwargs: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass
class NoSettings:
    """A strategy that reads no `cache.*` field beyond `cache.strategy`."""


class CacheStrategy:
    """Base class: subclass it, set `name`, `family` and `Settings`, and override `build`."""

    name: ClassVar[str]
    family: ClassVar[str]  # what recommend weighs it as: dynamic, static, offloaded or quantized
    lossless: ClassVar[bool] = True  # keeps keys and values exactly: no quality pass needed to trust it
    order: ClassVar[int] = 100  # row order in `kvpipe plan`
    Settings: ClassVar[type] = NoSettings  # dataclass of the cache.* fields it reads, with defaults
    in_label: ClassVar[tuple[str, ...]] = ()  # params its effective label spells out (compare hides them)
    supports_sliding_window: ClassVar[bool] = True
    offloading: ClassVar[bool] = False  # keeps layers in host RAM, only the one in use on the GPU
    runs_as_without_cuda: ClassVar[str | None] = None  # offloading strategies: what runs off CUDA

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            if cls.family not in FAMILIES:
                raise TypeError(f"{cls.__name__}.family={cls.family!r}; expected one of {FAMILIES}")
            REGISTRY[cls.name] = cls

    def __init__(self, spec: Spec):
        self.spec = spec
        self.settings = self.Settings(
            **{f.name: getattr(spec.cache, f.name) for f in dataclasses.fields(self.Settings)}
        )

    # ---- what it reads ------------------------------------------------------------------------

    @classmethod
    def read_fields(cls, backend_name: str | None = None) -> tuple[str, ...]:
        """Dotted config fields this strategy's measurement depends on (the measurement key, the
        parameters compare shows). `backend_name` matters only to strategies that use a backend."""
        return ("cache.strategy", *(f"cache.{f.name}" for f in dataclasses.fields(cls.Settings)))

    @classmethod
    def command_overrides(cls, params: Mapping[str, str]) -> list[str]:
        """Overrides that measure this strategy again, from a run's logged params: settings left at
        their defaults are not repeated."""
        words = [f"cache={cls.name}"]
        for setting in dataclasses.fields(cls.Settings):
            value = params.get(f"cache.{setting.name}")
            if value in ("True", "False"):  # runs logged before params became plain text
                value = value.lower()
            if value is not None and value != param_text(setting.default):
                words.append(f"cache.{setting.name}={value}")
        return words

    def describe(self) -> str:
        """Every setting this strategy reads, as overrides: the one-line name of a combination."""
        params = self.spec.params()
        words = self.command_overrides(params)
        said = {word.split("=")[0] for word in words}
        for name in self.read_fields(self.spec.backend.name):
            group, _, key = name.partition(".")
            named_by_option = key in ("strategy", "name", "layout") and group in said
            if name not in said and not named_by_option and params.get(name, "None") != "None":
                words.append(f"{name}={params[name]}")
        return " ".join(words)

    # ---- checks -------------------------------------------------------------------------------

    def check(self, overridden: frozenset[str] = frozenset()) -> list[str]:
        """Checks against the config alone; raises ConfigError, returns warnings for ignored settings."""
        warnings = []
        read = set(self.read_fields(self.spec.backend.name))
        for name, (default, owner) in _settings_fields().items():
            dotted, value = f"cache.{name}", getattr(self.spec.cache, name)
            if dotted in read or value == default:
                continue
            refusal = owner.refusal(name)
            if refusal:
                raise ConfigError(dotted, value, refusal)
            warnings.append(f"{dotted} is ignored by cache={self.name}")
        uses_backend = "backend.name" in read
        if not uses_backend and overridden & {"backend", "axis"}:
            users = ", ".join(f"cache={s.name}" for s in registered() if "backend.name" in s.read_fields("quanto"))
            warnings.append(f"backend/axis settings apply to {users} only; cache={self.name} ignores them")
        return warnings

    @classmethod
    def refusal(cls, setting: str) -> str | None:
        """Why another strategy may not set this strategy's `setting` away from its default (None: it
        is merely ignored there, with a warning)."""
        return None

    def check_for_model(self, shape: ModelShape, prompt_tokens: int) -> None:
        """Checks that need the model's shape; run before the weights load."""
        if shape.has_sliding_layers and not self.supports_sliding_window:
            raise ConfigError(
                "cache.strategy",
                self.name,
                f"the model has sliding-window layers, which cache={self.name} does not support; "
                "use " + " or ".join(s.name for s in registered() if s.supports_sliding_window and s.lossless),
            )

    # ---- building -----------------------------------------------------------------------------

    def setup(self, loaded: LoadedModel, longest_prompt: int) -> CacheSetup:
        """The CacheSetup for this model and device; an offloading strategy off CUDA runs as its
        `runs_as_without_cuda` strategy and says so."""
        if self.runs_as_without_cuda and loaded.device != "cuda":
            base = self.runs_as_without_cuda
            note = (
                f"cache={self.name} offloads from an accelerator to the host; on {loaded.device} there is "
                f"nothing to offload from, so it runs as cache={base} with offloading off"
            )
            other = self.spec.with_strategy(base).strategy
            built = other.build(loaded, longest_prompt)
            built.requested, built.notes = self.name, [note, *built.notes]
            return built
        return self.build(loaded, longest_prompt)

    def build(self, loaded: LoadedModel, longest_prompt: int) -> CacheSetup:
        raise NotImplementedError

    def label(self) -> str:
        """The effective label: what ran, as tables show it."""
        return self.name

    # ---- bytes ---------------------------------------------------------------------------------

    def predict_kv_bytes(self, kv: KvShape, prompt_tokens: int, new_tokens: int) -> int:
        """What accounting.kv_cache_bytes reports once new_tokens follow the prompt (all layers)."""
        return dense_bytes(kv, prompt_tokens + new_tokens - 1)  # the last token is never fed back

    def bytes_per_token(self, kv: KvShape) -> float:
        """What one more cached token costs in the long run."""
        return dense_bytes(kv, 1)

    def decode_kv_traffic_bytes(self, kv_bytes: int, dense_kv_bytes: int, device: str) -> int | None:
        """KV bytes one decode step moves through memory, from the final cache's `kv_bytes` and what
        the same tokens hold dense in the model dtype; None where it cannot be counted honestly.
        A dense cache is read once per step (a static one: its whole allocation, masked)."""
        if self.offloading and device == "cuda":
            return None
        return kv_bytes

    def traffic_unknown_reason(self, device: str) -> str:
        return (
            f"cache={self.name} moves layers between host and {device} every step; that traffic runs at "
            "the interconnect's speed, not the memory bandwidth the roofline is measured against"
        )

    def device_kv_shape(self, kv: KvShape, device: str) -> KvShape:
        """The part of the cache that lives on the device: offloading keeps the layer in use and the
        next (prefetched) there, host RAM holds every layer; off CUDA nothing is offloaded."""
        if not self.offloading or device != "cuda":
            return kv
        return dataclasses.replace(kv, layers=min(2, kv.layers))

    @classmethod
    def plan_variants(cls, spec: Spec, head_dim: int) -> list[tuple[str, Spec]]:
        """(label, spec) rows `kvpipe plan` shows for this strategy."""
        return [(cls.name, spec.with_strategy(cls.name))]

    @classmethod
    def plan_notes(cls, spec: Spec, shape: ModelShape) -> list[str]:
        """What `kvpipe plan` should say about this strategy's rows."""
        return []


def registered() -> list[type[CacheStrategy]]:
    """Every registered strategy, in table order."""
    return sorted(REGISTRY.values(), key=lambda s: (s.order, s.name))


def names() -> tuple[str, ...]:
    return tuple(s.name for s in registered())


def get(name: str) -> type[CacheStrategy]:
    require_choice("cache.strategy", name, names())
    return REGISTRY[name]


def _settings_fields() -> dict[str, tuple[Any, type[CacheStrategy]]]:
    """Every strategy's settings: name -> (default, owning strategy). The first owner wins."""
    found: dict[str, tuple[Any, type[CacheStrategy]]] = {}
    for strategy in registered():
        for setting in dataclasses.fields(strategy.Settings):
            found.setdefault(setting.name, (setting.default, strategy))
    return found
