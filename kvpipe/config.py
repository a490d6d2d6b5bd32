"""Typed schemas for every config group, registered in Hydra's ConfigStore.

The schema is the first entry of `conf/config.yaml`'s defaults list, so a misspelt key
or a wrong type in any group file or override fails at composition, not silently.
Pure Python: importing this module must not import torch, transformers or mlflow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from hydra.core.config_store import ConfigStore

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
ATTN_IMPLEMENTATIONS = ("sdpa", "eager")
MODEL_SOURCES = ("embedded", "random", "hf")
DEVICE_MAPS = ("auto", "balanced", "sequential")
CACHE_STRATEGIES = ("dynamic", "static", "offloaded", "offloaded_static", "quantized")
BACKENDS = ("quanto", "hqq", "fp8")
AXIS_LAYOUTS = ("per_token", "per_channel", "kivi")
WORKLOAD_KINDS = ("chat", "long_context")


def _help(text: str) -> dict:
    return {"help": text}


@dataclass
class ModelConfig:
    name: str = "smollm2_135m"
    source: str = field(default="embedded", metadata=_help("embedded | random | hf"))
    name_or_path: Optional[str] = field(default=None, metadata=_help("local folder or hub id (source=hf)"))
    revision: Optional[str] = None
    trust_remote_code: bool = False
    dtype: str = field(default="auto", metadata=_help("auto | float32 | bfloat16 | float16"))
    device: str = field(default="auto", metadata=_help("auto (cuda when available) | cpu | cuda"))
    attn_implementation: str = field(default="sdpa", metadata=_help("sdpa | eager"))
    device_map: Optional[str] = field(default=None, metadata=_help("hf only: auto | balanced | sequential "
                                                                    "(accelerate) for models larger than one GPU"))
    seed: int = 0
    # Only for source=random: the shape of the seeded tiny Llama.
    vocab_size: int = 49152  # the embedded tokenizer's, which random models borrow
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: Optional[int] = None
    max_position_embeddings: int = 4096
    sliding_window: Optional[int] = None


@dataclass
class CacheConfig:
    strategy: str = field(default="dynamic", metadata=_help("dynamic | static | offloaded | offloaded_static | quantized"))
    max_cache_len: Optional[int] = field(default=None, metadata=_help("static caches; default prompt + max_new_tokens"))
    compile: bool = field(default=False, metadata=_help("static only: torch.compile the forward"))


@dataclass
class BackendConfig:
    name: str = field(default="quanto", metadata=_help("quanto | hqq | fp8 (quantized cache only)"))
    nbits: int = 4
    q_group_size: int = 64
    residual_length: int = 128


@dataclass
class AxisConfig:
    layout: str = field(default="kivi", metadata=_help("per_token | per_channel | kivi"))
    key: Optional[int] = field(default=None, metadata=_help("raw backend axis for keys; overrides layout"))
    value: Optional[int] = field(default=None, metadata=_help("raw backend axis for values; overrides layout"))


@dataclass
class WorkloadConfig:
    kind: str = field(default="chat", metadata=_help("chat | long_context"))
    prompts: List[str] = field(default_factory=list)
    prompt_tokens: int = field(default=1000, metadata=_help("long_context: tokens per prompt"))
    max_new_tokens: int = 32
    batch_size: int = 1
    do_sample: bool = False
    ignore_eos: bool = field(default=True, metadata=_help("generate exactly max_new_tokens, as benchmarks do"))
    seed: int = 0
    warmup: int = 1
    repeats: int = 1


@dataclass
class QualityConfig:
    enabled: bool = True
    context_tokens: int = field(default=512, metadata=_help("teacher-forced text length in tokens"))
    scored_tokens: int = field(default=64, metadata=_help("last tokens fed one by one through the cache and scored"))


@dataclass
class TrackingConfig:
    enabled: bool = True
    uri: Optional[str] = field(default=None, metadata=_help("MLflow URI; default sqlite:///<store_dir>/mlflow.db"))
    store_dir: str = field(default="outputs", metadata=_help("where the default store lives, relative to the launch dir"))
    experiment: str = "kvpipe"
    run_name: Optional[str] = None


@dataclass
class KvpipeConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    axis: AxisConfig = field(default_factory=AxisConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    quality: QualityConfig = field(default_factory=QualityConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    print_table: bool = True
    fallback: List[str] = field(default_factory=lambda: ["offloaded"],
                                metadata=_help("strategies to retry with, in order, after an out-of-memory error"))
    resume: bool = field(default=False, metadata=_help("multirun: skip jobs already FINISHED in the experiment"))
    sweep_name: Optional[str] = field(default=None, metadata=_help("multirun: the MLflow parent run's name"))


def register_schemas() -> None:
    """Store the schema under `kvpipe_schema`, the first entry of conf/config.yaml's defaults."""
    ConfigStore.instance().store(name="kvpipe_schema", node=KvpipeConfig)


def compose(overrides: list[str] | tuple[str, ...] = (), with_hydra: bool = False):
    """Compose conf/config.yaml with overrides, as `python -m kvpipe` would (for tests and benchmarks)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    register_schemas()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module="kvpipe.conf", version_base="1.3"):
            return hydra_compose(config_name="config", overrides=list(overrides), return_hydra_config=with_hydra)
    finally:
        GlobalHydra.instance().clear()
