"""Paged KV cache accounting: blocks of ``block_size`` tokens, allocated on demand.

Blocks are private to a request (``used``) or held by the prefix cache (``cached``, see
:mod:`simulator.engine.prefix`); cached blocks that no running request references
(``evictable``) count as free: allocating into them evicts them, least recently used first.
"""

from __future__ import annotations


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks that hold ``tokens`` tokens: ceil(tokens / block_size)."""
    return -(-tokens // block_size)


class KVCache:
    """Block counter of one scheduler: ``in_use`` in [0, capacity] at all times.

    Parameters
    ----------
    capacity : int
        Blocks available.
    block_size : int
        Tokens per block.
    """

    __slots__ = ("capacity", "block_size", "used", "peak", "cached", "evictable", "prefix")

    def __init__(self, capacity: int, block_size: int):
        self.capacity, self.block_size = capacity, block_size
        self.used = 0  # blocks private to requests
        self.peak = 0
        self.cached = 0  # blocks held by the prefix cache (referenced or not)
        self.evictable = 0  # cached blocks no request references (free for allocation)
        self.prefix = None  # the PrefixCache that evicts, when prefix caching is on

    @property
    def free(self) -> int:
        return self.capacity - self.used - self.cached + self.evictable

    @property
    def in_use(self) -> int:
        """Blocks that running requests hold (private or referenced cached blocks)."""
        return self.used + self.cached - self.evictable

    def allocate(self, blocks: int) -> None:
        used = self.used + blocks
        if used + self.cached > self.capacity:
            if used + self.cached - self.evictable > self.capacity:
                raise RuntimeError(f"KV cache over capacity: {used + self.cached} > "
                                   f"{self.capacity} blocks")
            self.prefix.evict(used + self.cached - self.capacity)
        self.used = used
        if used + self.cached - self.evictable > self.peak:
            self.peak = used + self.cached - self.evictable

    def release(self, blocks: int) -> None:
        self.used -= blocks
        if self.used < 0:
            raise RuntimeError(f"KV cache released more blocks than allocated ({self.used})")
