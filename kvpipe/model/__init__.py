"""The model stage: the embedded model, loading (once per process), shapes and weight bytes."""

from kvpipe.model.embedded import cache_dir, embedded_folder, embedded_gguf
from kvpipe.model.loading import (
    LoadedModel,
    dtype_name,
    generation_config,
    import_libraries,
    is_loaded,
    load,
    load_tokenizer,
    resolve_device,
    resolve_dtype,
)
from kvpipe.model.shape import ModelShape, architecture_params, local_folder, random_config_dict, read_shape

__all__ = [
    "LoadedModel", "ModelShape", "architecture_params", "cache_dir", "dtype_name", "embedded_folder", "generation_config",
    "embedded_gguf", "import_libraries", "is_loaded", "load", "load_tokenizer", "local_folder", "random_config_dict", "read_shape",
    "resolve_device", "resolve_dtype",
]  # fmt: skip
