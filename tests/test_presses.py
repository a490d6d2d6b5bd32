"""Eviction presses (press=streaming|knorm|snapkv): what each keeps, measured bytes equal to the
prediction for every press on dense and quantized layers and on sliding-window models, stock
parity with transformers' sliding-window layer, the press=none default leaving every key alone,
and bad input refused in one line before the model loads."""

from __future__ import annotations

import dataclasses

import optuna
import pytest
import torch
from optuna.distributions import CategoricalDistribution

from kvpipe import model as models
from kvpipe.cache import accounting, presses
from kvpipe.cache.presses._attention import window_queries
from kvpipe.cache.presses._layers import attach, attention_modules
from kvpipe.errors import ConfigError
from kvpipe.job.runner import run_job
from kvpipe.model.shape import ModelShape
from kvpipe.predict import bytes_plan as plan

from conftest import run_cli, spec_for

JOB = ("workload=long_context", "tracking=off", "quality=off", "workload.warmup=0", "workload.repeats=1")
EVICTING = [press for press in presses.registered() if press.evicts]
# every press as its own test_overrides make a quick job of it, and streaming's second mode: a fixed window
PRESSES = {
    **{press.name: (f"press={press.name}", *press.test_overrides) for press in EVICTING},
    "streaming window": ("press=streaming", "press.sinks=2", "press.window=9"),
}
CACHES = {
    "dynamic": ("cache=dynamic",),
    "quanto": ("cache=quantized", "backend=quanto", "backend.residual_length=3", "backend.q_group_size=32"),
    "hqq": (
        "cache=quantized",
        "backend=hqq",
        "backend.nbits=2",
        "backend.residual_length=2",
        "backend.q_group_size=32",
    ),
}
MODELS = {"llama-style": ("model=tiny_random",), "gemma3-style": ("model=tiny_sliding",)}


def predicted(spec, prompt_tokens: int, new_tokens: int) -> int:
    kv = accounting.kv_shape(models.read_shape(spec.model), spec.workload.batch_size, spec.model.dtype)
    return plan.predict_kv_bytes(spec, kv, prompt_tokens, new_tokens)


# ---- bytes: measured on real jobs, predicted to the byte ------------------------------------------


@pytest.mark.slow  # a real job per press and cache, on two model shapes
@pytest.mark.parametrize("shape", sorted(MODELS))
@pytest.mark.parametrize("new_tokens", [1, 7])
@pytest.mark.parametrize("press", sorted(PRESSES))
def test_every_press_prediction_equals_the_bytes_a_real_job_holds(press, shape, new_tokens):
    press_overrides = PRESSES[press]
    composes_with = spec_for(*JOB, *press_overrides).strategy.press.composes_with
    for cache, cache_overrides in CACHES.items():
        if spec_for(*JOB, *cache_overrides).strategy.press_layers not in composes_with:
            continue  # refused: see test_a_press_config_it_cannot_run_is_one_line_before_anything_loads
        spec = spec_for(*MODELS[shape], *JOB, "workload.prompt_tokens=40", f"workload.max_new_tokens={new_tokens}",
                        "workload.batch_size=2", *cache_overrides, *press_overrides)  # fmt: skip
        metrics = run_job(spec).metrics
        assert predicted(spec, 40, new_tokens) == metrics["kv_cache_bytes"], cache
        unpressed = spec_for(*MODELS[shape], *JOB, "workload.prompt_tokens=40", *cache_overrides,
                             f"workload.max_new_tokens={new_tokens}", "workload.batch_size=2")  # fmt: skip
        assert predicted(spec, 40, new_tokens) < predicted(unpressed, 40, new_tokens), cache


def test_a_press_keeps_its_ratios_share_of_the_prompt_in_full_layers_only():
    spec = spec_for("model=tiny_sliding", *JOB, "press=knorm", "press.ratio=0.75")
    strategy = spec.strategy
    assert strategy.press.kept(40) == 10  # 40 - floor(30)
    assert strategy.press.layer_tokens(40, 7) == 16  # then it grows as a DynamicLayer does
    kv = accounting.kv_shape(models.read_shape(spec.model), 1, "float32")
    dense = spec_for("model=tiny_sliding", *JOB).strategy.predict_kv_bytes(kv, 40, 7)
    # one full layer of three: it holds 16 of its 46 tokens; the two sliding ones are untouched
    assert dense - strategy.predict_kv_bytes(kv, 40, 7) == (46 - 16) * kv.token_bytes()


def test_streaming_holds_its_budget_however_long_it_decodes():
    press = spec_for(*JOB, "press=streaming", "press.sinks=4", "press.window=32").strategy.press
    assert [press.layer_tokens(100, new) for new in (1, 2, 50)] == [35, 35, 35]
    assert press.layer_tokens(20, 10) == 29  # below its budget it grows as DynamicLayer does


# ---- what each press keeps ----------------------------------------------------------------------


class Attention(torch.nn.Module):
    """A one-layer model's attention: its forward hands the prompt's keys and values to the cache, as a
    model's attention does, and the press's hook runs after it."""

    layer_idx = 0

    def forward(self, keys, values, cache):
        return cache.layers[0].update(keys, values), None


def _layer_pair(window: int, sinks: int = 0):
    """A streaming layer and transformers' sliding layer, and how to prefill ours."""
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    cache, attention = type("Cache", (), {})(), Attention()
    cache.layers = [DynamicLayer()]
    press = spec_for(*JOB, "press=streaming", f"press.sinks={sinks}", f"press.window={window}").strategy.press
    ours = attach(press, cache, attention).layers[0]

    def prefill(keys, values):
        return attention(keys, values, cache=cache)

    return ours, DynamicSlidingWindowLayer(sliding_window=window), prefill


@pytest.mark.parametrize("window", [5, 12])
def test_streaming_with_no_sinks_keeps_exactly_what_transformers_sliding_layer_keeps(window):
    ours, stock, prefill = _layer_pair(window)
    torch.manual_seed(0)
    prompt = torch.randn(2, 2, 20, 8), torch.randn(2, 2, 20, 8)
    prefill(*prompt), stock.update(*prompt)
    assert torch.equal(ours.keys, stock.keys) and torch.equal(ours.values, stock.values)
    for _ in range(15):
        step = torch.randn(2, 2, 1, 8), torch.randn(2, 2, 1, 8)
        seen_by_ours, seen_by_stock = ours.update(*step), stock.update(*step)
        assert torch.equal(seen_by_ours[0], seen_by_stock[0])  # what the step attends to
        assert torch.equal(ours.keys, stock.keys) and torch.equal(ours.values, stock.values)


def test_streaming_keeps_its_sinks_while_the_window_moves():
    ours, _, prefill = _layer_pair(window=4, sinks=3)
    keys = torch.arange(10.0).view(1, 1, 10, 1)
    prefill(keys, keys)
    for token in range(10, 14):
        ours.update(torch.full((1, 1, 1, 1), float(token)), torch.full((1, 1, 1, 1), float(token)))
    assert ours.keys.flatten().tolist() == [0, 1, 2, 11, 12, 13]  # 3 sinks + window - 1 recent


def test_knorm_drops_the_keys_with_the_largest_norm():
    press = spec_for(*JOB, "press=knorm", "press.ratio=0.5").strategy.press
    keys = torch.tensor([3.0, 1.0, 4.0, 0.5, 2.0, 6.0]).view(1, 1, 6, 1)
    assert press.keep(None, None, keys, keys, None, None).flatten().tolist() == [1, 3, 4]


def test_snapkv_keeps_what_its_window_attends_to_and_the_window_itself():
    press = spec_for(*JOB, "press=snapkv", "press.ratio=0.5", "press.window=2", "press.kernel=1").strategy.press
    keys = torch.zeros(1, 1, 8, 4)
    keys[0, 0, 2] = torch.tensor([0.0, 0.0, 9.0, 0.0])  # the token the window's queries point at
    hidden = torch.zeros(1, 8, 4)
    hidden[0, -2:, 2] = 1.0  # the window's queries, through an identity q_proj and no rotation
    module = type("Attention", (), {"scaling": 1.0, "head_dim": 4, "q_proj": torch.nn.Identity()})()
    unrotated = torch.ones(1, 8, 4), torch.zeros(1, 8, 4)
    kept = press.keep(module, hidden, keys, keys, None, unrotated).flatten().tolist()
    assert kept[:1] == [2] and kept[-2:] == [6, 7]


@pytest.mark.parametrize("shape", sorted(MODELS))
def test_snapkv_scores_with_the_attentions_own_queries(shape):
    """The queries the hook rebuilds equal the ones the attention module computes itself."""
    spec = spec_for(*MODELS[shape], *JOB)
    loaded = models.load(spec.model)
    module = attention_modules(loaded.model)[max(attention_modules(loaded.model))]
    captured = {}

    def capture(module, args, kwargs):
        captured.update(kwargs)

    handle = module.register_forward_pre_hook(capture, with_kwargs=True)
    ids = torch.randint(0, 1000, (1, 24))
    with torch.inference_mode():
        loaded.model(input_ids=ids)
    handle.remove()
    hidden, (cos, sin) = captured["hidden_states"], captured["position_embeddings"]
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    batch, tokens = hidden.shape[:2]
    with torch.inference_mode():
        full = module.q_proj(hidden).view(batch, tokens, -1, module.head_dim).transpose(1, 2)
        full = module.q_norm(full) if hasattr(module, "q_norm") else full
        full, _ = apply_rotary_pos_emb(full, full, cos, sin)
        # float32's tolerance: the window's matmul may block differently from the whole prompt's (threads)
        torch.testing.assert_close(window_queries(module, hidden, (cos, sin), 6), full[:, :, -6:])


def test_every_model_type_snapkv_reads_projects_queries_and_rotates_them():
    import importlib
    import inspect

    for model_type in presses.get("snapkv").QUERY_MODELS:
        module = importlib.import_module(f"transformers.models.{model_type.removesuffix('_text')}.modeling_"
                                         f"{model_type.removesuffix('_text')}")  # fmt: skip
        attention = [c for n, c in vars(module).items() if n.endswith("Attention") and inspect.isclass(c)]
        source = inspect.getsource(attention[0])
        assert "self.q_proj" in source and "apply_rotary_pos_emb" in source, model_type


# ---- every registered press, as its own test_overrides make a quick job of it ---------------------


def prefill_under(spec, prompt_tokens: int = 40, batch: int = 2) -> list[dict]:
    """A prefill of random tokens through the spec's pressed cache: for each full-attention layer, the
    scores its press gave, the indices it kept, the prompt's keys and the keys the layer then holds."""
    loaded, strategy, seen = models.load(spec.model), spec.strategy, []
    press, cache = strategy.press, strategy.setup(loaded, prompt_tokens).make_cache()
    score, keep = press.score, press.keep

    def scoring(module, hidden_states, keys, *rest):
        seen.append({"scores": score(module, hidden_states, keys, *rest), "keys": keys})
        return seen[-1]["scores"]

    def keeping(module, hidden_states, keys, *rest):
        seen[-1]["kept"] = keep(module, hidden_states, keys, *rest)
        seen[-1]["budget"] = press.kept_in(module, keys.shape[-2])  # kept(prompt), or this layer's own
        return seen[-1]["kept"]

    press.score, press.keep = scoring, keeping
    with torch.inference_mode():
        loaded.model(input_ids=torch.randint(0, 1000, (batch, prompt_tokens)), cache=cache, use_cache=True)
    full = [layer for layer in cache.layers if not getattr(layer, "is_sliding", False)]
    assert len(seen) == len(full) > 0
    return [{**layer_seen, "held": layer.keys} for layer_seen, layer in zip(seen, full)]


def assert_each_layer_keeps_its_protected_and_highest_scored(press, layers: list[dict], prompt_tokens: int) -> None:
    """Each layer holds the `kept(prompt)` tokens its press chose: the protected ones, and none scored
    lower than a token it dropped."""
    first, last = press.protected(prompt_tokens)
    protected = torch.zeros(prompt_tokens, dtype=torch.bool)
    protected[:first], protected[prompt_tokens - last :] = True, True
    for layer in layers:
        kept, keys, scores = layer["kept"], layer["keys"], layer["scores"].float()
        assert layer["held"].shape[-2] == kept.shape[-1] == layer["budget"]
        assert torch.equal(layer["held"], keys.gather(2, kept.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1])))
        is_kept = torch.zeros(scores.shape, dtype=torch.bool).scatter(-1, kept, True)
        assert is_kept[..., protected].all()
        lowest_kept = scores.masked_fill(~is_kept | protected, float("inf")).amin(dim=-1)
        highest_dropped = scores.masked_fill(is_kept, float("-inf")).amax(dim=-1)
        assert (lowest_kept >= highest_dropped).all()


@pytest.mark.parametrize("name", [press.name for press in EVICTING])
def test_every_press_keeps_in_each_full_layer_its_protected_tokens_and_the_highest_scored(name):
    spec = spec_for("model=tiny_random", *JOB, f"press={name}", *presses.get(name).test_overrides)
    assert_each_layer_keeps_its_protected_and_highest_scored(spec.strategy.press, prefill_under(spec, 40), 40)


def test_a_press_reads_the_prompt_through_one_hook_per_layer_gone_once_the_prompt_is_read():
    spec = spec_for("model=tiny_random", *JOB, "press=knorm")
    loaded, strategy = models.load(spec.model), spec.strategy
    modules = attention_modules(loaded.model).values()
    before = [len(module._forward_hooks) for module in modules]
    cache = strategy.setup(loaded, 40).make_cache()
    assert [len(module._forward_hooks) for module in modules] == [hooks + 1 for hooks in before]
    with torch.inference_mode():
        loaded.model(input_ids=torch.randint(0, 1000, (1, 40)), cache=cache, use_cache=True)
    assert [len(module._forward_hooks) for module in modules] == before  # decoding pays nothing for it


@pytest.mark.slow  # a real job per press
@pytest.mark.parametrize("name", [press.name for press in EVICTING])
def test_every_press_makes_a_quick_job_of_its_test_overrides_on_the_default_workload(name):
    harness = ("tracking=off", "quality=off", "workload.warmup=0", "workload.repeats=1", "workload.max_new_tokens=4")
    pressed = run_job(spec_for("model=tiny_random", *harness, f"press={name}", *presses.get(name).test_overrides))
    plain = run_job(spec_for("model=tiny_random", *harness))
    assert 0 < pressed.metrics["kv_cache_bytes"] < plain.metrics["kv_cache_bytes"]


# ---- generation and quality through a press -----------------------------------------------------


def test_a_press_that_keeps_everything_generates_what_the_dynamic_cache_does():
    spec = spec_for("model=tiny_random", *JOB, "workload.prompt_tokens=40", "workload.max_new_tokens=8")
    plain = run_job(spec)
    for press in (("press=knorm", "press.ratio=0"), ("press=snapkv", "press.ratio=0", "press.window=8")):
        pressed = run_job(spec_for("model=tiny_random", *JOB, "workload.prompt_tokens=40",
                                   "workload.max_new_tokens=8", *press))  # fmt: skip
        assert pressed.metrics["kv_cache_bytes"] == plain.metrics["kv_cache_bytes"]
        assert pressed.texts == plain.texts, press


@pytest.mark.slow  # a real job with its quality pass
def test_a_pressed_dynamic_cache_is_scored_not_taken_for_the_reference():
    base = ("model=tiny_random", "workload=long_context", "tracking=off", "workload.warmup=0", "workload.repeats=1",
            "workload.prompt_tokens=48", "workload.max_new_tokens=4", "quality.scored_tokens=8")  # fmt: skip
    plain = run_job(spec_for(*base)).metrics
    pressed = run_job(spec_for(*base, "press=knorm", "press.ratio=0.75")).metrics
    assert plain["kl_vs_reference"] == 0.0
    assert pressed["kl_vs_reference"] > 0.0  # the reference's own scores are never reused for it


# ---- the default, keys and labels ---------------------------------------------------------------


def test_press_none_leaves_the_key_params_and_result_unchanged():
    plain, explicit = spec_for(*JOB), spec_for(*JOB, "press=none")
    assert plain.press is None and explicit.press is None
    assert plain.measurement_key() == explicit.measurement_key()
    assert not any(name.startswith("press.") for name in plain.params())
    assert "press" not in plain.as_dict()


def test_each_press_and_ratio_is_its_own_measurement():
    keys = {
        spec_for(*JOB, *press).measurement_key()
        for press in (("press=knorm",), ("press=knorm", "press.ratio=0.25"), ("press=snapkv",), ("press=streaming",))
    }
    assert len(keys) == 4 and spec_for(*JOB).measurement_key() not in keys


def test_streaming_warns_of_press_ratio_only_where_the_user_gave_it():
    from kvpipe.jobspec import spec_from

    window = ("model=tiny_random", "press=streaming", "press.window=16")
    assert spec_from(window).warnings == ()  # the YAML's ratio is no setting of the user's
    warned = spec_from((*window, "press.ratio=0.25")).warnings
    assert warned == ("press.ratio=0.25 is ignored: press.window=16 sets what streaming keeps",)


def test_a_press_is_named_in_the_label_and_the_command_that_measures_it_again():
    spec = spec_for(*JOB, "cache=quantized", "press=snapkv", "press.ratio=0.25")
    assert "axis=kivi press=snapkv press.ratio=0.25 " in spec.strategy.describe()
    assert spec.params()["press.window"] == "64"
    assert not spec.strategy.lossless and spec.strategy.quality_batching() != "padded"
    assert spec_for(*JOB, "press=knorm").strategy.quality_batching() == "equal_length"


# ---- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides,field,hint",
    [
        (("press=knorm", "press.ratio=1.0"), "press.ratio", "up to (not including) 1"),
        (("press=snapkv", "press.ratio=-0.1"), "press.ratio", "from 0"),
        (("press=streaming", "press.window=0"), "press.window", "positive"),
        (("press=snapkv", "press.kernel=4"), "press.kernel", "odd"),
        (("press=knorm", "cache=static"), "press.name", "cache=dynamic or cache=quantized"),
        (("press=streaming", "cache=quantized"), "press.name", "expected cache=dynamic"),
        (("press=knorm", "cache=offloaded"), "press.name", "evicting would free nothing"),
        (("press=knorm", "load=concurrency", "press.protocol=query_agnostic"), "press.protocol", "load=null"),
        (("press=knorm", "cache=paged", "load=concurrency"), "press.name", "expected cache=dynamic"),
        (("press.name=no_such_press",), "press.name", "knorm"),
    ],
)
def test_a_press_config_it_cannot_run_is_one_line_before_anything_loads(overrides, field, hint):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")) as caught:
        spec_for(*JOB, *overrides)
    assert hint in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "overrides,field,hint",
    [
        (("press=streaming", "press.window=500"), "press.window", "at most the shortest prompt, 100 tokens"),
        (("press=streaming", "press.sinks=10", "press.window=95"), "press.sinks", "expected at most 5 sinks"),
        (("press=snapkv", "press.window=100"), "press.window", "fewer than the shortest prompt's 100 tokens"),
        (("press=knorm", "model.sliding_window=16"), "press.name", "every layer of this model slides"),
    ],
)
def test_a_press_that_does_not_fit_the_prompts_or_model_exits_2_before_the_model_loads(
    overrides, field, hint, tmp_path
):
    proc = run_cli(["model=tiny_random", "workload=long_context", "workload.prompt_tokens=100", "quality=off",
                    *overrides], cwd=tmp_path)  # fmt: skip
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and field in lines[0] and hint in lines[0], proc.stderr
    assert not (tmp_path / "outputs" / "mlflow.db").exists()


def test_snapkv_on_attention_kvpipe_cannot_read_queries_from_is_refused():
    strategy = spec_for(*JOB, "press=snapkv").strategy
    shape = ModelShape(num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, max_positions=64, model_type="phi3")
    with pytest.raises(ConfigError, match="press=snapkv recomputes the prompt's queries.*not phi3's"):
        strategy.check_for_model(shape, 32)
    spec_for(*JOB, "press=knorm").strategy.check_for_model(shape, 32)  # key norms need no queries


def test_padded_batches_are_refused_for_a_press():
    with pytest.raises(ConfigError, match="workload.batch_size=1"):
        spec_for(*JOB, "press=knorm").strategy.check_prompts(30, padded=True)


def test_the_press_schema_has_every_presss_settings_and_the_common_ones():
    from kvpipe.jobspec import schema

    settings = {field.name for press in presses.registered() for field in dataclasses.fields(press.Settings)}
    common = {field.name for field in dataclasses.fields(presses.Common)}
    assert {f.name for f in dataclasses.fields(schema.PressConfig)} == {"name", *common, *settings}


# ---- the search: presses as one more family, walked from the safest ratio -----------------------


def test_a_search_walks_each_press_from_its_smallest_ratio_and_infers_what_lies_beyond_a_miss():
    from kvpipe.orchestrate.search.frontier import inferred_misses, safer_neighbours
    from kvpipe.orchestrate.search.space import build

    space = build(64, "cpu", {"press": ["knorm", "snapkv"]})
    by_label = {p.label(): p for p in space.points}
    half = by_label["cache=dynamic press=knorm press.ratio=0.5"]
    assert [p.label() for p in safer_neighbours(space, half)] == ["cache=dynamic press=knorm press.ratio=0.25"]
    missed = {by_label["cache=dynamic press=knorm press.ratio=0.25"]: [1e6, 10.0, 0.9]}
    inferred = {p.label() for p in inferred_misses(space, missed, quality_limit=0.1)}
    assert inferred == {f"cache=dynamic press=knorm press.ratio={r}" for r in (0.5, 0.75)}  # snapkv is its own family


def test_a_search_leaves_out_a_press_the_model_cannot_take_and_says_why():
    from kvpipe.orchestrate.search.space import build

    shape = ModelShape(num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, max_positions=64, model_type="phi3")
    space = build(16, "cpu", shape=shape)
    assert not any(p.get("press") == "snapkv" for p in space.points)
    assert any(p.get("press") == "knorm" for p in space.points)
    assert any(line.startswith("press=snapkv (press=snapkv recomputes") for line in space.left_out)


# ---- plan ------------------------------------------------------------------------------------------


def test_plan_has_a_row_per_press_or_the_jobs_press_on_each_cache_it_composes_with():
    spec = spec_for("model=tiny_sliding", *JOB)
    shape = models.read_shape(spec.model)
    labels = [label for label, _ in plan.variants(spec, shape)]
    assert labels[-len(EVICTING) :] == [f"dynamic + {press.name}0.5" for press in EVICTING]
    assert not any("+ " in label for label in labels[: -len(EVICTING)])  # every other row unpressed, as before
    chosen = spec_for("model=tiny_sliding", *JOB, "press=snapkv", "press.ratio=0.25")
    rows = dict(plan.variants(chosen, shape))
    assert [label for label in rows if "snapkv" in label] == ["dynamic + snapkv0.25", "quanto int4 kivi + snapkv0.25"]
    kv = accounting.kv_shape(shape, 1, "float32")
    assert rows["dynamic + snapkv0.25"].strategy.predict_kv_bytes(kv, 100, 8) == chosen.strategy.predict_kv_bytes(
        kv, 100, 8
    )


# ---- compare and recommend ----------------------------------------------------------------------


def _pressed_runs():
    from test_compare import fake_runs

    dynamic = {"cache": "dynamic", "tpot_ms": 40.0, "peak_mib": 900}
    quanto = {"backend.name": "quanto", "backend.nbits": "4", "axis.layout": "kivi"}
    int4 = {"cache": "quantized:quanto:int4:kivi", "tpot_ms": 55.0, "peak_mib": 520, "kl": 0.006, "params": quanto}
    snapkv = {"cache": "dynamic+snapkv0.5", "tpot_ms": 41.0, "peak_mib": 700, "kl": 0.02,
              "params": {"press.name": "snapkv", "press.ratio": "0.5", "press.window": "64"}}  # fmt: skip
    both = {"cache": "quantized:quanto:int4:kivi+snapkv0.5", "tpot_ms": 58.0, "peak_mib": 480, "kl": 0.03,
            "params": {**quanto, "press.name": "snapkv", "press.ratio": "0.5", "press.window": "64"}}  # fmt: skip
    unscored = {"cache": "dynamic+knorm0.5", "tpot_ms": 39.0, "peak_mib": 650,
                "params": {"press.name": "knorm", "press.ratio": "0.5"}}  # fmt: skip
    return fake_runs(dynamic, int4, snapkv, both, unscored)


def test_compare_sets_each_run_in_its_family_and_never_assumes_an_evicted_cache_lossless():
    runs = _pressed_runs()
    assert list(runs["family"]) == ["full precision", "quantization", "eviction", "quantization + eviction", "eviction"]
    assert runs["quality_loss"].isna().tolist() == [False, False, False, False, True]  # no KL: not known to be 0
    assert runs["workload"].nunique() == 1  # a press is a cache setting: one front, not a workload per press


@pytest.mark.slow  # draws and writes compare's plots (~3 s)
def test_compare_draws_the_front_of_quality_against_kv_bytes_when_a_run_evicted(tmp_path):
    from kvpipe.decide import compare

    runs = _pressed_runs().assign(**{"metrics.kv_cache_bytes": [4e7, 7e6, 2e7, 4e6, 2e7]})
    written = compare.write_outputs(runs, tmp_path, "presses")
    assert tmp_path / "quality_vs_kv_bytes.png" in written and (tmp_path / "quality_vs_kv_bytes.png").stat().st_size


@pytest.mark.parametrize(
    "memory_mib,expected", [(600, "quantized:quanto:int4:kivi"), (500, "quantized:quanto:int4:kivi+snapkv0.5")]
)
def test_recommend_can_answer_int4_alone_or_with_a_press_whichever_the_limits_pick(memory_mib, expected):
    from kvpipe.decide.limits import Limits
    from kvpipe.decide.recommend import choose, use_command

    run, _ = choose(_pressed_runs(), Limits(memory_mib * 2**20, 60, 0.05))
    assert run["label"] == expected
    if "snapkv" in expected:
        assert "press=snapkv" in use_command(run)


def test_a_space_narrowed_to_a_backend_and_presses_holds_both_families_and_no_other():
    from kvpipe.orchestrate.search.space import build

    labels = [p.label() for p in build(64, "cpu", {"backend": ["quanto"], "press": ["snapkv"]}).points]
    assert any(label.startswith("cache=quantized backend=quanto") for label in labels)
    assert [label for label in labels if "press" in label] == [
        f"cache=dynamic press=snapkv press.ratio={ratio}" for ratio in (0.25, 0.5, 0.75)
    ]
    assert all("backend=quanto" in label or "press=snapkv" in label for label in labels)


def test_snapkv_keeps_what_the_models_own_attention_weights_rank_highest():
    """kvpress's reading of SnapKV from the attention weights an eager forward returns, layer by layer,
    equals what kvpipe's press keeps, from those weights and from the queries it recomputes without them
    (as under sdpa)."""
    import torch.nn.functional as F

    spec = spec_for("model=tiny_sliding", *JOB, "model.attn_implementation=eager", "press=snapkv",
                    "press.ratio=0.5", "press.window=8", "press.kernel=3")  # fmt: skip
    loaded = models.load(spec.model)
    strategy, kept, recomputed = spec.strategy, [], []
    press, cache = strategy.press, strategy.setup(loaded, 40).make_cache()
    original = press.keep

    def keep(module, hidden, keys, values, attentions, position_embeddings):
        assert attentions is not None  # eager returns them
        recomputed.append(original(module, hidden, keys, values, None, position_embeddings))
        kept.append(original(module, hidden, keys, values, attentions, position_embeddings))
        return kept[-1]

    press.keep = keep
    ids = torch.randint(0, 1000, (2, 40))
    with torch.inference_mode():
        attentions = loaded.model(input_ids=ids, cache=cache, use_cache=True, output_attentions=True).attentions
    full = [index for index, layer in enumerate(cache.layers) if not layer.is_sliding]
    assert len(kept) == len(full) == 1
    weights = attentions[full[0]][..., -8:, :-8].float().mean(dim=-2)
    scores = F.avg_pool1d(weights, kernel_size=3, padding=1, stride=1).view(2, 2, 2, 32).mean(2)
    scores = F.pad(scores, (0, 8), value=scores.max().item() + 1)
    assert torch.equal(scores.topk(20, dim=-1).indices.sort(dim=-1).values, kept[0])
    assert torch.equal(recomputed[0], kept[0])


def test_a_press_setting_is_blank_for_runs_without_a_press_and_not_a_varying_column():
    from kvpipe.decide.runs import param_values, varying_params

    from test_compare import fake_runs

    runs = fake_runs(
        {"cache": "dynamic"},
        {"cache": "dynamic+snapkv0.5", "params": {"press.name": "snapkv", "press.ratio": "0.5", "press.kernel": "5"}},
    )
    assert param_values(runs, "press.kernel") == ["", "5"]
    assert "press.kernel" not in varying_params(runs)


def test_compression_is_against_the_whole_fp16_cache_the_press_shrinks():
    job = ("model=tiny_random", *JOB, "workload.prompt_tokens=40", "workload.max_new_tokens=8")
    plain, pressed = (run_job(spec_for(*job, *press)).metrics for press in ((), ("press=knorm", "press.ratio=0.5")))
    assert pressed["kv_cache_bytes_fp16"] == plain["kv_cache_bytes_fp16"]
    assert pressed["kv_compression"] == pytest.approx(plain["kv_compression"] * (40 + 7) / (20 + 7))


def test_the_walk_measures_every_kind_once_before_walking_any_further():
    """Quantized caches hold fewer bytes than any press at its safest ratio, so the front's optimism
    alone would never ask for a press: each backend and each press is measured once first."""
    from kvpipe.orchestrate.search.frontier import FrontierSampler, kind
    from kvpipe.orchestrate.search.space import build

    the_space = build(
        64, "cpu", {"cache": ["dynamic", "quantized"], "backend": ["quanto", "hqq"], "backend.nbits": ["2", "4"],
                    "axis": ["kivi"], "backend.q_group_size": ["64"], "backend.residual_length": ["128"],
                    "press": ["knorm", "snapkv"]}
    )  # fmt: skip

    def figures(point) -> list[float]:
        if point.get("press"):
            return [3.4e6 * (1 - float(point.get("press.ratio"))), 60.0, 0.01]
        if point.get("backend"):
            return [3.4e6 * int(point.get("backend.nbits")) / 16, 80.0, 0.01]
        return [3.4e6, 60.0, 0.0]

    sampler = FrontierSampler(the_space, lambda p: figures(p)[0], 0.05)
    study = optuna.create_study(directions=["minimize"] * 3, sampler=sampler)
    distributions = {n: CategoricalDistribution(v) for n, v in the_space.choices().items()}
    chosen = []
    for _ in range(5):
        trial = study.ask(distributions)
        point = the_space.decode(trial.params)
        study.tell(trial, figures(point))
        chosen.append(point)
    assert chosen[0].label() == "cache=dynamic"
    assert {kind(p) for p in chosen[1:]} == {("quanto", None), ("hqq", None), (None, "knorm"), (None, "snapkv")}
    assert all(p.get("press.ratio") in (None, "0.25") for p in chosen)  # each press from its safest ratio


def test_a_search_names_the_kinds_its_budget_did_not_reach():
    from kvpipe.orchestrate.search.space import build
    from kvpipe.orchestrate.search.trial_log import unexplored

    points = build(64, "cpu", {"backend": ["quanto", "hqq"], "press": ["knorm", "snapkv"]}).points
    quanto = next(p for p in points if p.get("backend") == "quanto")
    assert unexplored(points, [quanto]) == ["backend=hqq", "press=knorm", "press=snapkv"]
    assert unexplored(points, points) == []


def test_a_kv_budget_bounds_the_cache_alone_and_can_pick_an_evicted_or_quantized_one():
    from kvpipe.decide.limits import limits_from
    from kvpipe.decide.recommend import choose

    runs = _pressed_runs().assign(**{"metrics.kv_cache_bytes": [4.6e7, 8.4e6, 2.3e7, 4.9e6, 2.3e7]})
    limits = limits_from(kv_budget="10MiB", max_tpot_ms=60)
    assert "KV cache ≤ 10.0 MiB" in limits.describe()
    run, _ = choose(runs, limits)
    assert run["label"] == "quantized:quanto:int4:kivi"  # the fastest within 10 MiB, though its peak is not the least
