"""A model=hf run is named after what it loads: a local folder's own name where it says something;
where it does not (`…/gemma/model`, a snapshot hash), its config.json, its parent folder or its
architecture. An explicit model.name always wins."""

from __future__ import annotations

import json

import pytest

from kvpipe.jobspec.names import hf_model_name

from conftest import spec_for


def folder_with_config(path, **config):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def test_a_meaningful_folder_name_names_the_model(tmp_path):
    assert hf_model_name(folder_with_config(tmp_path / "gemma-2b-it", model_type="gemma")) == "gemma-2b-it"


def test_a_hub_id_names_the_model_as_written():
    assert hf_model_name("google/gemma-2b") == "google/gemma-2b"


@pytest.mark.parametrize("generic", ["model", "weights", "checkpoint", "hf", "main", "3f2a9c1b7e8d"])
def test_a_generic_folder_is_named_by_the_hub_id_in_its_config(tmp_path, generic):
    folder = folder_with_config(tmp_path / "x" / generic, _name_or_path="google/gemma-2b", model_type="gemma")
    assert hf_model_name(folder) == "google/gemma-2b"


def test_a_generic_folder_is_named_by_a_meaningful_path_in_its_config(tmp_path):
    folder = folder_with_config(tmp_path / "x" / "model", _name_or_path="/data/llama-3-8b", model_type="llama")
    assert hf_model_name(folder) == "llama-3-8b"


def test_a_generic_folder_without_a_useful_config_name_is_named_by_its_parent(tmp_path):
    folder = folder_with_config(tmp_path / "gemma" / "model", _name_or_path="/elsewhere/model", model_type="gemma")
    assert hf_model_name(folder) == "gemma"


def test_a_generic_folder_in_a_generic_parent_is_named_by_its_architecture(tmp_path):
    folder = folder_with_config(tmp_path / "weights" / "model", architectures=["Gemma2ForCausalLM"])
    assert hf_model_name(folder) == "Gemma2ForCausalLM"
    other = folder_with_config(tmp_path / "hf" / "snapshot", model_type="qwen2")
    assert hf_model_name(other) == "qwen2"


def test_make_spec_names_a_generic_folder_and_an_explicit_name_wins(tmp_path):
    folder = folder_with_config(tmp_path / "gemma" / "model", model_type="gemma")
    assert spec_for("model=hf", f"model.name_or_path={folder}").model.name == "gemma"
    assert spec_for("model=hf", f"model.name_or_path={folder}", "model.name=mine").model.name == "mine"
