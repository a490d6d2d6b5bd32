"""What a forward pass computes and holds, from the config alone: a prefill's FLOPs, its largest
activation, and the embedding bytes a step reads. For the floors of `kvpipe plan --hardware`; no
weights load. Pure Python.

FLOPs count the matrix products only, two per multiply-add: every decoder weight once per token, the
output head for the last token only (generate() asks for logits_to_keep=1), and attention's two
products (QK^T, then the scores times V) over the (query, key) pairs a causal mask keeps, each
sliding layer's keys capped at its window. Norms, rotary embeddings, softmax and the residual adds
are left out: a few per cent at most, and a floor may only undercount.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from kvpipe.model.shape import ModelShape, config_dict, text_config
from kvpipe.model.weights import embeddings_tied


@dataclass(frozen=True)
class Dimensions:
    """The sizes a forward pass's arithmetic depends on, and the parameters each token multiplies."""

    hidden_size: int
    intermediate_size: Optional[int]  # the MLP's width; None where the config names none (mixtures of experts)
    vocab_size: int
    num_heads: int
    head_dim: int
    windows: tuple[Optional[int], ...]  # per layer that attends: None for full attention, else its window
    tied: bool  # the output head shares the input embeddings
    matmul_parameters: int  # decoder weights every token is multiplied by: all but the embeddings and the head

    @property
    def embedding_parameters(self) -> int:
        return self.vocab_size * self.hidden_size


def dimensions(model_cfg, shape: ModelShape, weights_bytes: int, dtype_bytes: int) -> Dimensions:
    """From the model's config and its weight bytes (kvpipe.model.weights, in the model dtype)."""
    whole = config_dict(model_cfg)[0]
    config = text_config(whole)
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    tied = embeddings_tied(whole)
    parameters = weights_bytes // dtype_bytes  # the norms' few weights stay in: a few in ten thousand
    embeddings = vocab * hidden * (1 if tied else 2)  # the input table, and the head unless tied
    # transformers' "dummy" layers keep no KV of their own: a mixture-of-experts or MLP-only layer
    windows = tuple(layer.window for layer in shape.layers if layer.attention != "dummy")
    return Dimensions(
        hidden_size=hidden,
        intermediate_size=config.get("intermediate_size"),
        vocab_size=vocab,
        num_heads=shape.num_heads,
        head_dim=shape.head_dim,
        windows=windows,
        tied=tied,
        matmul_parameters=max(parameters - embeddings, 0),
    )


def attended_pairs(window: Optional[int], tokens: int) -> int:
    """(query, key) pairs a causal prefill of `tokens` computes in one layer: query i sees keys 1..i,
    or its last `window` of them."""
    if window is None or tokens <= window:
        return tokens * (tokens + 1) // 2
    return window * (window + 1) // 2 + (tokens - window) * window


def prefill_flops(dims: Dimensions, prompt_tokens: int, batch_size: int) -> int:
    """FLOPs of one prefill (see the module's docstring for what is counted)."""
    linear = 2 * dims.matmul_parameters * prompt_tokens
    head = 2 * dims.embedding_parameters  # the last token's logits only
    return batch_size * (linear + head) + prefill_attention_flops(dims, prompt_tokens, batch_size)


def prefill_attention_flops(dims: Dimensions, prompt_tokens: int, batch_size: int) -> int:
    """The part of prefill_flops that attention's two products compute: quadratic in the prompt
    (up to each sliding layer's window), and run by other kernels than the weights' matrix products."""
    pairs = sum(attended_pairs(window, prompt_tokens) for window in dims.windows)
    return batch_size * 2 * 2 * dims.num_heads * dims.head_dim * pairs


def largest_activation_bytes(dims: Dimensions, prompt_tokens: int, batch_size: int, dtype_bytes: int) -> int:
    """The largest activation a prefill holds: the MLP's, where act(gate), up and their product are
    alive at once, 3 x batch x prompt x intermediate_size values (4 x hidden_size where the config
    names no intermediate size). Attention's prompt x prompt scores are not held: SDPA's fused
    kernels (flash or memory-efficient on CUDA, flash on CPU) compute them block by block; with
    model.attn_implementation=eager they would add batch x heads x prompt^2 values."""
    width = dims.intermediate_size or 4 * dims.hidden_size
    return 3 * batch_size * prompt_tokens * width * dtype_bytes


def embedding_bytes(dims: Dimensions, dtype_bytes: int) -> tuple[int, int]:
    """(the input embedding table's bytes, one token's row of it)."""
    return dims.embedding_parameters * dtype_bytes, dims.hidden_size * dtype_bytes
