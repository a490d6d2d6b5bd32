"""cache=paged: transformers' continuous batching, every request's keys and values in one pool of pages.

transformers' `ContinuousBatchingManager` (model.init_continuous_batching) admits requests as they
arrive and retires them as they finish, step by step, and keeps their KV in a `PagedAttentionCache`:
one flat tensor cut into sectors, each sector handed to the allocator of one attention type (full or
sliding), which cuts it into blocks of `block_size` tokens (transformers' page_size) for every layer
of that type. A request holds ceil(tokens / block_size) blocks per allocator (a sliding layer no more
than its window's); full blocks of identical prompt prefixes are shared when allow_block_sharing is
on. The tensor's first two sectors are trash that padding tokens read and write, never a request's.

It serves many requests at once, so it runs only under a load (load=offline, concurrency or rate):
the serving job calls `start_manager`, adds requests, reads `peak_held` (the most its requests held
at once, kvpipe.cache.paged_held) and stops it with `stop_manager`; the one-batch-at-a-time path (`build`) refuses it. Pure Python at import.

What transformers 5.24's continuous batching does on CPU, as read and checked here:
- attention: sdpa stays sdpa, eager becomes paged|eager while the manager runs (stop puts it back),
  flash kernels on CUDA only; auto_switch_to_flash=False keeps the model's own.
- sliding-window layers: their own allocator, a ring buffer of ceil(window / block_size) blocks;
  chunked attention or layers without KV of their own make it raise.
- chunked prefill: no setting of its own; a prompt longer than max_batch_tokens is split across
  forward passes by the scheduler.
- no compile and no CUDA graphs unless asked (default_compile_level=0; off CUDA no graph backend),
  so nothing to warm up: kvpipe never calls its warmup.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Optional

from kvpipe.cache import accounting
from kvpipe.cache.base import CacheSetup, CacheStrategy
from kvpipe.cache.paged_held import HeldPeak
from kvpipe.cache.paged_pool import CHECKED_DTYPE, PAGED_TYPES, SMALLEST_BLOCK, PoolLayout
from kvpipe.errors import ConfigError, KvpipeError, first_line


class Paged(CacheStrategy):
    name = "paged"
    family = "paged"
    order = 60
    continuous = True
    test_overrides = ("load=offline",)  # it serves requests, so it runs only under a load
    supports_sliding_window = True  # sliding layers get their own allocator, a ring buffer of their window
    search_variants = ()  # `kvpipe advise` searches one-batch jobs, which cache=paged does not run

    @dataclass
    class Settings:
        # tokens per page (transformers' page_size): a power of two, at least 4. 32, not transformers'
        # 256: sdpa and eager gather a request's tokens one by one, so a page's size changes no kernel,
        # only how much a request over-holds (up to block_size - 1 tokens per layer) and how finely
        # prefixes are shared; at kvpipe's prompt lengths 256 would round most requests up to one page
        block_size: int = 32
        # the pool, in blocks of block_size tokens for every layer; null: from max_memory_percent of free
        # accelerator memory (off CUDA with max_memory_percent null too: room for every request at once)
        num_blocks: Optional[int] = None
        # share of free device memory the pool may take when num_blocks is null; null: transformers' own on
        # CUDA (0.9, 0.8 with logit processors); off CUDA kvpipe sizes the pool itself then (see num_blocks)
        max_memory_percent: Optional[float] = None
        # tokens one forward pass takes, prompt chunks included (longer prompts are split); null: transformers' 8192
        max_batch_tokens: Optional[int] = None
        # requests share the full pages of an identical prompt prefix (transformers' default: on)
        allow_block_sharing: bool = True

    # ---- checks -------------------------------------------------------------------------------

    def check(self, overridden=frozenset()) -> list[str]:
        block_size, num_blocks = self.settings.block_size, self.settings.num_blocks
        percent, batch_tokens = self.settings.max_memory_percent, self.settings.max_batch_tokens
        if block_size < SMALLEST_BLOCK or block_size & (block_size - 1):
            raise ConfigError(
                "cache.block_size", block_size, f"expected a power of two, at least {SMALLEST_BLOCK} (tokens per page)"
            )
        if num_blocks is not None and num_blocks <= 0:
            raise ConfigError("cache.num_blocks", num_blocks, "expected a positive integer, or null to size the pool")
        if percent is not None and not 0 < percent <= 1:
            raise ConfigError("cache.max_memory_percent", percent, "expected a share in (0, 1], or null")
        if batch_tokens is not None and batch_tokens <= 0:
            raise ConfigError("cache.max_batch_tokens", batch_tokens, "expected a positive integer, or null")
        return super().check(overridden)

    def check_for_model(self, shape, prompt_tokens: int) -> None:
        super().check_for_model(shape, prompt_tokens)
        unpaged = sorted({layer.attention for layer in shape.layers} - set(PAGED_TYPES))
        if unpaged:
            raise ConfigError(
                "cache.strategy",
                self.name,
                f"the model has {', '.join(unpaged)} layers; transformers' paged cache holds "
                f"{' and '.join(PAGED_TYPES)} layers only",
            )
        num_blocks = self.settings.num_blocks
        if num_blocks is None:
            return
        layout = PoolLayout.of(accounting.kv_shape(shape, 1, CHECKED_DTYPE), self.settings.block_size)
        new_tokens = self.choice.max_new_tokens
        tokens = prompt_tokens + new_tokens - 1  # the last generated token is never fed back
        needed = layout.request_sectors(tokens)
        if layout.pool_sectors(num_blocks) < needed:
            least = layout.blocks_for_sectors(needed)
            raise ConfigError(
                "cache.num_blocks",
                num_blocks,
                f"one request of the longest prompt + workload.max_new_tokens = {prompt_tokens} + {new_tokens} tokens "
                f"needs {least} blocks of {self.settings.block_size} tokens; expected at least {least}",
            )

    @classmethod
    def attention_refusal(cls, attn_implementation: str) -> str | None:
        """Why continuous batching cannot run with this model.attn_implementation (None: it can).
        transformers pages sdpa and eager (as paged|eager) everywhere, flash kernels on CUDA."""
        if attn_implementation in ("sdpa", "eager", "paged|eager") or attn_implementation.startswith("flash_attention"):
            return None
        return (
            f"cache={cls.name} runs transformers' continuous batching, which pages sdpa, eager or flash attention "
            "only; expected model.attn_implementation=sdpa or eager"
        )

    # ---- building -----------------------------------------------------------------------------

    def build(self, loaded, longest_prompt: int) -> CacheSetup:
        raise ConfigError(
            "cache.strategy",
            self.name,
            f"cache={self.name} serves many requests at once by continuous batching; choose how they arrive: "
            "load=offline, load=concurrency or load=rate",
        )

    def start_manager(self, loaded, max_prompt_tokens: int, max_new_tokens: int, num_requests: int, seed: int = 0,
                      ignore_eos: bool = True, do_sample: bool = False):  # fmt: skip
        """A started ContinuousBatchingManager for the loaded model, its paged cache already allocated
        (so pool_bytes answers at once). Generation follows the model's generation_config as generate()
        does, greedy unless do_sample (then seeded by `seed`); ignore_eos=True sets eos_token_id=-1, so
        every request generates exactly its max_new_tokens (transformers' CB has no min_new_tokens: an
        EOS the model picks is emitted and generation goes on). The max_* and num_requests are the
        workload's, transformers' hints for its defaults; off CUDA with num_blocks and
        max_memory_percent both null they also size the pool: every request in flight at once. Stop it
        with `stop_manager`, which puts the model's attention implementation back."""
        import copy

        from transformers.generation.configuration_utils import ContinuousBatchingConfig
        from transformers.generation.continuous_batching.utils import WorkloadHints

        model = loaded.model
        generation = copy.deepcopy(model.generation_config)
        eos = -1 if ignore_eos else _eos_ids(generation, model.config)
        generation.update(do_sample=do_sample, max_new_tokens=max_new_tokens, eos_token_id=eos)
        config = ContinuousBatchingConfig(
            page_size=self.settings.block_size,
            num_blocks=self.pool_blocks(loaded, max_prompt_tokens + max_new_tokens - 1, num_requests),
            max_memory_percent=self.settings.max_memory_percent,
            max_batch_tokens=self.settings.max_batch_tokens,
            allow_block_sharing=self.settings.allow_block_sharing,
            auto_switch_to_flash=False,  # the model's own attention implementation, as every other job
            use_cuda_graph=False,  # no capture (sdpa and eager need masks; transformers' default then too)
            default_compile_level=0,  # no torch.compile
            seed=seed,
        )
        hints = WorkloadHints(
            max_prompt_length=max_prompt_tokens, max_generated_length=max_new_tokens, num_requests=num_requests
        )
        attention = model.config._attn_implementation
        try:
            manager = model.init_continuous_batching(
                generation_config=generation, continuous_batching_config=config, workload_hints=hints
            )
        except BaseException:  # it may switch the attention before it resolves (and refuses) the config
            if model.config._attn_implementation != attention:
                model.set_attn_implementation(attention)
            raise
        manager._kvpipe_attention = attention  # what stop_manager puts back, however the manager ends
        manager.start()
        try:
            _wait_for_cache(manager)
        except BaseException:
            self.stop_manager(manager, hard=True)
            raise
        # before any request is added: the generation thread reads what they hold before every release
        manager._kvpipe_held = HeldPeak(lambda: (self.blocks_in_use(manager), self.held_bytes(manager)))
        manager._kvpipe_held.watch(self.paged_cache(manager))
        return manager

    def pool_blocks(self, loaded, tokens: int, num_requests: int) -> int | None:
        """The num_blocks transformers is given: cache.num_blocks; null, on CUDA or with
        max_memory_percent set: None (transformers sizes it from free memory); off CUDA with both null,
        room for num_requests requests of `tokens` cached tokens at once (transformers' default there
        would zero most of the host's free RAM)."""
        if self.settings.num_blocks is not None:
            return self.settings.num_blocks
        if loaded.device == "cuda" or self.settings.max_memory_percent is not None:
            return None
        layout = PoolLayout.of(accounting.kv_shape(loaded.shape, 1, loaded.dtype), self.settings.block_size)
        return layout.blocks_for_sectors(max(1, num_requests) * layout.request_sectors(tokens))

    @staticmethod
    def stop_manager(manager, hard: bool = False) -> None:
        """Stop the manager (hard: fail the requests in flight instead of finishing them), release it,
        and leave the model as it was: its attention implementation back (the manager switches eager
        to paged|eager, and puts it back only on a clean stop)."""
        model = manager.model
        try:
            if manager._generation_thread is not None:
                manager.stop(block=True, hard_stop=hard)
            manager.destroy()
        finally:
            attention = getattr(manager, "_kvpipe_attention", None)
            if attention is not None and model.config._attn_implementation != attention:
                model.set_attn_implementation(attention)

    # ---- what the pool holds, measured ---------------------------------------------------------

    @staticmethod
    def paged_cache(manager):
        """The manager's PagedAttentionCache (while it runs: stop releases it)."""
        processor = manager.batch_processor
        if processor is None:
            raise KvpipeError("the continuous batching manager holds no paged cache: sample it before stop_manager")
        return processor.cache

    @classmethod
    def pool_bytes(cls, manager) -> int:
        """Bytes of every tensor the paged cache holds (each storage once: the allocators' key and value
        views are views of its one cache tensor), trash sectors included."""
        cache = cls.paged_cache(manager)
        seen: set[tuple[int, int]] = set()
        holders = [cache, *cache.cache_allocators.values()]
        return sum(_storage_bytes(value, seen) for holder in holders for value in vars(holder).values())

    @classmethod
    def prefix_matches(cls, manager) -> dict[str, int]:
        """Per request id, the prompt tokens its scheduler served from shared blocks: what transformers'
        `search_prefix_match` returned for it (0 with allow_block_sharing off), read by wrapping it on this
        manager's cache. Call it before adding requests; the dict fills in as they are admitted. The
        scheduler asks again while a request waits unmatched, so a request's last answer is the one kept."""
        cache = cls.paged_cache(manager)
        matches: dict[str, int] = {}
        search = cache.search_prefix_match

        def observed(request_id: str, prompt_ids: list[int]) -> int:
            matches[request_id] = matched = search(request_id, prompt_ids)
            return matched

        cache.search_prefix_match = observed
        return matches

    @classmethod
    def block_bytes(cls, manager) -> int:
        """One block of every layer (cache.num_blocks' unit): one page per layer, each allocator's block."""
        return sum(allocator.bytes_per_block for allocator in cls.paged_cache(manager).cache_allocators.values())

    @classmethod
    def held_bytes(cls, manager) -> int:
        """Bytes of the blocks the requests in flight hold now (a shared block once). Blocks a finished
        request left for prefix sharing are not counted: transformers evicts them under pressure."""
        return sum(len(blocks) * allocator.bytes_per_block for allocator, blocks in cls._held(manager))

    @classmethod
    def peak_held(cls, manager) -> tuple[int, int]:
        """The most blocks (as blocks_in_use counts them) and bytes (as held_bytes) the manager's requests
        held at once since it started, however briefly: read before each release, not polled."""
        return manager._kvpipe_held.peak()

    @classmethod
    def blocks_in_use(cls, manager) -> int:
        """The blocks the requests in flight hold now, in blocks of every layer (exact for a model of one
        attention type; rounded up where full and sliding allocators hold blocks of their own)."""
        held = cls._held(manager)
        pages = sum(len(blocks) * allocator.pages_per_block for allocator, blocks in held)
        return math.ceil(pages / sum(allocator.pages_per_block for allocator, _ in held))

    @classmethod
    def _held(cls, manager) -> list[tuple[object, set[int]]]:
        """Per allocator, the distinct blocks in the requests' block tables. The generation thread edits
        them meanwhile: the copy is one C-level call, and a list being extended iterates safely."""
        held = []
        for allocator in cls.paged_cache(manager).cache_allocators.values():
            tables = list(allocator.block_table.copy().values())
            held.append((allocator, {block for table in tables for block in list(table)}))
        return held

    # ---- bytes, predicted ----------------------------------------------------------------------

    def predict_kv_bytes(self, kv, prompt_tokens: int, new_tokens: int) -> int:
        """With cache.num_blocks: the pool transformers allocates, exactly (pool_bytes), whatever the
        request. Without: the blocks one request of this shape holds (one per sequence of the batch)."""
        layout = PoolLayout.of(kv, self.settings.block_size)
        if self.settings.num_blocks is not None:
            return layout.pool_bytes(self.settings.num_blocks)
        return kv.batch_size * layout.request_bytes(prompt_tokens + new_tokens - 1)

    def holds_requests(self, kv, prompt_tokens: int, new_tokens: int, requests: int) -> bool:
        """With cache.num_blocks the pool is fixed: it holds as many requests as its sectors take, each
        request's blocks in sectors of its own (as pool_blocks sizes a pool); without, memory decides."""
        if self.settings.num_blocks is None:
            return True
        layout = PoolLayout.of(kv, self.settings.block_size)
        needed = requests * layout.request_sectors(prompt_tokens + new_tokens - 1)
        return needed <= layout.pool_sectors(self.settings.num_blocks)

    def window_bytes(self, kv) -> int:
        """Sliding layers hold whole pages: ceil(window / block_size) of them each, once past the window."""
        pages = sum(math.ceil(window / self.settings.block_size) for window in kv.sliding_windows)
        return pages * self.settings.block_size * kv.token_bytes()

    def decode_kv_traffic_bytes(self, kv, kv_bytes: int, prompt_tokens: int, new_tokens: int, device: str):
        """With sdpa and eager, each layer gathers a request's cached tokens from its pages (read), writes
        them as one dense copy and attention reads that copy: 3 x the tokens each layer attends to (a
        sliding one its window), per request, whatever the pool's size."""
        return 3 * self._attended_tokens(kv, prompt_tokens + new_tokens - 1) * kv.token_bytes()

    @staticmethod
    def _attended_tokens(kv, tokens: int) -> int:
        return sum(tokens if window is None else min(tokens, window) for window in kv.windows)

    def dequantized_copy_bytes(self, kv, prompt_tokens: int, new_tokens: int) -> int:
        """Beside the pool, a decode step gathers one layer's cached tokens into a dense copy (sdpa and
        eager read that): the largest layer's, a window's at most."""
        tokens = prompt_tokens + new_tokens - 1
        return max((tokens if w is None else min(tokens, w) for w in kv.windows), default=0) * kv.token_bytes()

    @classmethod
    def plan_notes(cls, choice, shape) -> list[str]:
        own = choice.with_strategy(cls.name).cache  # the paged row's settings, whatever cache= the plan was asked for
        num_blocks = own.num_blocks
        # why its TPOT floor is above the dynamic row's at the same requests (kvpipe/predict/in_flight.py)
        floor = (
            f"{cls.name}'s KV read/step, and so its TPOT floor, is 3x the KV its requests attend to: with sdpa or "
            "eager (model.attn_implementation; kvpipe keeps the model's own) transformers gathers each request's "
            "pages into one dense copy every step, read and written, and attention reads that copy. The dynamic "
            "row counts one read; transformers' DynamicLayer copies its cache every step too (torch.cat), which "
            "its floor leaves out"
        )
        if num_blocks is not None:
            return [
                f"{cls.name} counts its whole pool, cache.num_blocks={num_blocks} blocks of "
                f"{own.block_size} tokens for every layer plus two trash sectors, whatever the context; "
                "every request in flight shares it, and capacity is what its blocks hold",
                floor,
            ]
        return [
            f"{cls.name} counts the pages one request holds (whole blocks of cache.block_size tokens per layer); "
            "under a load requests share a pool transformers sizes from free accelerator memory unless "
            "cache.num_blocks sets it, and it runs only under one (load=...)",
            floor,
        ]


def _eos_ids(generation, model_config):
    """The EOS ids generate() stops at; -1 (none) where neither config names one."""
    eos = generation.eos_token_id if generation.eos_token_id is not None else model_config.eos_token_id
    return -1 if eos is None else eos


def _wait_for_cache(manager) -> None:
    """Until the generation thread has built its batch processor (the paged cache allocated); its
    failure (a pool larger than the memory, say) as one line."""
    status = manager.background_thread_status
    while manager.batch_processor is None:
        error = status.fatal_error
        if error is not None or not manager.is_running():
            reason = first_line(error) if error is not None else "the generation thread ended"
            raise KvpipeError(f"cache=paged could not start transformers' continuous batching: {reason}")
        time.sleep(0.002)


def _storage_bytes(obj, seen: set) -> int:
    """Bytes of the storages of the tensors in obj (a tensor, or dicts, lists and tuples of them)."""
    import torch

    if isinstance(obj, torch.Tensor):
        storage = obj.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if key in seen or obj.numel() == 0:
            return 0
        seen.add(key)
        return storage.nbytes()
    if isinstance(obj, dict):
        return sum(_storage_bytes(value, seen) for value in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_storage_bytes(value, seen) for value in obj)
    return 0
