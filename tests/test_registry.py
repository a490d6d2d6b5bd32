"""One place per strategy: a strategy defined here, in ~20 lines, flows through every stage with no
other module changed: validated, run, predicted by `kvpipe plan`, shown by compare, considered by
recommend. And no module outside kvpipe/cache spells a strategy's or a backend's name."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvpipe import cache, cli
from kvpipe.cache.accounting import dense_bytes, kv_shape
from kvpipe.cache.base import REGISTRY, CacheSetup, CacheStrategy
from kvpipe.decide import recommend
from kvpipe.decide import runs as recorded
from kvpipe.decide.limits import Limits
from kvpipe.decide.recommend import choose
from kvpipe.errors import ConfigError
from kvpipe.job.runner import run_job
from kvpipe.jobspec import make_spec, register_schemas
from kvpipe.model import read_shape

from conftest import REPO, TINY, compose_config, quoted_outside
from test_compare import fake_runs


@pytest.fixture
def toy():
    """A StaticCache with `headroom` spare tokens past prompt + new tokens: a new setting, a check,
    a cache, a byte prediction and a recommend family, all in one class."""

    class Headroom(CacheStrategy):
        name = "headroom"
        family = "static"
        order = 25

        @dataclass
        class Settings:
            headroom: int = 16

        def check(self, overridden=frozenset()):
            if self.settings.headroom < 0:
                raise ConfigError("cache.headroom", self.settings.headroom, "expected 0 or more")
            return super().check(overridden)

        def build(self, loaded, longest_prompt):
            from transformers import StaticCache

            length = longest_prompt + self.choice.max_new_tokens + self.settings.headroom

            def make(capacity=0):
                return StaticCache(config=loaded.model.config, max_cache_len=max(length, capacity))

            return CacheSetup(self.name, self.name, make, {"disable_compile": True})

        def predict_kv_bytes(self, kv, prompt_tokens, new_tokens):
            return dense_bytes(kv, prompt_tokens + new_tokens + self.settings.headroom)

    register_schemas()  # the cache schema gains `headroom`
    yield Headroom
    del REGISTRY["headroom"]
    register_schemas()


def toy_spec(*overrides: str):
    return make_spec(compose_config([*TINY, "cache.strategy=headroom", *overrides]))


@pytest.mark.slow  # real jobs
def test_a_new_strategy_is_validated_from_its_own_settings(toy):
    assert toy_spec("cache.headroom=4").strategy.settings.headroom == 4
    with pytest.raises(ConfigError, match=r"cache.headroom=-1 .*expected 0 or more"):
        toy_spec("cache.headroom=-1")
    assert toy_spec("cache.headroom=4").measurement_key() != toy_spec("cache.headroom=5").measurement_key()
    # Other strategies ignore the new setting, with a warning, and measure the same as without it.
    dynamic = make_spec(compose_config([*TINY, "cache.headroom=4"]))
    assert "cache.headroom is ignored by cache=dynamic" in dynamic.warnings
    assert dynamic.measurement_key() == make_spec(compose_config(list(TINY))).measurement_key()


def test_a_new_strategy_runs_and_its_prediction_equals_the_measured_bytes(toy):
    spec = toy_spec("cache.headroom=4", "workload=long_context", "workload.prompt_tokens=30")
    result = run_job(spec)
    assert result.tags["cache.effective"] == "headroom"
    kv = kv_shape(read_shape(spec.model), 1, "float32")
    assert result.metrics["kv_cache_bytes"] == spec.strategy.predict_kv_bytes(kv, 30, 6) == dense_bytes(kv, 40)


def test_plan_shows_a_row_for_a_new_strategy(toy, capsys):
    assert cli.subcommand(["plan", "model=tiny_random", "cache.headroom=4", "--context", "100", "--device", "cpu"]) == 0
    rows = {line.split("│")[1].strip(): line for line in capsys.readouterr().out.splitlines() if line.count("│") > 2}
    assert "headroom" in rows and "dynamic" in rows
    assert list(rows).index("headroom") == list(rows).index("static") + 1  # its `order`


def test_compare_and_recommend_consider_a_new_strategy(toy):
    runs = fake_runs(
        {"cache": "dynamic", "tpot_ms": 40.0},
        {"cache": "headroom", "tpot_ms": 30.0, "params": {"cache.headroom": 4}},
    )
    assert recorded.param_values(runs, "cache.headroom") == ["", "4"]  # dynamic does not read it
    assert list(runs["quality_loss"]) == [0.0, 0.0]  # lossless, from the class
    chosen, (what, why) = choose(runs, Limits(memory_bytes=8 * 2**30))
    assert chosen["label"] == "headroom" and "fixed cache pays off" in why  # weighed as its family: static
    assert recommend.use_command(chosen) == "python -m kvpipe cache=headroom cache.headroom=4"


def test_unknown_strategy_names_the_registered_ones(toy):
    with pytest.raises(ConfigError, match="cache.strategy='nope'.*dynamic, static, headroom, offloaded"):
        make_spec(compose_config([*TINY, "cache.strategy=nope"]))


# Where strategy and backend names may appear: their own modules and the config files; and an engine's
# module, whose own flag values may spell one (vLLM's `--kv-cache-dtype fp8` is vLLM's word, not kvpipe's
# fp8 backend: an engine builds none of kvpipe's caches, which kvpipe.jobspec refuses beside it)
OWNERS = ("kvpipe/cache/", "kvpipe/engine/")
NAMES = [*cache.names(), *cache.backends.names()]


def test_no_module_outside_the_cache_stage_names_a_strategy_or_backend():
    offenders = quoted_outside(OWNERS, NAMES)
    assert offenders == [], "\n".join(offenders)


def test_every_cache_and_backend_option_file_names_a_registered_class():
    for registry in (cache.CacheStrategy.registry, cache.backends.QuantBackend.registry):
        for option in sorted(Path(REPO / "conf" / registry.group).glob("*.yaml")):
            match = re.search(rf"^{registry.key}: (\w+)", option.read_text(), re.MULTILINE)
            assert match and match.group(1) in registry.names(), option


def test_the_registry_helper_registers_by_subclassing_in_order_and_refuses_unknown_names_in_one_line():
    from kvpipe.registry import Registered, Registry

    class Kind(Registered):
        registry = Registry("thing.kind")

    class Shared(Kind):  # names nothing: a base for others, not a choice
        order = 5

    class Later(Shared):
        name = "later"

    class Early(Kind):
        name, order = "early", 1

    class Alpha(Kind):
        name = "alpha"

    assert Kind.registry.names() == ("early", "later", "alpha")  # by order (Later's is Shared's), then name
    assert Kind.registry.get("later") is Later and Shared not in Kind.registry.registered()
    with pytest.raises(ConfigError, match=r"^thing.kind='nope' is not valid: expected one of: early, later, alpha$"):
        Kind.registry.get("nope")
    assert cache.REGISTRY is cache.CacheStrategy.registry.classes and "dynamic" in cache.REGISTRY  # the stages' own
