"""What the KV cache depends on, read from a model's config alone (no weights)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from kvpipe.config import ModelConfig
from kvpipe.errors import KvpipeError
from kvpipe.model.embedded import embedded_folder


class ModelFolderError(KvpipeError):
    """A model folder that exists but cannot be read as a model."""


@dataclass(frozen=True)
class Layer:
    """One decoder layer as transformers' cache builds it: its layer type and, for a windowed type,
    the tokens it attends to (`sliding_window`, or `attention_chunk_size` for chunked attention)."""

    attention: str = "full_attention"
    window: Optional[int] = None

    @property
    def slides(self) -> bool:
        return self.window is not None


@dataclass(frozen=True)
class ModelShape:
    """What the KV cache depends on, read from the model's config alone: the KV heads and head size
    every layer shares, and each layer's type and window, as transformers' caches build them."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_positions: int
    layers: tuple[Layer, ...] = ()  # one per decoder layer; empty: every layer full attention
    model_type: str = ""  # transformers' model_type of the decoder ("llama", "gemma3_text"); "": unknown

    def __post_init__(self) -> None:
        if not self.layers:
            object.__setattr__(self, "layers", (Layer(),) * self.num_layers)

    @property
    def context_cap(self) -> int:
        """The longest context worth asking about: the model's positions, or 2**24 where it names none."""
        return self.max_positions or 2**24

    @property
    def has_sliding_layers(self) -> bool:
        return any(layer.slides for layer in self.layers)

    @property
    def full_layers(self) -> int:
        return sum(layer.attention == "full_attention" for layer in self.layers)

    def layer_summary(self) -> str:
        """'15 sliding_attention (window 512) + 3 full_attention', in the order layers first appear."""
        counts = Counter(self.layers)
        return " + ".join(
            f"{count} {layer.attention}" + (f" (window {layer.window:,})" if layer.slides else "")
            for layer, count in counts.items()
        )


def text_config(config: dict) -> dict:
    """The decoder's part of a config dict (multimodal configs nest it)."""
    return config.get("text_config", config)


def read_shape(model_cfg: ModelConfig) -> ModelShape:
    """The model's KV-relevant shape from its config alone, without loading weights."""
    return shape_from_config(config_dict(model_cfg)[0])


def config_dict(model_cfg: ModelConfig) -> tuple[dict, str]:
    """The model's config as a dict, and where it came from. Without the network where possible:
    a random model's own fields, a local folder's config.json, a preset's `architecture`; the hub
    only for a hub id with none of these."""
    if model_cfg.source == "random":
        return random_config_dict(model_cfg), "the config (source=random builds exactly it)"
    folder = local_folder(model_cfg)
    if folder is not None:
        return read_config_json(folder), str(folder / "config.json")
    if model_cfg.architecture:
        return dict(model_cfg.architecture), f"model.architecture of the {model_cfg.name} preset"
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(
        model_cfg.name_or_path, revision=model_cfg.revision, trust_remote_code=model_cfg.trust_remote_code
    )
    return config.get_text_config(decoder=True).to_dict(), f"{model_cfg.name_or_path}'s config on the hub"


def read_config_json(folder: Path) -> dict:
    """A folder's config.json; a file that is not a JSON object is one line naming it."""
    path = folder / "config.json"
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelFolderError(f"model.name_or_path={folder}: {path.name} is not valid JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise ModelFolderError(f"model.name_or_path={folder}: {path.name} is not a JSON object")
    return config


def shape_from_config(config: dict) -> ModelShape:
    """The shape of a config dict (a config.json, a preset's architecture, a loaded config's to_dict())."""
    return _shape(text_config(config), layers_from_dict(config))


def shape_from_model_config(config) -> ModelShape:
    """The shape of a loaded model's PretrainedConfig: its layers exactly as its caches will build them."""
    text = config.get_text_config(decoder=True)
    return _shape(text.to_dict(), _layers_of(text))


def _shape(config: dict, layers: tuple[Layer, ...]) -> ModelShape:
    heads = config["num_attention_heads"]
    return ModelShape(
        num_layers=config["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or config["hidden_size"] // heads,
        max_positions=config.get("max_position_embeddings", 0),
        layers=layers,
        model_type=config.get("model_type") or "",
    )


def layers_from_dict(config: dict) -> tuple[Layer, ...]:
    """Each layer's type and window. transformers' config class fills in what a config.json leaves
    out (Gemma 2's alternation, Qwen 2's max_window_layers, Mistral's sliding_window on every
    layer), so the config is built with it where its model_type is known; without one, the fields
    are read as transformers' cache reads them."""
    if not _may_have_windows(text_config(config)):  # a plain full-attention config: no transformers import
        return _layers_read_from(text_config(config))
    from transformers import AutoConfig

    model_type = config.get("model_type")
    try:
        built = AutoConfig.for_model(model_type, **{k: v for k, v in config.items() if k != "model_type"})
    except (ValueError, KeyError, TypeError):  # no or an unknown model_type, or fields it rejects
        return _layers_read_from(text_config(config))
    return _layers_of(built.get_text_config(decoder=True))


# Fields from which a config class may build windowed or KV-less layers; without any of them set,
# every layer is full attention and importing transformers (seconds) to say so can be skipped.
WINDOW_FIELDS = ("layer_types", "sliding_window", "attention_chunk_size", "sliding_window_pattern",
                 "use_sliding_window", "kv_sharing_modes", "per_layer_config")  # fmt: skip


def _may_have_windows(config: dict) -> bool:
    return any(config.get(name) not in (None, False) for name in WINDOW_FIELDS)


def _layers_of(text_config_object) -> tuple[Layer, ...]:
    """What transformers' DynamicCache and StaticCache build for this config, layer by layer."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    types, kwargs = get_layer_types_and_kwargs(text_config_object)
    return tuple(Layer(kind, options.get("sliding_window")) for kind, options in zip(types, kwargs))


def _layers_read_from(config: dict) -> tuple[Layer, ...]:
    """get_layer_types_and_kwargs' reading of a plain dict, for configs transformers cannot build."""
    count = config["num_hidden_layers"]
    types = config.get("layer_types")
    if not types:
        kind = (
            "sliding_attention" if config.get("sliding_window") is not None
            else "chunked_attention" if config.get("attention_chunk_size") is not None else "full_attention"
        )  # fmt: skip
        types = [kind] * count
    types = ["dummy" if kind in ("moe", "mlp") else kind for kind in types]
    window = {
        "sliding_attention": config.get("sliding_window"),
        "chunked_attention": config.get("attention_chunk_size"),
    }
    return tuple(Layer(kind, window.get(kind)) for kind in types)


ARCHITECTURE_FIELDS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                       "max_position_embeddings", "vocab_size")  # fmt: skip


def architecture_params(config: dict, shape: ModelShape) -> dict[str, str]:
    """The model's architecture as MLflow params (model.<config.json name>), from the config the
    weights were loaded with and its shape (LoadedModel.shape): head_dim and KV heads as the model
    computes them when not spelt out, and each layer's cache."""
    config = text_config(config)
    values = {**{name: config.get(name) for name in ARCHITECTURE_FIELDS},
              "num_key_value_heads": shape.num_kv_heads, "head_dim": shape.head_dim}  # fmt: skip
    if any(layer.attention != "full_attention" for layer in shape.layers):
        values["cache_layers"] = shape.layer_summary()  # what each layer's cache keeps
    return {f"model.{name}": str(value) for name, value in values.items() if value is not None}


def random_config_dict(model_cfg: ModelConfig) -> dict:
    fields = (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
        "sliding_window",
        "layer_types",
    )
    config = {name: getattr(model_cfg, name) for name in fields if getattr(model_cfg, name) is not None}
    if "layer_types" in config:
        config["layer_types"] = list(config["layer_types"])
    config["model_type"] = random_model_type(model_cfg)
    return config


def random_model_type(model_cfg: ModelConfig) -> str:
    """A Gemma 3 text model where layer types are given (sliding and full layers mixed), a Mistral
    where only a sliding window is (every layer slides), a Llama otherwise."""
    if model_cfg.layer_types:
        return "gemma3_text"
    return "mistral" if model_cfg.sliding_window else "llama"


def local_folder(model_cfg: ModelConfig) -> Path | None:
    if model_cfg.source == "embedded":
        return embedded_folder()
    path = Path(model_cfg.name_or_path or "").expanduser()
    return path if (path / "config.json").is_file() else None
