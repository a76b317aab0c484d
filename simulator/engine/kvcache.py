"""Paged KV cache accounting: blocks of ``block_size`` tokens, allocated on demand."""

from __future__ import annotations


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks that hold ``tokens`` tokens: ceil(tokens / block_size)."""
    return -(-tokens // block_size)


class KVCache:
    """Block counter of one scheduler: ``used`` in [0, capacity] at all times.

    Parameters
    ----------
    capacity : int
        Blocks available.
    block_size : int
        Tokens per block.
    """

    __slots__ = ("capacity", "block_size", "used", "peak")

    def __init__(self, capacity: int, block_size: int):
        self.capacity, self.block_size = capacity, block_size
        self.used = 0
        self.peak = 0

    @property
    def free(self) -> int:
        return self.capacity - self.used

    def allocate(self, blocks: int) -> None:
        used = self.used + blocks
        if used > self.capacity:
            raise RuntimeError(f"KV cache over capacity: {used} > {self.capacity} blocks")
        self.used = used
        if used > self.peak:
            self.peak = used

    def release(self, blocks: int) -> None:
        self.used -= blocks
        if self.used < 0:
            raise RuntimeError(f"KV cache released more blocks than allocated ({self.used})")
