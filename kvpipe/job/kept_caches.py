"""Each session's cache kept between its turns (workload.keep_session_cache=true), for strategies that
can continue from a cache they returned (`continues_cache`): a turn prefills only the part of its
prompt the cache does not hold, and generate() goes on from there.

The cache holds what its last call saw: that turn's prompt and its answer but the answer's last token
(never fed back). The next turn re-renders the history through the chat template, which need not
reproduce those tokens: the answer is decoded and encoded again, a template may close an assistant's
turn with tokens the model never wrote, or write it differently, and a call that ran past
end-of-sequence holds tokens the history leaves out. So the cached tokens are compared with the new
prompt, and the cache continues from their common prefix: cropped back to it where its layers can be
(transformers' DynamicLayer), otherwise (quantized or sliding layers) dropped and the prompt prefilled
whole. At least the prompt's last token is always prefilled, for generate() to have an input.
"""

from __future__ import annotations

from typing import Callable

from kvpipe.cache.accounting import kv_cache_bytes


class KeptCaches:
    """The caches of sessions between their turns; what they saved and held."""

    def __init__(self):
        self.kept: dict[int, tuple[object, list[int]]] = {}  # session -> (cache, the token ids it holds)
        self.reused_tokens = 0  # prompt tokens served from a kept cache instead of prefilled
        self.held_peak_bytes = 0  # the most bytes the kept caches held at once, between turns

    def resume(self, request, make_cache: Callable[[], object]):
        """The cache the request's turn starts from: its session's, cut back to the part that is a
        prefix of this prompt, or a fresh one."""
        cache, held = self.kept.pop(request.session, (None, []))
        if cache is None:
            return make_cache()
        common = shared_prefix(held, request.ids[:-1])
        if common < len(held) and not cropped(cache, len(held) - common):
            return make_cache()
        self.reused_tokens += common
        return cache

    def keep(self, request, cache, tokens: list[int]) -> None:
        """After the request's turn: its session's cache kept for the next turn (none after the last)."""
        if request.session is None or request.last_turn:
            return
        held = (list(request.ids) + list(tokens))[: cache.get_seq_length()]
        self.kept[request.session] = (cache, held)
        self.held_peak_bytes = max(self.held_peak_bytes, sum(kv_cache_bytes(c) for c, _ in self.kept.values()))


def shared_prefix(held: list[int], ids: list[int]) -> int:
    """How many leading tokens the two share."""
    for position, (a, b) in enumerate(zip(held, ids)):
        if a != b:
            return position
    return min(len(held), len(ids))


def cropped(cache, tokens: int) -> bool:
    """Drop the cache's last `tokens` where every layer is a plain DynamicLayer (whose crop is exact);
    False where it cannot be cut back (a quantized layer has packed them, a sliding one may have let
    older ones go)."""
    from transformers.cache_utils import DynamicLayer

    if any(type(layer) is not DynamicLayer for layer in cache.layers):
        return False
    cache.crop(-tokens)
    return True
