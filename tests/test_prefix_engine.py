"""Prefix caching in the batcher, by hand: known hits, partial blocks, evictions, the host
tier, preemption and swap (no SimPy: schedule and complete steps directly)."""

from __future__ import annotations

import pytest

from simulator.engine.batching import ContinuousBatcher
from simulator.engine.kvcache import KVCache
from simulator.engine.request import Request

# Blocks of 4 tokens, hash units of 8 tokens (2 blocks), 12 blocks in all.
BS, UNIT, CAP = 4, 8, 12


def _batcher(cap: int = CAP, offload: int = 0, **kw) -> ContinuousBatcher:
    return ContinuousBatcher(KVCache(cap, BS), 8, 64, prefix_tokens=UNIT,
                             offload_units=offload, **kw)


def _req(rid: int, prompt: int, hashes: tuple, output: int = 1) -> Request:
    r = Request(rid, 0.0, prompt, output)
    r.hashes = hashes
    return r


def _step(b: ContinuousBatcher, now: float = 1.0):
    batch = b.schedule(now)
    done = b.complete(batch, now)
    return batch, done


def _check(kv: KVCache) -> None:
    assert 0 <= kv.evictable <= kv.cached
    assert 0 <= kv.in_use <= kv.capacity
    assert kv.used + kv.cached <= kv.capacity


def test_hits_partial_blocks_and_lru_eviction():
    b = _batcher()
    kv, pc = b.kv, b.prefix
    # A: 20 tokens, units 1, 2 full (16 tokens), 4 tokens in a partial block. Nothing cached.
    a = _req(0, 20, (1, 2))
    b.add(a)
    batch, done = _step(b)
    assert (batch.prefill_tokens, batch.prefill_ctx) == (20, 0)
    assert done == [a] and a.cached_tokens == 0
    # Its two units stay cached, unreferenced: 4 blocks, counted as free.
    assert (kv.used, kv.cached, kv.evictable, kv.free) == (0, 4, 4, 12)
    # B: 17 tokens, same two units: both reused, 1 token computed, attending to 16 cached.
    bb = _req(1, 17, (1, 2))
    b.add(bb)
    batch, _ = _step(b)
    assert (batch.prefill_tokens, batch.prefill_ctx, bb.cached_tokens) == (1, 16, 16)
    assert batch.prefill_pairs == 1 * (16 + 1)  # the new token attends to 16 + itself
    # C: 16 tokens = exactly the two units: the last token's block is never reused, so only
    # unit 1 hits and 8 tokens are computed.
    c = _req(2, 16, (1, 2))
    b.add(c)
    batch, _ = _step(b)
    assert (batch.prefill_tokens, c.cached_tokens) == (8, 8)
    # D: 12 tokens: one full unit (its second unit would be partial, so it has no hash).
    d = _req(3, 12, (1,))
    b.add(d)
    batch, _ = _step(b)
    assert (batch.prefill_tokens, d.cached_tokens) == (4, 8)
    _check(kv)
    assert (kv.used, kv.cached, kv.evictable) == (0, 4, 4)
    # E: 40 tokens, 5 new units = 10 blocks; 8 are free outright, so 2 (one unit) are evicted:
    # the least recently released, and a request's tail goes first: unit 2.
    e = _req(4, 40, (7, 8, 9, 10, 11))
    b.add(e)
    _step(b)
    assert pc.evicted == 1 and 2 not in pc.refs and 1 in pc.refs
    _check(kv)
    # F: units (1, 2) again: only unit 1 is still cached.
    f = _req(5, 24, (1, 2))
    b.add(f)
    batch, _ = _step(b)
    assert f.cached_tokens == 8 and batch.prefill_tokens == 16
    _check(kv)


def test_running_requests_share_blocks_and_hold_them():
    b = _batcher()
    kv = b.kv
    a = _req(0, 20, (1, 2), output=5)
    b.add(a)
    _step(b)  # prefilled, decoding: units 1, 2 referenced by it, 1 private block
    assert (kv.used, kv.cached, kv.evictable) == (1, 4, 0)
    c = _req(1, 20, (1, 2), output=5)
    b.add(c)
    batch, _ = _step(b)
    assert c.cached_tokens == 16 and batch.prefill_tokens == 4 and batch.n_decode == 1
    # Shared blocks are held once: 4 cached + one private block each, and A's 21st token
    # (decoded in this step) opened a sixth block.
    assert kv.cached == 4 and kv.evictable == 0
    assert kv.in_use == 4 + (1 + 1) + 1
    # A referenced unit cannot be evicted: a request needing every free block waits.
    big = _req(2, 36, (20, 21, 22, 23))
    b.add(big)
    batch = b.schedule(2.0)
    assert big.state == 0 and kv.in_use <= kv.capacity  # WAITING
    b.complete(batch, 2.0)
    while a.state != 3 or c.state != 3:  # until both finish
        _step(b, 3.0)
    # Both finished: their answers' full units were cached too (20 + 4 tokens of KV: 3 units,
    # but the answers carry no hashes here, so units 1 and 2 only), now unreferenced.
    assert kv.cached - kv.evictable == kv.in_use - kv.used
    _check(kv)


def test_answer_blocks_are_cached_for_the_next_turn():
    b = _batcher()
    # Turn 1: 10 prompt tokens + 8 answer tokens; hashes describe 16 full tokens (2 units).
    t1 = _req(0, 10, (1, 2), output=8)
    b.add(t1)
    while t1.state != 3:
        _step(b)
    # KV at finish: 10 + 8 - 1 = 17 tokens: both units were computed and are cached.
    assert set(b.prefix.refs) == {1, 2} and b.kv.evictable == 4
    t2 = _req(1, 22, (1, 2))
    b.add(t2)
    _step(b)
    assert t2.cached_tokens == 16


def test_host_tier_brings_evicted_blocks_back_as_swapped_blocks():
    b = _batcher(cap=6, offload=4)
    a = _req(0, 20, (1, 2))
    b.add(a)
    _step(b)
    e = _req(1, 20, (7, 8))  # needs 5 blocks of 6: both of A's units go to the host
    b.add(e)
    _step(b)
    assert b.prefix.evicted >= 1 and set(b.prefix.host) & {1, 2}
    f = _req(2, 20, (1, 2))
    b.add(f)
    batch, _ = _step(b)
    loaded = b.prefix.loaded
    assert loaded >= 1 and f.cached_tokens == 16
    assert batch.swap_blocks == loaded * (UNIT // BS)  # priced as PCIe copies
    _check(b.kv)


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_preemption_keeps_the_accounting(preemption):
    # 10 blocks; two long decoders sharing a prefix run out and one is preempted.
    b = _batcher(cap=10, preemption=preemption, swap_blocks=20)
    reqs = [_req(i, 17, (1, 2), output=20) for i in range(2)]
    for r in reqs:
        b.add(r)
    t = 0.0
    while any(r.state != 3 for r in reqs):
        t += 1.0
        batch = b.schedule(t)
        _check(b.kv)
        if batch is not None:
            b.complete(batch, t)
        _check(b.kv)
        assert t < 500
    assert b.preemptions >= 1
    assert b.kv.used == 0 and b.kv.cached == b.kv.evictable  # everything released
    assert b.cpu_free == 20
