"""`kvpipe --help` shows the defaults of the model it names: a random model's shape (which the
schema carries as defaults) only under a random model."""

from __future__ import annotations

import yaml

from conftest import run_cli


def help_defaults(tmp_path, *overrides: str) -> dict:
    said = run_cli(["--help", *overrides], cwd=tmp_path)
    assert said.returncode == 0
    body = said.stdout.split("== Defaults (override any key=value) ==\n", 1)[1].split("\nSubcommands:", 1)[0]
    return yaml.safe_load(body)


def test_help_shows_no_random_models_shape_under_the_embedded_model(tmp_path):
    model = help_defaults(tmp_path)["model"]
    assert (model["name"], model["source"]) == ("smollm2_135m", "embedded")
    assert not {"hidden_size", "num_hidden_layers", "vocab_size", "name_or_path"} & set(model)


def test_help_shows_the_shape_of_a_random_model(tmp_path):
    model = help_defaults(tmp_path, "model=tiny_random")["model"]
    assert (model["hidden_size"], model["num_hidden_layers"], model["head_dim"]) == (64, 2, 64)
    assert help_defaults(tmp_path)["cache"]["strategy"] == "dynamic"
