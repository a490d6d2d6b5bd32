"""What an eviction press is: one class per press, registered by subclassing, as backends are.

A press removes prompt tokens from each full-attention layer's cache once the prompt has been read
(evicting, not storing fewer bits: the other way to shrink a KV cache). It knows its `press.*`
settings, their checks, how it scores prompt tokens (its `score`, on torch tensors, loaded only when
a cache is built) and so the tokens and bytes a layer holds. Prefill attention still reads
every prompt token; the cache keeps the press's choice, then grows as usual (or, for a press that
rolls, `press.rolling`, stays at its budget). Sliding-window layers are left as they are: they already
keep a window. A strategy composes the press with its own layers (`CacheStrategy.press`); nobody
else names a press. Definitions follow NVIDIA's kvpress (`kvpress/presses/*_press.py`) and the
papers it cites; the code is kvpipe's own. Pure Python at import.

A press receives what kvpress's `ScorerPress.score` receives, once per full-attention layer after the
prompt's attention has run (kvpipe.cache.presses._layers): the attention module, the prompt's hidden
states, its keys and values, the attention weights where the attention implementation returns them
(eager does; sdpa and flash return None) and the rotary position embeddings. It returns a score per
token and KV head; the base keeps the `kept` highest, with the first and last tokens it `protected`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar, Mapping, Optional

from kvpipe.errors import ConfigError, require_choice
from kvpipe.registry import Registered, Registry
from kvpipe.units import param_text

# What the press sees when it fires. query_aware: the whole prompt, question included, as one request
# that carries its document and its question is read (every press run before protocols existed).
# query_agnostic: the context alone, the question fed after it (kvpress's leaderboard; a context
# reused for later questions).
QUERY_AWARE, QUERY_AGNOSTIC = "query_aware", "query_agnostic"
PROTOCOLS = (QUERY_AWARE, QUERY_AGNOSTIC)


@dataclass
class Common:
    """The press.* settings every press reads."""

    protocol: str = QUERY_AWARE  # query_aware | query_agnostic: whether the press sees the question
    # whether a press that has a rolling form (streaming) presses the cache again while the question and
    # the answer are fed; null: the protocol's (rolling under query_aware, as every run before this
    # setting; compressed once under query_agnostic, as kvpress's pipeline and leaderboard do)
    rolling: Optional[bool] = None


class Press(Registered):
    """Base class: subclass it with `name` and `Settings`, and override `score` (and `protected`)."""

    registry: ClassVar[Registry[Press]] = Registry("press.name")
    Settings: ClassVar[type]
    evicts: ClassVar[bool] = True  # False only for press=none
    # has a rolling form (press.rolling): keeps evicting while decoding, so the cache never grows past its
    # budget; every such press rolled, under either protocol, before press.rolling existed
    can_roll: ClassVar[bool] = False
    needs_queries: ClassVar[bool] = False  # recomputes the prompt's queries: only from attention kvpipe has read
    # model types whose attention kvpipe has read: q_proj, an optional q_norm, then rotary embeddings on
    # every channel (tests/test_presses.py checks each against transformers' own classes)
    QUERY_MODELS: ClassVar[tuple[str, ...]] = (
        "llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "gemma3_text",
    )  # fmt: skip
    # the Hydra overrides, beyond press=NAME, that make a quick valid job of it on model=tiny_random
    # the cache layers it composes with: "dense" (DynamicCache's) and "quantized" (evict, then quantize)
    composes_with: ClassVar[tuple[str, ...]] = ("dense", "quantized")
    search_ratios: ClassVar[tuple[float, ...]] = (0.25, 0.5, 0.75)  # what `kvpipe advise` walks, safest first
    in_label: ClassVar[tuple[str, ...]] = ("press.name", "press.ratio", "press.protocol")  # params its label spells out

    def __init__(self, press_cfg):
        self.settings = self.Settings(**{f.name: getattr(press_cfg, f.name) for f in dataclasses.fields(self.Settings)})
        self.protocol = getattr(press_cfg, "protocol", None) or QUERY_AWARE  # a run recorded before protocols: aware
        self.rolls = self.rolling_for(self.protocol, getattr(press_cfg, "rolling", None))

    # ---- what it reads ------------------------------------------------------------------------

    @classmethod
    def read_fields(cls, press_cfg=None) -> tuple[str, ...]:
        """The press.* fields its measurement depends on; given its config, press.protocol only off
        query_aware, so that every press run recorded before protocols keeps its key and params."""
        if not cls.evicts:
            return ()  # press=none: every job keyed and logged as before presses existed
        own = ("press.name", *(f"press.{f.name}" for f in dataclasses.fields(cls.Settings)))
        if press_cfg is None:
            return (*own, "press.protocol", "press.rolling")
        protocol = getattr(press_cfg, "protocol", None) or QUERY_AWARE
        rolls = cls.rolling_for(protocol, getattr(press_cfg, "rolling", None))
        # press.rolling only where it does otherwise than every run recorded before it (a rolling press rolled)
        return (
            *own,
            *(("press.protocol",) if protocol != QUERY_AWARE else ()),
            *(("press.rolling",) if rolls != cls.can_roll else ()),
        )

    @classmethod
    def rolling_for(cls, protocol: str, rolling: Optional[bool]) -> bool:
        """Whether the press rolls under `protocol` with press.rolling set to `rolling` (None: unset)."""
        if not cls.can_roll:
            return False
        return protocol == QUERY_AWARE if rolling is None else bool(rolling)

    @classmethod
    def resolved_rolling(cls, protocol: str, rolling: Optional[bool]) -> Optional[bool]:
        """press.rolling as a spec holds it: what it means under `protocol` (None for press=none);
        true refused in one line for a press with no rolling form."""
        if not cls.evicts:
            return rolling
        if rolling and not cls.can_roll:
            rollers = " or ".join(f"press={c.name}" for c in cls.registry.registered() if c.can_roll)
            raise ConfigError(
                "press.rolling", rolling,
                f"press={cls.name} scores the prompt once and has no rolling form; expected press.rolling=false "
                f"(or null), or {rollers}",
            )  # fmt: skip
        return cls.rolling_for(protocol, rolling)

    @classmethod
    def command_overrides(cls, params: Mapping[str, str]) -> list[str]:
        """press=NAME and the settings off their YAML defaults; press.rolling=true for a run of a
        rolling press that logged no press.rolling under query_agnostic (it rolled, as every run before
        the setting did, where the protocol's default now compresses once)."""
        if not cls.evicts:
            return []
        words = [f"press={cls.name}"]
        for setting in (*dataclasses.fields(cls.Settings), *dataclasses.fields(Common)):
            value = params.get(f"press.{setting.name}")
            if value is not None and value != param_text(setting.default):
                words.append(f"press.{setting.name}={value}")
        return [*words, "press.rolling=true"] if cls.rolled_unsaid(params) else words

    @classmethod
    def rolled_unsaid(cls, params: Mapping[str, str]) -> bool:
        """Whether a run with these params rolled where the protocol's default now does not, without
        logging press.rolling (a rolling press's run under query_agnostic made before the setting, or
        with press.rolling=true, which is keyed as those were): its command must say press.rolling=true."""
        protocol = params.get("press.protocol") or QUERY_AWARE
        return cls.can_roll and "press.rolling" not in params and not cls.rolling_for(protocol, None)

    @classmethod
    def search_points(cls) -> list[dict[str, str]]:
        """Every configuration of this press a search may measure, safest (least evicted) first."""
        return [{"press": cls.name, "press.ratio": str(ratio)} for ratio in cls.search_ratios] if cls.evicts else []

    def label(self) -> str:
        """'snapkv0.5' ('snapkv0.5-query_agnostic', 'streaming0.5-query_agnostic-rolling'): how tables
        name it beside the cache; press.rolling only where it is not the protocol's."""
        label = self.name_with_settings() + ("" if self.protocol == QUERY_AWARE else f"-{self.protocol}")
        if self.rolls != self.rolling_for(self.protocol, None):
            label += "-rolling" if self.rolls else "-once"
        return label

    def name_with_settings(self) -> str:
        """'snapkv0.5': the press and what it keeps."""
        return f"{self.name}{self.settings.ratio:g}"

    @property
    def question_after_context(self) -> bool:
        """Whether the job compresses the context alone and feeds the question after it."""
        return self.evicts and self.protocol == QUERY_AGNOSTIC

    # ---- checks -------------------------------------------------------------------------------

    def check(self, given: frozenset[str] = frozenset()) -> list[str]:
        """Checks against the config alone; returns warnings. `given`: the keys (`press.ratio`) and
        groups the user's overrides set, so that a warning names only a setting the user gave."""
        ratio = self.settings.ratio
        if not 0 <= ratio < 1:
            raise ConfigError(
                "press.ratio", ratio, "expected the fraction of the prompt's KV removed, from 0 up to (not including) 1"
            )
        return []

    def check_compose(self, strategy: str, layers: str | None) -> None:
        """Refuse a cache whose layers (a strategy's `press_layers`) this press cannot evict from."""
        if layers in self.composes_with:
            return
        why = (
            f"cache={strategy} preallocates or moves its layers, so evicting would free nothing"
            if layers is None
            else f"press={self.name} evicts at every decoding step, which a {layers} layer would redo in full each time"
            if self.rolls
            else f"kvpipe keeps press={self.name} on {' or '.join(self.composes_with)} layers only, not {layers} ones"
        )
        raise ConfigError("press.name", self.name, f"{why}; expected {self.compatible_caches()}")

    def compatible_caches(self) -> str:
        return " or ".join({"dense": "cache=dynamic", "quantized": "cache=quantized"}[k] for k in self.composes_with)

    @classmethod
    def check_protocol(cls, protocol: str, workload, naming_kinds: tuple[str, ...]) -> list[str]:
        """press.protocol against the press and the workload (a bound one: its name, settings and
        whether it names its question or asks after the context); `naming_kinds`: the workloads that
        name their prompts' question. Returns warnings."""
        require_choice("press.protocol", protocol, PROTOCOLS)
        if not cls.evicts:
            if protocol == QUERY_AWARE:
                return []
            return [f"press.protocol={protocol} is ignored: press={cls.name} compresses nothing, so the prompt is read whole"]  # fmt: skip
        if workload.questions_after_context and protocol != QUERY_AGNOSTIC:
            raise ConfigError(
                "press.protocol", protocol,
                f"workload={workload.name} reads each context once and asks its questions after it, so the press never "
                f"sees a question; expected press.protocol={QUERY_AGNOSTIC}",
            )  # fmt: skip
        if protocol == QUERY_AWARE or workload.questions_after_context:
            return []
        if not workload.names_question:
            raise ConfigError(
                "press.protocol", protocol,
                f"workload={workload.name} does not say which of its prompts' tokens are the question; expected "
                f"press.protocol={QUERY_AWARE}, or {' or '.join(f'workload={k}' for k in naming_kinds)}",
            )  # fmt: skip
        if workload.common.do_sample:
            raise ConfigError(
                "press.protocol", protocol,
                f"the question after a compressed context is decoded greedily (as kvpress's pipeline); expected "
                f"workload.do_sample=false, or press.protocol={QUERY_AWARE}",
            )  # fmt: skip
        return []

    @classmethod
    def check_for_model(cls, model_type: str, full_layers: int) -> None:
        """Checks that need the model's config, before the weights load."""
        if full_layers == 0:
            raise ConfigError(
                "press.name", cls.name,
                "every layer of this model slides, and a press evicts from full-attention layers only; expected press=none",
            )  # fmt: skip
        if cls.needs_queries and model_type not in cls.QUERY_MODELS:
            others = sorted(c.name for c in cls.registry.registered() if c.evicts and not c.needs_queries)
            raise ConfigError(
                "press.name", cls.name,
                f"press={cls.name} recomputes the prompt's queries, and kvpipe reads them only from the attention of "
                f"{', '.join(cls.QUERY_MODELS)}, not {model_type or 'this model'}'s; "
                f"expected {' or '.join(f'press={name}' for name in others)}",
            )  # fmt: skip

    def attention_refusal(self, attn_implementation: str) -> str | None:
        """Why this press cannot score under this model.attn_implementation (None: it can)."""
        return None

    def check_prompt(self, prompt_tokens: int) -> None:
        """Checks against the shortest prompt, before the weights load."""

    # ---- tokens -------------------------------------------------------------------------------

    def kept(self, prompt_tokens: int) -> int:
        """Prompt tokens a full-attention layer keeps after prefill: the ratio's share removed, rounded
        down; under query_agnostic, kvpress's count, int(n x (1 - ratio)), one fewer where n x ratio is
        not whole (query_aware keeps the count every run before the protocols was made with)."""
        if self.protocol == QUERY_AGNOSTIC:
            return int(prompt_tokens * (1 - self.settings.ratio))
        return prompt_tokens - math.floor(prompt_tokens * self.settings.ratio)

    def kept_in(self, module, prompt_tokens: int) -> int:
        """What the layer of attention `module` keeps of the prompt: `kept`, for a press whose budget
        is the same in every layer."""
        return self.kept(prompt_tokens)

    def layer_tokens_at(self, layer: int, layers: int, prompt_tokens: int, new_tokens: int) -> int:
        """`layer_tokens` in layer `layer` of `layers`: the same in every layer, for most presses."""
        return self.layer_tokens(prompt_tokens, new_tokens)

    def layer_tokens(self, prompt_tokens: int, new_tokens: int) -> int:
        """Tokens a dense full-attention layer holds once new_tokens follow the prompt (the last generated
        token is never fed back)."""
        return self.kept(prompt_tokens) + new_tokens - 1

    def token_share(self) -> float:
        """What a full-attention layer keeps of each prompt token, in the long run."""
        return 1 - self.settings.ratio

    def fixed_tokens(self) -> int:
        """Tokens a full-attention layer holds however long the context (a bounded budget); 0: none."""
        return 0

    def protected(self, prompt_tokens: int) -> tuple[int, int]:
        """(first, last): how many of the prompt's first and last tokens are kept whatever their scores."""
        return 0, 0

    def score(self, module, hidden_states, keys, values, attentions, position_embeddings):
        """How much each prompt token matters to each KV head, [batch, kv_heads, tokens]: the highest are
        kept (torch). `hidden_states` [batch, tokens, hidden] is what the attention `module` read,
        `keys` and `values` [batch, kv_heads, tokens, head_dim] what it would store, `attentions`
        [batch, heads, tokens, tokens] its weights or None, `position_embeddings` its (cos, sin)."""
        raise NotImplementedError

    def keep(self, module, hidden_states, keys, values, attentions, position_embeddings):
        """The indices [batch, kv_heads, kept] of the prompt tokens each head keeps, in order (torch): the
        protected ones, then the highest scored."""
        import torch

        tokens = keys.shape[-2]
        scores = self.score(module, hidden_states, keys, values, attentions, position_embeddings)
        first, last = self.protected(tokens)
        if first or last:
            position = torch.arange(tokens, device=scores.device)
            scores = scores.masked_fill((position < first) | (position >= tokens - last), float("inf"))
        return scores.topk(self.kept_in(module, tokens), dim=-1).indices.sort(dim=-1).values

    def trim(self, layer, prompt_tokens: int) -> None:
        """After a decoding step: what a rolling press evicts from the layer (dense layers only)."""


REGISTRY = Press.registry.classes  # name -> press class
registered = Press.registry.registered
names = Press.registry.names
get = Press.registry.get  # raises a one-line ConfigError naming the registered ones
