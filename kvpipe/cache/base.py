"""What a cache strategy is: one class that knows everything kvpipe asks about it.

A strategy owns its settings (the `cache.*` fields it reads), its checks (against the config alone
and against the model's shape), how it builds the transformers cache and the `generate` arguments,
its KV-byte prediction for `kvpipe plan`, the parameters that define what it measures, and what
`recommend` should think of it (family, lossless). Subclassing registers it under `name`; every
other module asks the registry (`kvpipe.cache.get`, `kvpipe.cache.registered`) and never spells a
strategy's name. A strategy is bound to a `CacheChoice`, what it reads of a job (kvpipe.jobspec's
`Spec.cache_choice` makes one), never to the whole job. Pure Python at import: torch and
transformers load inside `build`.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping

from kvpipe.cache import accounting, presses
from kvpipe.config import option_schema, retyped
from kvpipe.errors import ConfigError
from kvpipe.registry import Registered, Registry
from kvpipe.units import param_text

if TYPE_CHECKING:
    from kvpipe.cache.accounting import KvShape
    from kvpipe.model.loading import LoadedModel
    from kvpipe.model.shape import ModelShape


# What recommend weighs a strategy as (the KV-cache guide's rules are written for the first four):
# grows as needed, preallocated, offloaded to the host, or quantized; and paged, a pool of fixed-size
# pages that many requests share under continuous batching.
class Family(enum.StrEnum):
    """A strategy's family; equal to its name as text (`Family.DYNAMIC == "dynamic"`), as runs record it."""

    DYNAMIC = "dynamic"
    STATIC = "static"
    OFFLOADED = "offloaded"
    QUANTIZED = "quantized"
    PAGED = "paged"


FAMILIES = tuple(Family)
DEFAULT_BASELINE = Family.DYNAMIC  # the default cache: what a sweep and compare weigh the others against


def table_label(requested: str, effective: str) -> str:
    """A run's cache as tables and compare's --baseline name it: what ran, and what was asked where it
    ran as another (`offloaded (as dynamic)`: offloading off a GPU), so the row is mistaken for neither."""
    return effective if effective.startswith(requested) else f"{requested} (as {effective})"


@dataclass
class CacheSetup:
    """What generate() gets: a fresh cache per call, plus generation kwargs."""

    requested: str
    effective: str
    make_cache: Callable[..., Any]  # (capacity=0) -> a fresh Cache holding at least `capacity` tokens
    generate_kwargs: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    params: dict[str, str] = field(default_factory=dict)  # what the build resolved, logged with the run
    # The caches it makes are the quality reference's own (a plain DynamicCache in the model dtype):
    # scoring them would repeat the reference's computation, operation for operation.
    is_reference: bool = False


@dataclass
class NoSettings:
    """A strategy that reads no `cache.*` field beyond `cache.strategy`."""


@dataclass(frozen=True)
class CacheChoice:
    """What a strategy reads of a job: the cache group (the chosen strategy's own settings, its
    `strategy` naming it), the backend and axis groups (cache=quantized's), the tokens each call
    generates (what a static cache is sized for beyond the prompt), and the press that evicts from
    its layers (None: press=none). Its strategy is built once, on first use."""

    cache: Any
    backend: Any
    axis: Any
    max_new_tokens: int
    press: Any = None

    GROUPS: ClassVar[tuple[str, ...]] = ("cache", "backend", "axis", "press")  # config groups: what a strategy may read

    @cached_property
    def strategy(self) -> CacheStrategy:
        """The strategy `cache.strategy` names, bound to this choice: one object, so what it keeps
        between calls stays (`replace` makes a new choice, with a strategy of its own)."""
        return get(self.cache.strategy)(self)

    def __getstate__(self) -> dict:
        # the fields only: a process it is shipped to builds its own strategy
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def with_strategy(self, name: str, **groups) -> CacheChoice:
        """This choice with another strategy (the settings both strategies declare kept) and
        optionally other groups replaced, e.g. backend=..."""
        return replace(self, cache=retyped(self.cache, option_schema(get(name))), **groups)

    def read_fields(self) -> tuple[str, ...]:
        """The cache, backend and axis fields its strategy reads, and its press's (none for press=none)."""
        return (*get(self.cache.strategy).read_fields(self.backend.name), *self.press_class.read_fields(self.press))

    @property
    def press_class(self) -> type[presses.Press]:
        return presses.get("none" if self.press is None else self.press.name)

    def params(self) -> dict[str, str]:
        """The fields its strategy reads, as plain-text params (a late setting left unset: what it
        means), in group order; never one with no value."""
        read, late = self.read_fields(), get(self.cache.strategy).late_defaults
        params = {}
        for group in self.GROUPS:
            if getattr(self, group) is None:
                continue
            for key, value in dataclasses.asdict(getattr(self, group)).items():
                name = f"{group}.{key}"
                if name not in read and f"{group}.*" not in read:
                    continue
                if group == "cache" and value is None:
                    value = late.get(key)
                text = param_text(value)
                if text is not None:
                    params[name] = text
        return params


class CacheStrategy(Registered):
    """Base class: subclass it, set `name`, `family` and `Settings`, and override `build`."""

    registry: ClassVar[Registry[CacheStrategy]] = Registry("cache.strategy")
    family: ClassVar[Family]  # what recommend weighs it as (a Family, or its name)
    lossless: ClassVar[bool] = True  # keeps keys and values exactly: no quality pass needed to trust it
    order: ClassVar[int] = 100  # row order in `kvpipe plan`
    Settings: ClassVar[type] = NoSettings  # dataclass of the cache.* fields it reads, with defaults
    in_label: ClassVar[tuple[str, ...]] = ()  # params its effective label spells out (compare hides them)
    supports_sliding_window: ClassVar[bool] = True
    offloading: ClassVar[bool] = False  # keeps layers in host RAM, only the one in use on the GPU
    runs_as_without_cuda: ClassVar[str | None] = None  # offloading strategies: what runs off CUDA
    continuous: ClassVar[bool] = False  # serves requests by continuous batching: runs only under a load (load=...)
    # Settings added after runs were recorded, with what they mean left unset (null): at that value
    # they stay out of the measurement key, so resume=true still finds the older runs.
    late_defaults: ClassVar[dict[str, Any]] = {}
    # What `kvpipe advise` searches of it: one point per entry, each the overrides beside cache=NAME
    search_variants: ClassVar[tuple[dict[str, str], ...]] = ({},)
    # The layers a press (kvpipe.cache.presses) may evict from: "dense", "quantized", or None where
    # evicting would free nothing (a preallocated, offloaded or paged cache)
    press_layers: ClassVar[str | None] = None
    # generate() can continue from a cache it returned, given the whole sequence (its cached tokens a
    # prefix): what workload.keep_session_cache needs to keep a conversation's cache between its turns
    continues_cache: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs) -> None:
        if "name" in cls.__dict__:
            if cls.family not in FAMILIES:
                raise TypeError(f"{cls.__name__}.family={cls.family!r}; expected one of {[str(f) for f in Family]}")
            cls.family = Family(cls.family)
        super().__init_subclass__(**kwargs)  # registers it

    def __init__(self, choice: CacheChoice):
        self.choice = choice
        self.settings = self.Settings(
            **{f.name: getattr(choice.cache, f.name) for f in dataclasses.fields(self.Settings)}
        )
        self.press = choice.press_class(choice.press)  # press=none (None) reads no setting
        if self.press.evicts:
            self.lossless = False  # what it dropped is gone: its quality is measured, never assumed

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
            if value is not None and value not in (param_text(setting.default), cls.default_text(setting.name)):
                words.append(f"cache.{setting.name}={value}")
        return words

    @classmethod
    def default_text(cls, setting: str) -> str | None:
        """What a late setting left unset means for this strategy, as a param reads."""
        return param_text(cls.late_defaults[setting]) if setting in cls.late_defaults else None

    def setting(self, name: str):
        """A setting's value, null resolved to what it means for this strategy."""
        value = getattr(self.settings, name)
        return self.late_defaults.get(name) if value is None else value

    def describe(self) -> str:
        """Every setting this strategy reads, as overrides: the one-line name of a combination."""
        params = self.choice.params()
        words = [*self.command_overrides(params), *type(self.press).command_overrides(params)]
        said = {word.split("=")[0] for word in words}
        for name in self.choice.read_fields():
            group, _, key = name.partition(".")
            named_by_option = key in ("strategy", "name", "layout") and group in said
            if name not in said and not named_by_option and params.get(name, "None") != "None":
                words.append(f"{name}={params[name]}")
        return " ".join(words)

    # ---- checks -------------------------------------------------------------------------------

    def check(self, overridden: frozenset[str] = frozenset()) -> list[str]:
        """Checks against the config alone; raises ConfigError, returns warnings for ignored settings
        (another strategy's settings are kvpipe.jobspec's to warn about: this one's config has none)."""
        warnings = []
        read = set(self.read_fields(self.choice.backend.name))
        uses_backend = "backend.name" in read
        if not uses_backend and overridden & {"backend", "axis"}:
            users = ", ".join(f"cache={s.name}" for s in registered() if "backend.name" in s.read_fields("quanto"))
            warnings.append(f"backend/axis settings apply to {users} only; cache={self.name} ignores them")
        warnings += self.press.check(overridden)
        self.press.check_compose(self.name, self.press_layers)
        return warnings

    @classmethod
    def attention_refusal(cls, attn_implementation: str) -> str | None:
        """Why this strategy cannot run with this model.attn_implementation (None: it can)."""
        return None

    def check_for_model(self, shape: ModelShape, prompt_tokens: int) -> None:
        """Checks that need the model's shape; run before the weights load."""
        if self.offloading and self.offloads_only_non_sliding() and shape.layers and shape.full_layers == 0:
            raise ConfigError(
                "cache.offload_only_non_sliding",
                True,
                f"every layer of this model slides, so cache={self.name} would offload nothing (and transformers' "
                "prefetch fails when no layer is offloaded); expected cache.offload_only_non_sliding=false",
            )
        self.press.check_for_model(shape.model_type, shape.full_layers)
        if shape.has_sliding_layers and not self.supports_sliding_window:
            raise ConfigError(
                "cache.strategy",
                self.name,
                f"the model has sliding-window layers, which cache={self.name} does not support; "
                "use " + " or ".join(s.name for s in registered() if s.supports_sliding_window and s.lossless),
            )

    def check_prompts(self, shortest_prompt: int, padded: bool) -> None:
        """Checks against the job's tokenized prompts, before the weights load: a press's window
        must fit the shortest, and it scores each row's own tokens (no padding)."""
        if not self.press.evicts:
            return
        if padded:
            raise ConfigError(
                "press.name", self.press.name,
                "a press keeps each prompt's own tokens, and this workload pads prompts of different lengths into one "
                "batch; expected workload.batch_size=1 (or prompts of one length)",
            )  # fmt: skip
        self.press.check_prompt(shortest_prompt)

    # ---- building -----------------------------------------------------------------------------

    def setup(self, loaded: LoadedModel, longest_prompt: int) -> CacheSetup:
        """The CacheSetup for this model and device (`built`), with its press on every cache it makes."""
        built = self.built(loaded, longest_prompt)
        if not self.press.evicts:
            return built
        make, press = built.make_cache, self.press

        def make_pressed(capacity: int = 0):
            from kvpipe.cache.presses._layers import attach

            return attach(press, make(capacity), loaded.model)

        effective = f"{built.effective}+{press.label()}"
        return replace(built, make_cache=make_pressed, effective=effective, is_reference=False)

    def built(self, loaded: LoadedModel, longest_prompt: int) -> CacheSetup:
        """The CacheSetup for this model and device; an offloading strategy off CUDA runs as its
        `runs_as_without_cuda` strategy and says so."""
        if self.runs_as_without_cuda and loaded.device != "cuda":
            base = self.runs_as_without_cuda
            note = (
                f"cache={self.name} offloads from an accelerator to the host; on {loaded.device} there is "
                f"nothing to offload from, so it runs as cache={base} with offloading off"
            )
            other = self.choice.with_strategy(base).strategy
            built = other.build(loaded, longest_prompt)
            built.requested, built.notes = self.name, [note, *built.notes]
            return built
        return self.build(loaded, longest_prompt)

    def build(self, loaded: LoadedModel, longest_prompt: int) -> CacheSetup:
        raise NotImplementedError

    def label(self) -> str:
        """The effective label: what ran, as tables show it."""
        return self.name

    def quality_batching(self, compiled: bool = False) -> str:
        """How the quality pass may batch its windows with this cache without changing a score:
        "padded" (left-padded, masked: dense layers see only their own row's tokens), "equal_length"
        (only windows of one prefix length, unpadded), or "apart". A compiled decode step keeps its
        one traced signature: no mask. A press keeps each row's own tokens: no padding either."""
        return "equal_length" if compiled or self.press.evicts else "padded"

    # ---- serving: what a `continuous` strategy says (kvpipe.job's continuous server asks it) -------

    def start_manager(self, loaded, max_prompt_tokens: int, max_new_tokens: int, num_requests: int, seed: int = 0,
                      ignore_eos: bool = True, do_sample: bool = False):  # fmt: skip
        """A started server that admits requests as they arrive (transformers' continuous batching manager)."""
        raise NotImplementedError(self._not_serving("start_manager"))

    @staticmethod
    def stop_manager(manager, hard: bool = False) -> None:
        """Stop a started manager (hard: fail the requests in flight instead of finishing them)."""
        raise NotImplementedError("stop_manager: only a continuous strategy starts a manager")

    @classmethod
    def pool_bytes(cls, manager) -> int:
        """Bytes of every tensor the manager's cache holds."""
        raise NotImplementedError(cls._not_serving("pool_bytes"))

    @classmethod
    def held_bytes(cls, manager) -> int:
        """Bytes the requests in flight hold now."""
        raise NotImplementedError(cls._not_serving("held_bytes"))

    @classmethod
    def prefix_matches(cls, manager) -> dict[str, int]:
        """Per request id, the prompt tokens served from shared blocks, filled in as the manager admits them."""
        raise NotImplementedError(cls._not_serving("prefix_matches"))

    @classmethod
    def peak_held(cls, manager) -> tuple[int, int]:
        """The most blocks and bytes the manager's requests held at once since it started."""
        raise NotImplementedError(cls._not_serving("peak_held"))

    @classmethod
    def _not_serving(cls, hook: str) -> str:
        return f"cache={cls.name} does not serve requests by continuous batching (continuous=False): no {hook}"

    # ---- bytes ---------------------------------------------------------------------------------

    def predict_kv_bytes(self, kv: KvShape, prompt_tokens: int, new_tokens: int) -> int:
        """What accounting.kv_cache_bytes reports once new_tokens follow the prompt (all layers)."""
        if not self.press.evicts:
            return accounting.dynamic_bytes(kv, prompt_tokens, new_tokens)
        layers = len(kv.windows)
        full = [self.press.layer_tokens_at(layer, layers, prompt_tokens, new_tokens) for layer in range(layers)]
        return accounting.dynamic_bytes(kv, prompt_tokens, new_tokens, full_layer_tokens=full)

    def full_layer_prompt(self, prompt_tokens: int) -> int:
        """The prompt tokens a full-attention layer keeps after prefill (its press's choice)."""
        return self.press.kept(prompt_tokens) if self.press.evicts else prompt_tokens

    def bytes_per_token(self, kv: KvShape) -> float:
        """What one more cached token costs in the long run: past their windows only the
        full-attention layers grow (by what a press leaves of each prompt token)."""
        return kv.full_layers * kv.token_bytes() * self.press.token_share()

    def window_bytes(self, kv: KvShape) -> int:
        """What the sliding layers hold once past their windows, however long the context: fixed
        (with a press's fixed budget in each full-attention layer)."""
        return accounting.window_bytes(kv) + kv.full_layers * self.press.fixed_tokens() * kv.token_bytes()

    def decode_kv_traffic_bytes(self, kv: KvShape, kv_bytes: int, prompt_tokens: int, new_tokens: int,
                                device: str) -> int | None:  # fmt: skip
        """KV bytes one decode step moves through memory, from the final cache's `kv_bytes` (each
        sliding layer counted at what it keeps) and the job's shape; None where it cannot be counted
        honestly. A dense cache is read once per step (a static one: its whole allocation, masked)."""
        if self.offloading and device == "cuda":
            return None
        return kv_bytes

    def holds_requests(self, kv: KvShape, prompt_tokens: int, new_tokens: int, requests: int) -> bool:
        """Whether a pool of fixed size holds `requests` requests of this shape at once (kv: one
        sequence's); True where the cache grows with its requests and memory alone bounds them."""
        return True

    def dequantized_copy_bytes(self, kv: KvShape, prompt_tokens: int, new_tokens: int) -> int:
        """The largest copy of cached keys and values a decode step makes beside the cache (a
        quantized layer dequantized for attention); 0 where attention reads the cache as it is."""
        return 0

    def traffic_unknown_reason(self, device: str) -> str:
        return (
            f"cache={self.name} moves layers between host and {device} every step; that traffic runs at "
            "the interconnect's speed, not the memory bandwidth the roofline is measured against"
        )

    def offloads_only_non_sliding(self) -> bool:
        """Whether an offloading cache keeps its sliding layers on the device (transformers' option)."""
        return bool(self.offloading and self.setting("offload_only_non_sliding"))

    def offloading_kwargs(self) -> dict:
        """DynamicCache/StaticCache's offloading arguments."""
        if not self.offloading:
            return {"offloading": False}
        return {"offloading": True, "offload_only_non_sliding": self.offloads_only_non_sliding()}

    def device_kv_shape(self, kv: KvShape, device: str) -> KvShape:
        """The part of the cache that lives on the device. Offloading keeps the layer in use and the
        next offloaded one (prefetched) there, and host RAM holds the rest: counted here as the two
        largest offloaded layers. With offload_only_non_sliding the sliding layers stay on the device
        too. Off CUDA nothing is offloaded."""
        if not self.offloading or device != "cuda":
            return kv
        only_full = self.offloads_only_non_sliding()
        resident = kv.sliding_windows if only_full else ()
        offloaded = [w for w in kv.windows if w is None or not only_full]
        largest = sorted(offloaded, key=lambda w: float("inf") if w is None else w, reverse=True)[:2]
        return kv.with_layers([*resident, *largest])

    @classmethod
    def search_points(cls, head_dim: int, group_sizes, residual_lengths) -> list[dict[str, str]]:
        """Every configuration of this strategy that a search may measure, as Hydra overrides
        ({"cache": NAME, ...}); group sizes and residual lengths are for backends that read them."""
        return [{"cache": cls.name, **variant} for variant in cls.search_variants]

    @classmethod
    def plan_variants(cls, choice: CacheChoice, shape: ModelShape) -> list[tuple[str, CacheChoice]]:
        """(label, choice) rows `kvpipe plan` shows for this strategy, from the job's choice."""
        return [(cls.name, choice.with_strategy(cls.name))]

    @classmethod
    def plan_notes(cls, choice: CacheChoice, shape: ModelShape) -> list[str]:
        """What `kvpipe plan` should say about this strategy's rows."""
        return []


REGISTRY = CacheStrategy.registry.classes  # name -> strategy class
registered = CacheStrategy.registry.registered  # every strategy, in table order
names = CacheStrategy.registry.names
get = CacheStrategy.registry.get  # raises a one-line ConfigError naming the registered ones
