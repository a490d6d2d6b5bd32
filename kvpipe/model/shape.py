"""What the KV cache depends on, read from a model's config alone (no weights)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kvpipe.config import ModelConfig
from kvpipe.errors import KvpipeError
from kvpipe.model.embedded import embedded_folder


class ModelFolderError(KvpipeError):
    """A model folder that exists but cannot be read as a model."""


@dataclass(frozen=True)
class ModelShape:
    """What the KV cache depends on, read from the model's config alone."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_positions: int
    has_sliding_layers: bool


def text_config(config: dict) -> dict:
    """The decoder's part of a config dict (multimodal configs nest it)."""
    return config.get("text_config", config)


def describe(model_cfg: ModelConfig) -> ModelShape:
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
    config = text_config(config)
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    layer_types = config.get("layer_types") or []
    return ModelShape(
        num_layers=config["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        max_positions=config.get("max_position_embeddings", 0),
        has_sliding_layers=bool(config.get("sliding_window"))
        and config.get("use_sliding_window", True)
        or any("sliding" in str(t) for t in layer_types),
    )


ARCHITECTURE_FIELDS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                       "max_position_embeddings", "vocab_size")  # fmt: skip


def architecture_params(config: dict) -> dict[str, str]:
    """The model's architecture as MLflow params (model.<config.json name>), from the config the
    weights were loaded with: head_dim and KV heads as the model computes them when not spelt out."""
    shape = shape_from_config(config)
    config = text_config(config)
    values = {**{name: config.get(name) for name in ARCHITECTURE_FIELDS},
              "num_key_value_heads": shape.num_kv_heads, "head_dim": shape.head_dim}  # fmt: skip
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
    )
    config = {name: getattr(model_cfg, name) for name in fields if getattr(model_cfg, name) is not None}
    config["model_type"] = "mistral" if model_cfg.sliding_window else "llama"
    return config


def local_folder(model_cfg: ModelConfig) -> Path | None:
    if model_cfg.source == "embedded":
        return embedded_folder()
    path = Path(model_cfg.name_or_path or "").expanduser()
    return path if (path / "config.json").is_file() else None
