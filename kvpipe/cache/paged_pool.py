"""How transformers' PagedAttentionCache lays out a model's keys and values (cache=paged's pool):
sectors, trash sectors, and the blocks of each attention type's allocator, for exact byte counts."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from kvpipe.cache import accounting

# The layer types transformers' paged cache has an allocator for; any other makes it raise
PAGED_TYPES = ("full_attention", "sliding_attention")
SECTOR_ALIGNMENT = 128  # every sector is a multiple of 128 bytes (the LCM of the allocators' block bytes and 128)
TRASH_SECTORS = 2  # ahead of the data: padding tokens read from the first and write to the second
SMALLEST_BLOCK = 4  # transformers refuses a smaller page_size
CHECKED_DTYPE = "float32"  # check_for_model knows no dtype; the sector arithmetic is the same in 16 bits


@dataclass(frozen=True)
class PoolLayout:
    """How transformers' PagedAttentionCache lays out a model's KV, from its KvShape and block size:
    one allocator per attention type, each of its blocks one page (block_size tokens of keys and
    values) per layer of that type; sectors of the LCM of the allocators' block bytes and 128 bytes."""

    block_size: int
    page_bytes: int  # block_size tokens of one layer's keys and values, one sequence
    groups: tuple[tuple[Optional[int], int], ...]  # per allocator: (its window, None for full attention; its layers)

    @classmethod
    def of(cls, kv: accounting.KvShape, block_size: int) -> PoolLayout:
        token_bytes = 2 * kv.kv_heads * kv.head_dim * kv.dtype_bytes
        sliding = kv.sliding_windows
        groups = ([(max(sliding), len(sliding))] if sliding else []) + (
            [(None, kv.full_layers)] if kv.full_layers else []
        )
        return cls(block_size, token_bytes * block_size, tuple(groups))

    @property
    def block_bytes(self) -> int:
        """One block of every layer: the unit cache.num_blocks counts (transformers' bytes_per_block)."""
        return sum(layers for _, layers in self.groups) * self.page_bytes

    @property
    def sector_bytes(self) -> int:
        return math.lcm(*(layers * self.page_bytes for _, layers in self.groups), SECTOR_ALIGNMENT)

    def request_blocks(self, tokens: int) -> list[int]:
        """Per allocator, the blocks a request holds once `tokens` are cached (a window's at most)."""
        return [
            math.ceil((tokens if window is None else min(tokens, window)) / self.block_size)
            for window, _ in self.groups
        ]

    def request_bytes(self, tokens: int) -> int:
        """What one request's blocks hold once `tokens` are cached."""
        blocks = self.request_blocks(tokens)
        return sum(count * layers * self.page_bytes for count, (_, layers) in zip(blocks, self.groups))

    def request_sectors(self, tokens: int) -> int:
        """Sectors one request needs alone in the pool: each allocator takes whole sectors."""
        blocks = self.request_blocks(tokens)
        per_sector = [self.sector_bytes // (layers * self.page_bytes) for _, layers in self.groups]
        return sum(math.ceil(count / each) for count, each in zip(blocks, per_sector))

    def pool_sectors(self, num_blocks: int) -> int:
        """The data sectors transformers allocates for cache.num_blocks (rounded up to whole sectors)."""
        return max(1, math.ceil(num_blocks * self.block_bytes / self.sector_bytes))

    def pool_bytes(self, num_blocks: int) -> int:
        """The whole cache tensor for cache.num_blocks: its data sectors and the two trash sectors."""
        return (self.pool_sectors(num_blocks) + TRASH_SECTORS) * self.sector_bytes

    def blocks_for_sectors(self, sectors: int) -> int:
        """The smallest cache.num_blocks whose pool has at least `sectors` data sectors."""
        blocks = math.ceil(sectors * self.sector_bytes / self.block_bytes)
        while blocks > 1 and self.pool_sectors(blocks - 1) >= sectors:
            blocks -= 1
        return blocks
