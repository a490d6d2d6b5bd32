"""Malformed model folders join the bad-input catalogue: a folder that exists but is broken is one
line naming model.name_or_path and what is wrong, never a traceback, and nothing is recorded."""

from __future__ import annotations

import shutil

import pytest

from kvpipe.errors import KvpipeError
from kvpipe.model import embedded_folder

from conftest import run_cli, spec_for

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt")
SHAPE = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)


def save_model(folder, **shape):
    """A tiny Llama (SHAPE, or `shape`) saved as a model folder: config.json, model.safetensors and
    the embedded tokenizer."""
    shape = shape or SHAPE
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=49152, tie_word_embeddings=True, **shape)).save_pretrained(folder)
    for name in TOKENIZER_FILES:
        if (embedded_folder() / name).is_file():
            shutil.copy(embedded_folder() / name, folder / name)
    return folder


def not_json(folder):
    (folder / "config.json").write_text('{"model_type": "llama", ')


def no_tokenizer(folder):
    for name in TOKENIZER_FILES:
        (folder / name).unlink(missing_ok=True)


def truncated_weights(folder):
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])


def mismatched_weights(folder):
    # weights of a wider model under this folder's config
    other = save_model(folder.parent / "wider", **{**SHAPE, "hidden_size": 32, "intermediate_size": 64})
    shutil.copy(other / "model.safetensors", folder / "model.safetensors")


BROKEN = {
    "config.json is not JSON": (not_json, "config.json is not valid JSON"),
    "no tokenizer files": (no_tokenizer, "has no loadable tokenizer"),
    "truncated safetensors": (truncated_weights, "could not be loaded"),
    "safetensors of another shape": (mismatched_weights, "could not be loaded"),
}


@pytest.fixture(scope="module")
def good_model(tmp_path_factory):
    return save_model(tmp_path_factory.mktemp("model") / "tiny")


def broken_copy(good_model, tmp_path, case):
    folder = tmp_path / "broken"
    shutil.copytree(good_model, folder)
    BROKEN[case][0](folder)
    return folder


def test_the_intact_folder_runs(good_model, tmp_path):
    from kvpipe.job.runner import run_job

    spec = spec_for("model=hf", f"model.name_or_path={good_model}", "workload.max_new_tokens=2", "workload.warmup=0",
                    "workload.repeats=1", "quality=off", "tracking=off", "workload.prompts=[Hi.]")  # fmt: skip
    assert run_job(spec).metrics["kv_cache_bytes"] > 0  # so each breakage below is what fails


def test_a_model_folder_names_its_runs_and_model_name_overrides_it(good_model, capsys):
    from kvpipe import cli
    from kvpipe.job.runner import run_job
    from kvpipe.record.result import Result
    from kvpipe.record.tracking import run_name

    common = ("model=hf", f"model.name_or_path={good_model}/", "workload.max_new_tokens=2", "workload.warmup=0",
              "workload.repeats=1", "quality=off", "tracking=off", "workload.prompts=[Hi.]")  # fmt: skip
    spec = spec_for(*common)
    assert spec.model.name == spec.params()["model.name"] == good_model.name
    assert run_name(Result.finished(spec, run_job(spec))).startswith(f"dynamic · {good_model.name} · chat")
    named = spec_for(*common, "model.name=mine")
    assert named.params()["model.name"] == "mine" and named.measurement_key() != spec.measurement_key()
    assert spec_for("model=hf", "model.name_or_path=org/some-model").model.name == "org/some-model"  # a hub id
    assert cli.subcommand(["plan", *common[:2], "--device", "cpu"]) == 0
    assert f"kvpipe plan · {good_model.name} · cpu" in capsys.readouterr().out


@pytest.mark.slow  # saves a model folder per case
@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_model_folder_is_one_line_and_records_nothing(case, good_model, tmp_path):
    from kvpipe.model import loading
    from kvpipe.orchestrate.pipeline import run_pipeline

    loading._TOKENIZERS.clear()
    folder = broken_copy(good_model, tmp_path, case)
    spec = spec_for("model=hf", f"model.name_or_path={folder}", "workload.max_new_tokens=2", "workload.warmup=0",
                    "workload.repeats=1", "quality=off", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db")  # fmt: skip
    with pytest.raises(KvpipeError) as raised:
        run_pipeline(spec, tmp_path / "run", tmp_path, print_table=False)
    message = str(raised.value)
    assert "\n" not in message and f"model.name_or_path={folder}" in message.replace("'", "")
    assert BROKEN[case][1] in message
    assert not (tmp_path / "run" / "result.json").exists() and not (tmp_path / "mlflow.db").exists()


@pytest.mark.slow  # starts kvpipe processes
def test_a_config_that_is_not_json_is_one_line_from_the_cli_and_from_plan(good_model, tmp_path):
    folder = broken_copy(good_model, tmp_path, "config.json is not JSON")
    for args in (["model=hf", f"model.name_or_path={folder}"], ["plan", "model=hf", f"model.name_or_path={folder}"]):
        proc = run_cli(args, cwd=tmp_path, timeout=120)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert "config.json is not valid JSON" in lines[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "outputs" / "mlflow.db").exists()


def test_a_prompt_too_long_names_the_prompt_length(tmp_path):
    from kvpipe.job.runner import run_job

    spec = spec_for("model=tiny_random", "model.max_position_embeddings=256", "workload=long_context",
                    "workload.prompt_tokens=250", "workload.max_new_tokens=16", "tracking=off")  # fmt: skip
    with pytest.raises(KvpipeError, match=r"workload.prompt_tokens=250.*at most 240"):
        run_job(spec)


@pytest.mark.slow  # starts kvpipe processes
def test_plan_answers_for_the_llama_presets_without_the_network(tmp_path, monkeypatch):
    # No hub: offline mode, and an endpoint that cannot answer, in case offline mode were ignored
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    for preset, per_token in (("llama2_7b_chat", "524,288"), ("llama31_8b_instruct", "131,072")):
        proc = run_cli(["plan", f"model={preset}", "--device", "cuda"], cwd=tmp_path, timeout=60)
        assert proc.returncode == 0, proc.stderr
        dynamic_row = next(line for line in proc.stdout.splitlines() if line.strip("│ ").startswith("dynamic"))
        assert per_token in dynamic_row, proc.stdout
        text = " ".join(proc.stdout.split())  # rich wraps long lines
        assert "ESTIMATED" in text and f"model.architecture of the {preset} preset" in text
