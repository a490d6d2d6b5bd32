"""The passkey workload's prompt construction, on the embedded tokenizer (tiny_random borrows it)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kvpipe import model as models
from kvpipe.errors import ConfigError
from kvpipe.record.result import iter_results
from kvpipe.workload.passkey import prompts as passkey
from kvpipe.workload.passkey import retrieval
from kvpipe.workload.passkey.prompts import QUESTION, found, needle, passkey_key, passkey_prompt

from conftest import run_cli, spec_for


@pytest.fixture(scope="module")
def tokenizer():
    return models.load_tokenizer(spec_for("model=tiny_random").model)


@pytest.mark.parametrize("context_tokens", [300, 1000, 2048])
@pytest.mark.parametrize("depth", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_every_prompt_lands_on_its_exact_token_count(tokenizer, context_tokens, depth):
    prompt = passkey_prompt(tokenizer, context_tokens, depth, passkey_key(0, context_tokens, depth, 0))
    assert len(prompt.input_ids) == context_tokens


def test_the_needle_sits_at_its_depth_of_the_filler(tokenizer):
    starts = []
    for depth in (0.1, 0.5, 0.9):
        prompt = passkey_prompt(tokenizer, 1000, depth, "48213")
        needle_ids = tokenizer(needle("48213"), add_special_tokens=False)["input_ids"]
        assert prompt.input_ids[prompt.needle_start : prompt.needle_start + len(needle_ids)] == needle_ids
        starts.append(prompt.needle_start)
    span = starts[2] - starts[0]  # 0.8 of the filler
    assert abs((starts[1] - starts[0]) - span / 2) <= 1 and 600 < span / 0.8 < 1000


def test_keys_are_seeded_digits_that_differ_between_cells_and_trials():
    assert passkey_key(0, 1000, 0.5, 0) == passkey_key(0, 1000, 0.5, 0)
    keys = {passkey_key(seed, ctx, d, t) for seed in (0, 1) for ctx in (500, 1000) for d in (0.1, 0.9) for t in (0, 1)}
    assert len(keys) == 16 and all(k.isdigit() and len(k) == 5 for k in keys)


def test_the_question_does_not_leak_the_key_and_the_key_appears_once_as_a_needle(tokenizer):
    key = "48213"
    prompt = passkey_prompt(tokenizer, 1000, 0.5, key)
    text = tokenizer.decode(prompt.input_ids)
    assert key not in QUESTION and text.count(key) == 2  # the needle says it twice, nothing else does
    assert text.rstrip().endswith("assistant") or QUESTION.strip() in text[-200:]


def test_trials_hide_the_key_in_different_filler(tokenizer):
    a, b = (passkey_prompt(tokenizer, 800, 0.5, "11111", trial=t).input_ids for t in (0, 1))
    assert len(a) == len(b) and a[:20] == b[:20] and a[100:300] != b[100:300]  # same template start, other text


def test_too_short_a_context_names_the_setting(tokenizer):
    with pytest.raises(ConfigError, match="workload.context_tokens=20"):
        passkey_prompt(tokenizer, 20, 0.5, "12345")


@pytest.mark.parametrize(
    "answer, hit", [("The pass key is 48213.", True), ("48213", True), ("482130", False), ("The pass is", False)]
)
def test_an_answer_counts_only_with_the_exact_key(answer, hit):
    assert found(answer, "48213") is hit


# --- the workload: config, batches, scoring -----------------------------------------------------------

PASSKEY = ("workload=passkey", "workload.context_tokens=[200,400]", "workload.depths=[0.25,0.75]", "workload.trials=2")


def test_one_length_is_a_list_of_one_and_lengths_are_sorted(tiny_spec):
    assert tiny_spec("workload=passkey", "workload.context_tokens=700").workload.context_tokens == [700]
    assert tiny_spec("workload=passkey", "workload.context_tokens=[900,300,900]").workload.context_tokens == [300, 900]


@pytest.mark.parametrize(
    "override, field",
    [
        ("workload.context_tokens=0", "workload.context_tokens"),
        ("workload.context_tokens=[500,abc]", "workload.context_tokens"),
        ("workload.context_tokens=[]", "workload.context_tokens"),
        ("workload.depths=[0.5,1.5]", "workload.depths"),
        ("workload.depths=[]", "workload.depths"),
        ("workload.trials=0", "workload.trials"),
    ],
)
def test_bad_passkey_settings_name_their_field(tiny_spec, override, field):
    with pytest.raises(ConfigError, match=rf"^{field}=.*expected"):
        tiny_spec("workload=passkey", override)


def test_settings_a_workload_kind_does_not_read_do_not_change_what_it_measures(tiny_spec):
    assert tiny_spec("workload.trials=5").measurement_key() == tiny_spec().measurement_key()  # chat
    passkey_key = tiny_spec("workload=passkey").measurement_key()
    assert tiny_spec("workload=passkey", "workload.prompts=[Hi.]").measurement_key() == passkey_key
    assert tiny_spec("workload=passkey", "workload.trials=3").measurement_key() != passkey_key


def test_batches_hold_every_length_depth_and_trial_once_with_its_needle(tiny_spec, tokenizer):
    spec = tiny_spec(*PASSKEY, "workload.batch_size=3")
    batches = spec.bound_workload.batches(tokenizer, "cpu")
    # 4 prompts per length in batches of 3: a full batch and a batch of one, never a repeated prompt
    assert [tuple(b.input_ids.shape) for b in batches] == [(3, 200), (1, 200), (3, 400), (1, 400)]
    needles = [n for b in batches for n in b.rows]
    assert sorted((n.context_tokens, n.depth, n.trial) for n in needles) == sorted(
        (length, depth, trial) for length in (200, 400) for depth in (0.25, 0.75) for trial in (0, 1)
    )
    for batch in batches:
        for row, needle_prompt in zip(batch.input_ids.tolist(), batch.rows):
            assert row == needle_prompt.input_ids and needle_prompt.key in tokenizer.decode(row)
    assert len({n.key for n in needles}) == len(needles)


def test_a_passkey_prompt_past_the_models_positions_names_context_tokens(tiny_spec):
    with pytest.raises(
        ConfigError, match=r"^workload.context_tokens=\[500, 5000\] is not valid: expected lengths of at most 4090"
    ):
        from kvpipe.job.runner import run_job

        run_job(tiny_spec("workload=passkey", "workload.context_tokens=[500,5000]"))


def test_quality_scores_the_longest_prompts_one_depth_after_another(tiny_spec, tokenizer):
    spec = tiny_spec(*PASSKEY)
    windows = spec.bound_workload.windows(tokenizer, 3, 64)
    assert [len(w.prefix) for w in windows] == [400, 400, 400] and all(w.continuation is None for w in windows)
    longest = [p for p in spec.bound_workload.prompts(tokenizer) if p.context_tokens == 400]
    by_cell = {(p.depth, p.trial): p.input_ids for p in longest}
    assert [w.prefix for w in windows] == [by_cell[0.25, 0], by_cell[0.75, 0], by_cell[0.25, 1]]


def _call(tokens, ttft=100.0, kv=1000):
    timing = SimpleNamespace(ttft_ms=ttft, tpot_ms=ttft / 10)
    return SimpleNamespace(new_tokens=torch.tensor(tokens), timing=timing, kv_bytes=kv)


def test_answers_are_cut_at_end_of_sequence_and_scored_per_cell(tokenizer):
    eos = tokenizer.eos_token_id
    say = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    make = lambda length, depth, key: passkey.PasskeyPrompt([], key, length, depth, 0, 0)  # noqa: E731
    batches = [
        SimpleNamespace(rows=[make(200, 0.5, "11111"), make(200, 0.5, "22222")]),
        SimpleNamespace(rows=[make(400, 0.5, "33333")]),
    ]
    # after end-of-sequence the fixed-length generation rambles on; what it says there does not count
    first = say("The pass key is 11111.") + [eos]
    second = say("The pass is") + [eos] + say("22222")
    second += [eos] * (len(first) - len(second))
    calls = [_call([first, second], 100, 1000), _call([say("33333") + [eos]], 300, 2000)]
    rows = retrieval.score(tokenizer, {eos}, batches, calls)
    assert [(r["answer"], r["found"]) for r in rows] == [
        ("The pass key is 11111.", True),
        ("The pass is", False),
        ("33333", True),
    ]
    assert retrieval.metrics(rows) == {"retrieval_accuracy": pytest.approx(2 / 3), "retrieval_answers": 3}
    cells = retrieval.cells(rows)
    assert [(c["context_tokens"], c["depth"], c["found"], c["answers"]) for c in cells] == [
        (200, 0.5, 1, 2),
        (400, 0.5, 1, 1),
    ]
    stepped = {(name, step): value for name, value, step in retrieval.stepped_metrics(rows)}
    assert (
        stepped[("retrieval_accuracy/depth_0.5", 200)] == 0.5 and stepped[("retrieval_accuracy/all_depths", 400)] == 1
    )
    assert stepped[("ttft_ms/by_length", 400)] == 300 and stepped[("kv_cache_bytes/by_length", 200)] == 1000


# --- a passkey sweep, recorded and compared -----------------------------------------------------------

PASSKEY_SWEEP = [
    "-m",
    "model=tiny_random",
    *PASSKEY[:3],
    "workload.trials=1",
    "workload.max_new_tokens=4",
    "workload.warmup=0",
    "quality=off",
    "cache=dynamic,quantized",
    "backend=hqq",
    "backend.nbits=2",
]


@pytest.fixture(scope="module")
def passkey_sweep(tmp_path_factory, existing_store):
    launch_dir = tmp_path_factory.mktemp("passkey_sweep")
    existing_store(launch_dir)
    proc = run_cli(PASSKEY_SWEEP, cwd=launch_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (sweep_dir,) = (launch_dir / "outputs" / "multiruns").glob("*/*")
    return SimpleNamespace(launch_dir=launch_dir, sweep_dir=sweep_dir, uri=f"sqlite:///{launch_dir}/outputs/mlflow.db")


@pytest.mark.slow  # one real sweep in a separate process, shared by these tests
def test_each_run_records_every_answer_and_its_heatmap(passkey_sweep):
    results = [result for _, result in iter_results(passkey_sweep.sweep_dir)]
    assert [r.status for r in results] == ["FINISHED", "FINISHED"]
    for path, result in iter_results(passkey_sweep.sweep_dir):
        cells = {(row["context_tokens"], row["depth"]) for row in result.answers}
        assert len(result.answers) == 4 and cells == {(200, 0.25), (200, 0.75), (400, 0.25), (400, 0.75)}
        found = sum(row["found"] for row in result.answers)
        assert result.metrics["retrieval_accuracy"] == found / 4 and result.metrics["retrieval_answers"] == 4
        assert result.params["workload.context_tokens"] == "[200, 400]" and "workload.prompts" not in result.params
        assert (path.parent / "retrieval_heatmap.png").stat().st_size > 5000


@pytest.mark.slow  # one real sweep in a separate process, shared by these tests
def test_mlflow_steps_accuracy_by_context_length_and_keeps_the_tables(passkey_sweep):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(passkey_sweep.uri)
    for _, result in iter_results(passkey_sweep.sweep_dir):
        run_id = result.mlflow_run_id
        assert client.get_run(run_id).info.run_name.endswith("tiny_random · passkey 200,400")
        for name in ("retrieval_accuracy/depth_0.25", "retrieval_accuracy/all_depths", "kv_cache_bytes/by_length"):
            assert [m.step for m in client.get_metric_history(run_id, name)] == [200, 400]
        kv = {m.step: m.value for m in client.get_metric_history(run_id, "kv_cache_bytes/by_length")}
        assert kv[400] > kv[200] > 0
        artifacts = {a.path for a in client.list_artifacts(run_id, "retrieval")}
        assert artifacts == {"retrieval/answers.json", "retrieval/cells.json", "retrieval/retrieval_heatmap.png"}


@pytest.mark.slow  # one real sweep in a separate process, shared by these tests
def test_compare_shows_retrieval_and_draws_heatmaps_and_accuracy_against_kv_bytes(passkey_sweep):
    table = (passkey_sweep.sweep_dir / "compare.md").read_text()
    assert "retrieval" in table.splitlines()[2]
    by_length = table.split("## Passkey retrieval by context length")[1].strip().splitlines()
    assert all(name in by_length[0] for name in ("cache", "context tokens", "retrieval", "KV cache", "TPOT ms"))
    rows = [line for line in by_length[2:] if line.startswith("|")]
    assert len(rows) == 4 and sum(" 200 |" in row for row in rows) == 2 and all("KiB" in row for row in rows)
    for name in ("retrieval_heatmaps.png", "accuracy_vs_kv_bytes.png"):
        assert (passkey_sweep.sweep_dir / name).stat().st_size > 5000
    header = (passkey_sweep.sweep_dir / "compare.csv").read_text().splitlines()[0]
    assert "metrics.retrieval_accuracy" in header and "/" not in header.replace("params.", "")


def passkey_limit_term() -> str:
    """What the limits line calls --min-accuracy: every judging workload's term, passkey's among them."""
    from kvpipe.decide import limits

    return limits.accuracy_terms()


@pytest.mark.slow  # one real sweep in a separate process, shared by these tests
def test_recommend_with_min_accuracy_names_the_accuracy_a_run_lacks(passkey_sweep):
    proc = run_cli(["recommend", "--min-accuracy", "0.9"], cwd=passkey_sweep.launch_dir, timeout=120)
    # a random-weight model finds no key: nothing is recommended, and recommend says why
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"{passkey_limit_term()} ≥ 90%" in proc.stdout and "accuracy 0%, below 90%" in proc.stdout


def test_the_needle_preset_sweeps_dynamic_and_int4_int2_quanto_and_hqq_within_the_model():
    from kvpipe.jobspec import compose
    from kvpipe.orchestrate.sweep import count_jobs, swept_values

    cfg = compose(["+experiment=needle"], with_hydra=True)
    assert count_jobs(cfg) == 8
    assert swept_values(cfg)["backend.nbits"] == ["4", "2"] and swept_values(cfg)["backend"] == ["quanto", "hqq"]
    spec = spec_for("+experiment=needle", "cache=quantized", "backend=hqq", "backend.nbits=2")
    assert spec.workload.kind == "passkey" and spec.axis.layout == "kivi"
    assert max(spec.workload.context_tokens) + spec.workload.max_new_tokens <= 8192  # the embedded model's positions


@pytest.mark.slow  # the embedded model: 2 jobs x 3 prompts of 500 tokens, ~20 s on 2 cores
def test_a_lossless_cache_retrieves_at_least_as_often_as_int2_where_full_precision_retrieves(embedded_model):
    from kvpipe.job.runner import run_job

    settings = ("workload=passkey", "workload.context_tokens=500", "workload.trials=1", "workload.max_new_tokens=12")
    settings += ("workload.warmup=0", "quality=off", "tracking=off")
    dynamic = run_job(spec_for(*settings)).metrics["retrieval_accuracy"]
    int2 = run_job(spec_for(*settings, "cache=quantized", "backend.nbits=2")).metrics["retrieval_accuracy"]
    assert dynamic > 0.5, "full precision should find most keys at 500 tokens (it found 6 of 6 in the needle preset)"
    assert dynamic >= int2


def test_a_recorded_result_scores_again_from_its_answers_alone():
    """What record/ logs to MLflow (and `kvpipe sync` uploads long after) is made from result.json's rows."""
    from kvpipe.record.result import Result

    def row(depth, found):
        return {"context_tokens": 200, "depth": depth, "trial": 0, "repeat": 0, "key": "48213", "answer": "",
                "found": found, "ttft_ms": 2.0, "tpot_ms": 1.0, "kv_cache_bytes": 4096}  # fmt: skip

    rows = [row(0.25, True), row(0.75, False)]
    scored = Result(status="FINISHED", config={"workload": {"kind": "passkey"}}, answers=rows).scored()
    assert scored.values() == {"retrieval_accuracy": 0.5, "retrieval_answers": 2} and scored.rows == rows
    steps = {(step.series, step.step): step.value for step in scored.steps}
    assert steps[("retrieval_accuracy/all_depths", 200)] == 0.5 and steps[("retrieval_accuracy/depth_0.75", 200)] == 0
    assert set(scored.tables) == {"retrieval/answers.json", "retrieval/cells.json"}
    assert [(file.name, file.artifact_dir) for file in scored.files] == [("retrieval_heatmap.png", "retrieval")]
