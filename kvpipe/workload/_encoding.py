"""Prompts as the model expects them: its chat template when it has one, and the BOS token its
tokenizer adds by default, exactly once.

Every workload tokenizes through here. A chat template that writes BOS itself is left alone; a
template that does not, a base model with no template, and plain text all get the tokenizer's
default prefix (its BOS) added, so that the model never sees a prompt it was not trained on.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def default_prefix(tokenizer) -> list[int]:
    """The special ids the tokenizer puts before a text by default (its BOS, for most models; none
    for many), found by encoding a probe with and without special tokens."""
    cached = getattr(tokenizer, "_kvpipe_default_prefix", None)
    if cached is None:
        probe = "kvpipe probe"
        bare = tokenizer(probe, add_special_tokens=False)["input_ids"]
        full = tokenizer(probe)["input_ids"]
        special = set(tokenizer.all_special_ids)
        cached = []
        for start in range(len(full) - len(bare) + 1):
            if full[start : start + len(bare)] == bare:
                cached = [i for i in full[:start] if i in special]
                break
        tokenizer._kvpipe_default_prefix = cached
    return list(cached)


def with_prefix(tokenizer, ids: list[int]) -> list[int]:
    """ids with the tokenizer's default prefix in front, unless they start with it already (a chat
    template that writes BOS itself): never twice."""
    prefix = default_prefix(tokenizer)
    if prefix and ids[: len(prefix)] != prefix:
        return prefix + ids
    return list(ids)


def encode(tokenizer, text: str) -> list[int]:
    """A whole prompt's ids: the text's own tokens (special tokens a template wrote are parsed as
    such), with the default prefix once."""
    return with_prefix(tokenizer, raw_ids(tokenizer, text))


def raw_ids(tokenizer, text: str) -> list[int]:
    """The text's tokens alone, for pieces of a prompt (never a prefix of their own)."""
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def chat_text(tokenizer, messages: list[dict]) -> str:
    """Messages ({role, content}) as the model's chat template renders them, ready for the
    assistant's turn; without a template, their contents one after another (see warn_no_template)."""
    if has_chat_template(tokenizer):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "\n\n".join(str(message["content"]) for message in messages)


def template_parts(tokenizer) -> tuple[str, str]:
    """The chat template's text before and after one user message ('' and '' without a template)."""
    if not has_chat_template(tokenizer):
        return "", ""
    marker = "\x00KVPIPE\x00"
    before, after = chat_text(tokenizer, [{"role": "user", "content": marker}]).split(marker)
    return before, after


_WARNED: set[int] = set()


def warn_no_template(tokenizer, kind: str) -> None:
    """A chat-style workload on a tokenizer with no chat template: said once per tokenizer."""
    if id(tokenizer) in _WARNED:
        return
    _WARNED.add(id(tokenizer))
    log.warning(
        "workload=%s renders prompts through the model's chat template, but its tokenizer has none "
        "(a base model?); its prompts are fed as plain text (tag kvpipe.chat_template=none)",
        kind,
    )
