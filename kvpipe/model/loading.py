"""Model loading: the embedded SmolLM2, seeded tiny random Llamas, any local or hub model.

Models are loaded at most once per process (see `load`), so sweeps reuse them.
"""

from __future__ import annotations

import gc
import logging
import mmap
import sys
import time
from dataclasses import astuple, dataclass
from typing import Any

from kvpipe._startup import collector_paused, prepare
from kvpipe.config import ModelConfig
from kvpipe.errors import KvpipeError, first_line
from kvpipe.model.embedded import embedded_folder
from kvpipe.model.shape import ModelFolderError, ModelShape, local_folder, random_config_dict, shape_from_model_config

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    model: Any
    tokenizer: Any
    shape: ModelShape
    device: str
    dtype: str
    load_s: float
    weights_bytes: int
    input_embedding_bytes: int = 0  # the input embedding matrix
    embedding_row_bytes: int = 0  # one token's row of it
    embeddings_tied: bool = False  # the output head shares the input embeddings


_LOADED: dict[str, LoadedModel] = {}


def resolve_device(requested: str) -> str:
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise KvpipeError("model.device='cuda' but no CUDA GPU is visible; use model.device=auto or cpu")
    return requested


def dtype_name(requested: str, device: str) -> str:
    """auto: float32 on CPU (half-precision matmuls are slow there), bfloat16 on CUDA when supported
    (and on a machine without CUDA, where `kvpipe plan --device cuda` asks), else float16."""
    if requested != "auto":
        return requested
    if device != "cuda":
        return "float32"
    import torch

    return "float16" if torch.cuda.is_available() and not torch.cuda.is_bf16_supported() else "bfloat16"


def resolve_dtype(requested: str, device: str):
    """The torch dtype for dtype_name(requested, device)."""
    import torch

    return getattr(torch, dtype_name(requested, device))


def config_key(model_cfg: ModelConfig) -> str:
    """A hashable key for a model config (its lists and dicts, layer_types and architecture, are not)."""
    return repr(astuple(model_cfg))


def import_libraries() -> float:
    """torch and transformers' loading, modeling and tokenizer code: what the first load imports,
    for a caller with something to overlap them with (kvpipe.orchestrate.sweep). Returns the seconds
    this call spent importing them: 0.0 where an earlier call had. The collector is off meanwhile:
    the imports make hundreds of thousands of objects that live as long as the process, and its
    full passes over them cost a fifth of the imports' time (3.2 s against 2.5 s, plus 0.4 s for the
    one pass afterwards, on 2 cores)."""
    prepare()  # every job's process: the CLI's, a launcher's worker, a test's
    if "transformers.modeling_utils" in sys.modules:
        return 0.0
    started = time.perf_counter()
    with collector_paused():
        import torch  # noqa: F401
        import transformers.generation.utils  # noqa: F401
        import transformers.modeling_utils  # noqa: F401
        from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401
    # One pass for the imports' garbage, then their objects out of every later pass's way
    gc.collect()
    gc.freeze()
    return time.perf_counter() - started


def is_loaded(model_cfg: ModelConfig) -> bool:
    """Whether load(model_cfg) would hand back the model an earlier call loaded, paying nothing."""
    return config_key(model_cfg) in _LOADED


def load(model_cfg: ModelConfig) -> LoadedModel:
    """Load (or reuse) the model and tokenizer described by model_cfg."""
    key = config_key(model_cfg)
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
                location,
                dtype=dtype,
                attn_implementation=model_cfg.attn_implementation,
                use_safetensors=None,
                **placement,
                **common,
            )
        except Exception as exc:  # noqa: BLE001 - a broken folder fails in many ways (OSError, SafetensorError,
            # a size mismatch's RuntimeError, ...): each is the user's file, said in one line
            raise ModelFolderError(f"model.name_or_path={location!r} could not be loaded: {_why(exc)}") from exc
    if model_cfg.device_map:
        device = str(model.device.type)  # where the first layers (and the inputs) live
        model.eval()
    else:
        model.to(device).eval()
    if device == "cpu":
        make_resident(model)
    load_s = time.perf_counter() - started
    weights_bytes = model_bytes(model)
    log.info("loaded %s on %s (%s) in %.2f s", model_cfg.name, device, str(dtype).removeprefix("torch."), load_s)
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        shape=shape_from_model_config(model.config),
        device=device,
        dtype=str(dtype).removeprefix("torch."),
        load_s=load_s,
        weights_bytes=weights_bytes,
        input_embedding_bytes=embedding.numel() * embedding.element_size(),
        embedding_row_bytes=embedding.shape[-1] * embedding.element_size(),
        embeddings_tied=head is not None and head.weight.data_ptr() == embedding.data_ptr(),
    )


def model_bytes(model) -> int:
    """Bytes of a model's parameters (tied weights once) and buffers: `weights_bytes`."""
    parameters = {p.data_ptr(): p for p in model.parameters()}.values()
    return sum(t.numel() * t.element_size() for t in [*parameters, *model.buffers()])


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {first_line(exc)}"


def make_resident(model) -> None:
    """Page in every weight. safetensors weights on CPU are mapped from the file and would page in
    during the first forward pass, so a first call's peak memory would count them and a later call's
    would not; resident from the start, every call's peak means the same. Reading one byte of each
    page does it without a copy (0.09-0.15 s for the embedded model in float32, against 0.21-0.35 s
    to clone it into anonymous memory, at the same resident set)."""
    import torch

    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if tensor.numel():
                tensor.detach().reshape(-1).view(torch.uint8)[:: mmap.PAGESIZE].sum()


def generation_config(model_cfg: ModelConfig):
    """The model's generation config (its end-of-answer tokens), from its folder, without its weights:
    what a job served by an engine's own server reads of the model."""
    from transformers import GenerationConfig

    location = local_folder(model_cfg) or (embedded_folder() if model_cfg.source != "hf" else model_cfg.name_or_path)
    return GenerationConfig.from_pretrained(str(location), revision=model_cfg.revision)


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
        except Exception as exc:  # noqa: BLE001 - missing or malformed tokenizer files, as above
            raise ModelFolderError(f"model.name_or_path={location!r} has no loadable tokenizer: {_why(exc)}") from exc
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
