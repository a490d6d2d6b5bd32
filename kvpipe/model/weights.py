"""Weight bytes without loading: exact from safetensors headers, else estimated from the config."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from kvpipe.model.shape import ModelFolderError, config_dict, local_folder, random_config_dict, text_config
from kvpipe.units import DTYPE_BYTES

# safetensors dtypes; from_pretrained(dtype=...) casts the floating ones and keeps the rest as stored
SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
                     "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}  # fmt: skip
CAST_ON_LOAD = ("F64", "F32", "BF16", "F16")


@dataclass(frozen=True)
class Weights:
    bytes: int
    exact: bool
    source: str  # where the figure comes from, for the person reading it


def weights(model_cfg, dtype: str) -> Weights:
    """Weight bytes in `dtype` without loading: safetensors headers when present, else the config."""
    if model_cfg.source == "random":
        count = llama_parameters(random_config_dict(model_cfg))
        return Weights(count * DTYPE_BYTES[dtype], True, "counted from the config (source=random builds exactly it)")
    folder = local_folder(model_cfg)
    files = safetensors_files(folder) if folder else []
    if files:
        return Weights(
            safetensors_bytes(files, DTYPE_BYTES[dtype]),
            True,
            f"exact: summed from the safetensors headers in {folder}",
        )
    config, origin = config_dict(model_cfg)
    return Weights(
        llama_parameters(config) * DTYPE_BYTES[dtype],
        False,
        f"ESTIMATED as a Llama-style decoder from {origin} (no *.safetensors in {folder or model_cfg.name_or_path})",
    )


def safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():  # a sharded checkpoint: the index names its shards
        return sorted({folder / name for name in json.loads(index.read_text())["weight_map"].values()})
    return sorted(folder.glob("*.safetensors"))


def safetensors_bytes(files: list[Path], dtype_bytes: int) -> int:
    """Tensor bytes from each file's header (8-byte little-endian length, then JSON), floats cast to dtype_bytes."""
    total = 0
    for path in files:
        header = _header(path)
        for name, info in header.items():
            if name != "__metadata__":
                numel = 1
                for size in info["shape"]:
                    numel *= size
                total += numel * (dtype_bytes if info["dtype"] in CAST_ON_LOAD else SAFETENSORS_BYTES[info["dtype"]])
    return total


def _header(path: Path) -> dict:
    """A safetensors file's JSON header; a truncated or foreign file is one line naming it."""
    try:
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > path.stat().st_size - 8:
                raise ValueError(f"its header claims {length} bytes, more than the file holds")
            header = json.loads(handle.read(length))
        if not isinstance(header, dict):
            raise ValueError("its header is not a JSON object")
        return header
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        raise ModelFolderError(
            f"model.name_or_path={path.parent}: {path.name} is not a readable safetensors file ({exc})"
        ) from None


def llama_parameters(config: dict) -> int:
    """Parameters of a Llama-style decoder: embeddings, q/k/v/o with grouped KV heads, gated MLP,
    two norms per layer, the final norm, and lm_head unless tied (Llama's default: untied)."""
    config = text_config(config)
    hidden, heads, intermediate = config["hidden_size"], config["num_attention_heads"], config["intermediate_size"]
    head_dim = config.get("head_dim") or hidden // heads
    q_width, kv_width = heads * head_dim, (config.get("num_key_value_heads") or heads) * head_dim
    attention = 2 * hidden * q_width + 2 * hidden * kv_width
    attention += (q_width + 2 * kv_width + hidden) if config.get("attention_bias") else 0
    mlp = 3 * hidden * intermediate + ((2 * intermediate + hidden) if config.get("mlp_bias") else 0)
    embeddings = config["vocab_size"] * hidden * (1 if embeddings_tied(config) else 2)
    return config["num_hidden_layers"] * (attention + mlp + 2 * hidden) + hidden + embeddings


def embeddings_tied(config: dict) -> bool:
    """Whether the output head shares the input embeddings, as a config says (Llama's default: not)."""
    return bool(text_config(config).get("tie_word_embeddings", config.get("tie_word_embeddings", False)))
