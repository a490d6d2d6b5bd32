"""Models: loaded once per process, seeded random models, the embedded model's conversion cache."""

from __future__ import annotations

import pytest

from kvpipe import disk_cache
from kvpipe import model as models
from kvpipe.config import ModelConfig
from kvpipe.model import embedded, loading

TINY = ModelConfig(name="tiny_random", source="random", dtype="float32")


def test_model_loads_at_most_once_per_process():
    assert models.load(TINY) is models.load(TINY)


def test_tiny_random_is_seeded():
    import torch

    first = loading._build_random(TINY, torch.float32)[0].state_dict()
    second = loading._build_random(TINY, torch.float32)[0].state_dict()
    other = loading._build_random(ModelConfig(**{**TINY.__dict__, "seed": 1}), torch.float32)[0].state_dict()
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert not torch.equal(first["model.embed_tokens.weight"], other["model.embed_tokens.weight"])


def test_cache_dir_follows_the_environment_variable(monkeypatch, tmp_path):
    monkeypatch.setenv(disk_cache.CACHE_DIR_ENV, str(tmp_path))
    assert models.cache_dir() == tmp_path


def test_embedded_gguf_is_found_without_importing_the_package():
    import sys

    path = models.embedded_gguf()
    assert path.name == embedded.EMBEDDED_GGUF and path.stat().st_size > 50_000_000
    assert embedded.EMBEDDED_PACKAGE not in sys.modules


def test_describe_reads_the_shape_without_weights():
    shape = models.read_shape(ModelConfig())
    assert (shape.num_layers, shape.num_kv_heads, shape.head_dim) == (30, 3, 64)
    assert shape.has_sliding_layers is False


@pytest.mark.slow  # loads the embedded model once more, uncached
def test_embedded_model_loads_from_the_converted_safetensors_folder(monkeypatch):
    from transformers import AutoModelForCausalLM

    folder = models.embedded_folder()
    assert (folder / "model.safetensors").is_file()
    read = []  # where each from_pretrained read its weights: the folder, never the GGUF (~20 s against ~1 s)
    real = AutoModelForCausalLM.from_pretrained.__func__
    monkeypatch.setattr(
        AutoModelForCausalLM,
        "from_pretrained",
        classmethod(
            lambda cls, location, *a, **k: read.append((location, k.get("gguf_file"))) or real(cls, location, *a, **k)
        ),
    )
    loaded = loading._load_uncached(ModelConfig())
    assert read == [(str(folder), None)]
    assert loaded.weights_bytes > 100_000_000


def test_what_the_conversion_prints_goes_to_its_log_and_not_the_terminal(tmp_path, capfd):
    import os

    from tqdm import tqdm

    log = tmp_path / "conversion.log"
    with embedded.output_to(log):
        print("a line of Python's")
        for _ in tqdm(range(3), desc="tensors"):  # as the GGUF reader's per-tensor bar
            pass
        os.write(2, b"a line written to file descriptor 2\n")  # as a C library or an early-bound handler
    print("after")
    out, err = capfd.readouterr()
    assert (out, err) == ("after\n", "")
    written = log.read_text()
    assert "a line of Python's" in written and "tensors: 100%" in written and "file descriptor 2" in written
    assert embedded.last_lines(log, 2).splitlines()[-1] == "a line written to file descriptor 2"


def test_a_failed_conversion_names_its_log_shows_its_tail_and_leaves_no_folder(tmp_path, caplog, capfd):
    gguf = tmp_path / "broken.gguf"
    gguf.write_bytes(b"not a GGUF file")
    folder = tmp_path / "converted"
    with caplog.at_level("INFO", logger=embedded.__name__), pytest.raises(ValueError):  # what the GGUF reader raises
        embedded._convert_gguf(gguf, folder)
    assert not folder.exists()
    log = embedded.conversion_log(folder)
    assert f"its output: {log}" in caplog.text and f"the conversion stopped; the last lines of {log}" in caplog.text
    assert capfd.readouterr() == ("", "")  # nothing of the conversion's own reached the terminal


def test_device_map_places_an_hf_model_through_accelerate(tmp_path):
    from dataclasses import replace

    loaded = models.load(TINY)
    folder = tmp_path / "m"
    loaded.model.save_pretrained(folder)
    loaded.tokenizer.save_pretrained(folder)
    placed = loading._load_uncached(replace(TINY, name="hf", source="hf", name_or_path=str(folder), device_map="auto"))
    cuda = __import__("torch").cuda.is_available()
    assert placed.device == ("cuda" if cuda else "cpu")
    if cuda:  # without a GPU accelerate keeps everything on the CPU and records no map
        assert hasattr(placed.model, "hf_device_map")


def test_device_map_is_only_for_hf_models():
    from kvpipe.errors import ConfigError

    from conftest import spec_for

    with pytest.raises(ConfigError, match="model.device_map"):
        spec_for("model=tiny_random", "model.device_map=auto")


def mapped_resident_bytes(path) -> tuple[int, int]:
    """(size, resident bytes) of this process's mappings of `path`, from /proc/self/smaps."""
    size = resident = 0
    mapping = False
    for line in open("/proc/self/smaps"):
        if "-" in line.split()[0]:  # a mapping's header: its address range, ..., its path
            mapping = line.rstrip().endswith(str(path))
        elif mapping and line.startswith("Size:"):
            size += int(line.split()[1]) * 1024
        elif mapping and line.startswith("Rss:"):
            resident += int(line.split()[1]) * 1024
    return size, resident


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/smaps"), reason="reads /proc/self/smaps")
def test_memory_mapped_weights_are_resident_once_loaded(tmp_path):
    """A float32 safetensors file stays mapped (no dtype conversion copies it); every page of it is in
    the process's resident set before any call, so a first call's peak counts no weight page-in."""
    from dataclasses import replace

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path / "m"
    shape = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4)
    LlamaForCausalLM(LlamaConfig(vocab_size=32000, **shape)).save_pretrained(folder)  # ~50 MB of weights
    models.load(TINY).tokenizer.save_pretrained(folder)
    loaded = loading._load_uncached(replace(TINY, name="hf", source="hf", name_or_path=str(folder)))
    size, resident = mapped_resident_bytes(folder / "model.safetensors")
    weights = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    assert loaded.model.dtype == torch.float32 and size > weights  # still the file's pages
    assert resident > 0.95 * weights
