"""What the KV cache depends on, read from a model's config alone (no weights)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kvpipe.config import ModelConfig
from kvpipe.model.embedded import embedded_folder


@dataclass(frozen=True)
class ModelShape:
    """What the KV cache depends on, read from the model's config alone."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    max_positions: int
    has_sliding_layers: bool


def text_config(config: dict) -> dict:
    """The decoder's part of a config dict (multimodal configs nest it)."""
    return config.get("text_config", config)


def describe(model_cfg: ModelConfig) -> ModelShape:
    """The model's KV-relevant shape from its config alone, without loading weights."""
    if model_cfg.source == "random":
        return shape_from_config(random_config_dict(model_cfg))
    folder = local_folder(model_cfg)
    if folder is not None:
        return shape_from_config(json.loads((folder / "config.json").read_text()))
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(
        model_cfg.name_or_path, revision=model_cfg.revision, trust_remote_code=model_cfg.trust_remote_code
    )
    return shape_from_config(config.get_text_config(decoder=True).to_dict())


def shape_from_config(config: dict) -> ModelShape:
    config = text_config(config)
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    layer_types = config.get("layer_types") or []
    return ModelShape(
        num_layers=config["num_hidden_layers"],
        num_kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        max_positions=config.get("max_position_embeddings", 0),
        has_sliding_layers=bool(config.get("sliding_window"))
        and config.get("use_sliding_window", True)
        or any("sliding" in str(t) for t in layer_types),
    )


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
    )
    config = {name: getattr(model_cfg, name) for name in fields if getattr(model_cfg, name) is not None}
    config["model_type"] = "mistral" if model_cfg.sliding_window else "llama"
    return config


def local_folder(model_cfg: ModelConfig) -> Path | None:
    if model_cfg.source == "embedded":
        return embedded_folder()
    path = Path(model_cfg.name_or_path or "").expanduser()
    return path if (path / "config.json").is_file() else None
