"""Automatic prefix caching on the paged KV cache, with vLLM's semantics.

A request carries the chained hashes of its full token blocks (``Request.hashes``: entry i
identifies tokens [i U, (i + 1) U) *together with every token before them*, U =
``unit_tokens``, a multiple of the engine's ``block_size``; the unit is the workload's hash
block, e.g. Mooncake's 512 tokens). The cache owns:

- which units are resident on the GPU, with a reference count (running requests that use
  them); their KV blocks are counted in ``KVCache.cached``;
- the unreferenced ones in LRU order: they count as free, and allocating into them evicts
  the least recently released first (a request's blocks are released tail first, so its
  deepest blocks go before its shared prefix, as vLLM frees them);
- optionally a host-memory tier (``host_units``): evicted units are kept there (LRU) and
  brought back over PCIe when a request hits them, priced by the batcher as swapped blocks.

Semantics (vLLM automatic prefix caching): a request reuses the longest run of cached units
from its start, and never the block of its last token (at most ``(target - 1) // U``
units), so at least one token is always computed; reused tokens skip prefill compute while
the new tokens' attention still reads them (the batch's ``prefill_ctx``). A unit becomes
cached once fully computed (the prompt as its chunks finish, the generated tokens when the
request finishes); a unit already cached by another request stays private (no dedup).
Python work is O(units) per admission, chunk and finish, never per token.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence

import numpy as np

from simulator.engine.kvcache import KVCache
from simulator.engine.request import Request


class PrefixCache:
    """Block-hash cache of one scheduler's KV blocks.

    Parameters
    ----------
    kv : KVCache
        The blocks it shares with running requests (it registers itself as their evictor).
    unit_tokens : int
        Tokens per hash (a multiple of ``kv.block_size``).
    host_units : int
        Units the host-memory tier holds (0: none; evicted units are lost).
    """

    def __init__(self, kv: KVCache, unit_tokens: int, host_units: int = 0):
        if unit_tokens % kv.block_size:
            raise ValueError(f"prefix unit of {unit_tokens} tokens is not a multiple of the "
                             f"block size {kv.block_size}")
        self.kv, self.unit = kv, unit_tokens
        self.ub = unit_tokens // kv.block_size  # KV blocks per unit
        self.refs: dict[Hashable, int] = {}  # resident unit -> running requests using it
        self.lru: OrderedDict[Hashable, None] = OrderedDict()  # unreferenced, oldest first
        self.host: OrderedDict[Hashable, None] = OrderedDict()
        self.host_units = host_units
        self.evicted = 0  # units evicted from the GPU
        self.loaded = 0  # units brought back from the host tier
        #: Tokens between the points a hit may resume from (0: every unit boundary). A
        #: hybrid model's recurrent state is kept only every ``resume`` tokens (vLLM's
        #: block-aligned checkpoints), so a hit ends at the last such point it covers.
        self.resume = 0
        kv.prefix = self

    # -- queries (no side effects) -------------------------------------------------------
    def match(self, hashes: Sequence[Hashable] | None, target: int) -> tuple[int, int, int]:
        """Longest reusable run for a request with ``target`` tokens to compute.

        Returns ``(units, from_host, pinned)``: units reusable from the start, how many of
        them come from the host tier, and the KV blocks of the resident unreferenced ones
        (free now, no longer once referenced).
        """
        if not hashes:
            return 0, 0, 0
        limit = min(len(hashes), (target - 1) // self.unit)
        refs, host = self.refs, self.host
        n = loads = pinned = 0
        while n < limit:
            h = hashes[n]
            r = refs.get(h)
            if r is not None:
                if r == 0:
                    pinned += self.ub
            elif h in host:
                loads += 1
            else:
                break
            n += 1
        if self.resume:
            cut = n * self.unit // self.resume * self.resume // self.unit
            if cut < n:  # count again over the units kept
                loads = sum(1 for h in hashes[:cut] if h not in refs)
                pinned = self.ub * sum(1 for h in hashes[:cut] if refs.get(h) == 0)
                n = cut
        return n, loads, pinned

    def cached_tokens(self, req: Request) -> int:
        """Prompt tokens ``req`` would find cached here now (for routers)."""
        return self.match(req.hashes, req.target)[0] * self.unit

    # -- a request's references ------------------------------------------------------------
    def acquire(self, req: Request, n: int) -> int:
        """``req`` (holding nothing) references its first ``n`` units, as :meth:`match`
        found them; host units are loaded into GPU blocks (which the caller checked are
        free). Returns the KV blocks loaded from the host."""
        hashes, refs, lru, kv, ub = req.hashes, self.refs, self.lru, self.kv, self.ub
        loads = []
        for h in hashes[:n]:  # pin the resident ones first: loads must not evict them
            r = refs.get(h)
            if r is None:
                loads.append(h)
                continue
            if r == 0:
                del lru[h]
                kv.evictable -= ub
            refs[h] = r + 1
        for h in loads:  # out of the host LRU first: evictions below may push into it
            del self.host[h]
        for h in loads:
            kv.allocate(ub)  # into free or evictable blocks, then handed to the cache
            kv.used -= ub
            kv.cached += ub
            refs[h] = 1
        self.loaded += len(loads)
        req.units = list(hashes[:n])
        req.shared = n * ub
        req.next_unit = n
        return len(loads) * ub

    def fill(self, req: Request, tokens: int) -> int:
        """Cache ``req``'s units fully inside its first ``tokens`` computed tokens (its
        private blocks become cached and referenced by it). Returns the KV blocks moved
        from private to cached."""
        hashes = req.hashes
        if not hashes:
            return 0
        end = min(len(hashes), tokens // self.unit)
        refs, kv, ub = self.refs, self.kv, self.ub
        moved = 0
        for i in range(req.next_unit, end):
            h = hashes[i]
            if h in refs:  # cached meanwhile by another request: this copy stays private
                continue
            self.host.pop(h, None)
            refs[h] = 1
            req.units.append(h)
            moved += ub
        if end > req.next_unit:
            req.next_unit = end
        kv.used -= moved
        kv.cached += moved
        req.shared += moved
        return moved

    def release(self, req: Request) -> None:
        """``req`` stops referencing its units (tail first into the LRU)."""
        refs, lru, kv, ub = self.refs, self.lru, self.kv, self.ub
        for h in reversed(req.units):
            r = refs[h] - 1
            refs[h] = r
            if r == 0:
                lru[h] = None
                kv.evictable += ub
        req.units = []
        req.shared = 0
        req.next_unit = 0

    # -- eviction ------------------------------------------------------------------------
    def evict(self, blocks: int) -> None:
        """Free at least ``blocks`` KV blocks from unreferenced units, least recently
        released first; they move to the host tier when there is one."""
        kv, ub, lru, refs, host = self.kv, self.ub, self.lru, self.refs, self.host
        while blocks > 0:
            h, _ = lru.popitem(last=False)
            del refs[h]
            kv.cached -= ub
            kv.evictable -= ub
            blocks -= ub
            self.evicted += 1
            if self.host_units:
                host[h] = None
                if len(host) > self.host_units:
                    host.popitem(last=False)


def infinite_cache_tokens(hashes: Iterable[Sequence[Hashable] | None], prompts: Iterable[int],
                          outputs: Iterable[int], unit_tokens: int) -> np.ndarray:
    """Prompt tokens each request would find cached with an unbounded cache, requests taken
    in the given (arrival) order: the ceiling of any simulated hit, by the same rules
    (longest cached run of full units from the start, never the last token's block; a
    request leaves behind its units inside prompt + output - 1 tokens, the KV it had).

    Parameters
    ----------
    hashes, prompts, outputs
        Per request: its full units' hashes (None: none), prompt and output tokens.
    unit_tokens : int
        Tokens per hash.
    """
    seen: set = set()
    out = []
    for h, p, o in zip(hashes, prompts, outputs, strict=True):
        if not h:
            out.append(0)
            continue
        limit, n = min(len(h), (p - 1) // unit_tokens), 0
        while n < limit and h[n] in seen:
            n += 1
        out.append(n * unit_tokens)
        seen.update(h[: min(len(h), (p + o - 1) // unit_tokens)])
    return np.array(out, dtype=np.int64)


def hit_rate_ceiling(requests, unit_tokens: int, max_len: int | None = None) -> float:
    """The infinite-cache hit rate (tokens) of an open-loop request table (``hashes``,
    ``prompt_tokens``, ``output_tokens`` in arrival order): the ceiling of a run's
    ``prefix_hit_rate``. Requests over ``max_len`` (prompt + output) are left out, as the
    cluster rejects them before any cache sees them (and the summary counts completed
    requests only)."""
    if max_len is not None:
        requests = requests[requests["prompt_tokens"] + requests["output_tokens"] <= max_len]
    hits = infinite_cache_tokens(requests["hashes"], requests["prompt_tokens"],
                                 requests["output_tokens"], unit_tokens)
    total = float(requests["prompt_tokens"].sum())
    return float(hits.sum()) / total if total > 0 else 0.0
