"""kvpipe from Python, for people who would rather not shell out: the cache kvpipe measured, built for
your own loaded model, and the guide's out-of-memory fallback around your own `generate` call.

    from kvpipe import api

    inputs = tokenizer(prompt, return_tensors="pt").to(model.device)
    kwargs = api.cache_kwargs(model, "cache=quantized backend=quanto backend.nbits=4 axis=kivi",
                              prompt_tokens=inputs["input_ids"].shape[1], max_new_tokens=64)
    output = model.generate(**inputs, max_new_tokens=64, **kwargs)

    output, record = api.generate_with_fallback(model, "cache=static", max_new_tokens=64, **inputs)

The settings are kvpipe's overrides, exactly as `kvpipe recommend` prints them after `use:`, and are
checked as a run checks them (one-line errors naming the field and the valid choices).
"""

from __future__ import annotations

import shlex
from typing import Any, Sequence

from kvpipe._startup import prepare
from kvpipe.errors import KvpipeError
from kvpipe.jobspec import Spec, compose, make_spec, override_group
from kvpipe.model.loading import LoadedModel, model_bytes
from kvpipe.model.shape import shape_from_model_config

# Settings that choose the cache; the model is yours, and kvpipe's model, workload and tracking
# settings mean nothing here.
CACHE_GROUPS = ("cache", "backend", "axis", "fallback")


def settings(overrides: str | Sequence[str] = "", max_new_tokens: int = 32) -> Spec:
    """The validated cache settings from kvpipe overrides ("cache=static cache.compile=true")."""
    prepare()
    words = shlex.split(overrides) if isinstance(overrides, str) else list(overrides)
    unused = [w for w in words if override_group(w) not in CACHE_GROUPS]
    if unused:
        raise KvpipeError(
            f"{' '.join(unused)}: not a cache setting; expected overrides of {', '.join(CACHE_GROUPS)} "
            "(the model is the one you pass)"
        )
    return make_spec(compose([*words, f"workload.max_new_tokens={max_new_tokens}"]), words)


def wrap(model, tokenizer=None) -> LoadedModel:
    """Your transformers model as kvpipe's runner sees one (shape from its config, device, dtype)."""
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        shape=shape_from_model_config(model.config),
        device=model.device.type,
        dtype=str(model.dtype).removeprefix("torch."),
        load_s=0.0,
        weights_bytes=model_bytes(model),
    )


def cache_kwargs(model, overrides: str | Sequence[str] = "", *, prompt_tokens: int, max_new_tokens: int) -> dict:
    """Keyword arguments for `model.generate` that apply the configured cache: `cache`, a fresh cache
    object built as kvpipe's runner builds it (sized for prompt + new tokens where it preallocates),
    and whatever else the strategy sets (static + compile: `compile_config`). One call per generate:
    a cache holds one sequence's keys and values."""
    spec = settings(overrides, max_new_tokens)
    return _kwargs(spec, wrap(model), prompt_tokens)


def _kwargs(spec: Spec, loaded: LoadedModel, prompt_tokens: int) -> dict:
    spec.strategy.check_for_model(loaded.shape, prompt_tokens)
    setup = spec.strategy.setup(loaded, prompt_tokens)
    return {"cache": setup.make_cache(), **setup.generate_kwargs}


def generate_with_fallback(
    model, overrides: str | Sequence[str] = "", *, max_new_tokens: int, **generate_kwargs: Any
) -> tuple[Any, dict[str, str]]:
    """`model.generate(...)` with the configured cache; after an out-of-memory error, memory is freed
    and the next strategy of `fallback` (default: offloaded) is tried with its default settings,
    exactly as kvpipe's runner does. Returns (generate's output, record): the record holds the
    runner's fallback tags (fallback_from, fallback_to, fallback_error) when a fallback ran, plus
    `cache`, the strategy that produced the output."""
    from kvpipe.job.fallback import with_fallback

    spec = settings(overrides, max_new_tokens)
    loaded = wrap(model)
    prompt_tokens = generate_kwargs["input_ids"].shape[1] if "input_ids" in generate_kwargs else 0

    def attempt(ran: Spec):
        kwargs = _kwargs(ran, loaded, prompt_tokens)
        return model.generate(**generate_kwargs, max_new_tokens=max_new_tokens, **kwargs)

    ran, output, tags = with_fallback(spec, loaded, attempt)
    return output, {**tags, "cache": ran.cache.strategy}
