"""The event loop's shortcuts against their plain definitions: a short decode
run's times priced in chunks (:meth:`Timeline.decode_times`), the decode-only
schedule that builds its Batch at once (:meth:`ContinuousBatcher.schedule`), the blocks
a planned run allocates counted once (:meth:`DecodeRuns.decode_run`,
:meth:`DecodeRuns.skip_decode_steps`) and ``pull`` reporting the next arrival.

Stub step costs are dyadic (powers of two), so the hand-computed times are exact.
"""

from __future__ import annotations

import copy
from itertools import accumulate
from types import SimpleNamespace

import pytest
import simpy

from simulator.cluster.simulation import Cluster
from simulator.engine.batching import Batch, ContinuousBatcher
from simulator.engine.clock import ticks
from simulator.engine.kvcache import KVCache
from simulator.engine.replica import Replica
from simulator.engine.request import Request

A = 2.0**-7  # s: fixed compute per step
B = 2.0**-18  # s per KV entry read
COMM = 2.0**-9  # s per step
OVERHEAD = 2.0**-10  # s: CPU time per step


class KVCost:
    """A StageCost stub: ``compute = A + B * decode_kv``, ``comm = COMM``; counts the
    decode steps it prices."""

    def __init__(self) -> None:
        self.priced = 0

    def step(self, tokens, pairs, ctx, decode_kv, sampled, seqs=0):
        return A + B * decode_kv, COMM

    def decode_run(self, n, decode_kv, k):
        self.priced += k
        return [A + B * (decode_kv + j * n) for j in range(1, k + 1)], COMM


def _replica(cost: KVCost) -> Replica:
    return Replica(simpy.Environment(), 0, [ContinuousBatcher(KVCache(10_000, 16), 64, 4096)],
                   [cost], [], OVERHEAD, lambda req: None, None)


def _hand_ends(start: float, n: int, kv0: int, k: int) -> list[float]:
    """Ends of k decode steps of n sequences from ``start``, step j reading kv0 + j * n."""
    return list(accumulate([OVERHEAD + A + B * (kv0 + j * n) + COMM for j in range(1, k + 1)],
                           initial=start))


@pytest.mark.parametrize("estimate", [0.0, 2.0**-12, 2.0**-6, 1.0])
@pytest.mark.parametrize("horizon", [0.05, 0.2, 0.37, float("inf")])
@pytest.mark.parametrize("lag", [False, True])
def test_chunked_decode_times_equal_the_hand_timeline(estimate, horizon, lag):
    # 40 steps of 4 sequences from t = 0 (the scheduled one first): the ends are the hand
    # timeline, cut after the first step that starts past the horizon, or (async
    # admission) after three steps that end past it; whatever the chunks' size estimate.
    cost = KVCost()
    rep = _replica(cost)
    rep.timeline.step_s = estimate
    batch = Batch(4, 1000 + 4, [], 0, 0.0, 0, 4, 0)
    ends, computes, comm = rep.timeline.decode_times(None, batch, 39, horizon, 0.0, lag)
    full = _hand_ends(0.0, 4, 1000, 40)
    assert comm == COMM
    assert ends == full[: len(ends)]  # exact: dyadic costs on the clock grid
    assert computes[: len(ends) - 1] == [A + B * (1000 + j * 4) for j in range(1, len(ends))]
    after = [e for e in full if e > horizon]
    if lag:
        assert len(ends) == len(full) or sum(e > horizon for e in ends) >= 3
        assert len(ends) == len(full) or ends[-3] > horizon
    else:
        assert ends == full[: max(sum(e <= horizon for e in full), 1) + 1]
    if after and lag:  # priced no more than the chunk that passed the horizon
        assert cost.priced <= len(full) - 1
    if not after:
        assert ends == full
    assert rep.timeline.step_s == full[len(computes)] - full[len(computes) - 1]


def test_chunked_pricing_skips_the_steps_past_the_horizon():
    # With the last step's duration known, a run cut early by the horizon prices its
    # kept steps and two more, not the 200 planned.
    cost = KVCost()
    rep = _replica(cost)
    step = OVERHEAD + A + B * 1004 + COMM
    rep.timeline.step_s = ticks(step)
    batch = Batch(4, 1004, [], 0, 0.0, 0, 4, 0)
    ends, _, _ = rep.timeline.decode_times(None, batch, 199, 10 * step, 0.0)
    assert len(ends) - 1 <= 11
    assert cost.priced <= 13


def _decoding(n: int, outputs: int = 1000) -> ContinuousBatcher:
    """A stream with n decoders (prompts 20 + 7 i tokens), nothing else."""
    st = ContinuousBatcher(KVCache(1000, 16), 64, 4096)
    for i in range(n):
        st.add(Request(i, 0.0, 20 + 7 * i, outputs + i))
    st.complete(st.schedule(0.0), 1.0)
    assert len(st.decoding) == n and not st.waiting and not st.prefilling
    return st


def _fields(b: Batch) -> dict:
    return {f: getattr(b, f) for f in Batch.__slots__}


@pytest.mark.parametrize("steps", [0, 1, 5, 13, 40])
def test_decode_only_schedule_equals_the_general_path(steps):
    # The decode-only Batch is the one _schedule_decodes + _batch give, with the same
    # blocks allocated, at every residue of the block size.
    st = _decoding(6)
    for j in range(steps):
        st.complete(st.schedule(1.0 + j), 2.0 + j)
    ref = copy.deepcopy(st)
    fast = st.schedule(9.0)
    plain = ref._batch(ref._schedule_decodes(9.0), [])
    assert _fields(fast) == _fields(plain)
    assert (st.kv.used, st.kv.peak) == (ref.kv.used, ref.kv.peak)


def test_decode_only_schedule_preempts_as_before():
    # Blocks short: the general path preempts (recompute), the victim waits.
    st = _decoding(6)
    st.kv.used = st.kv.capacity  # every block taken
    ref = copy.deepcopy(st)
    got = st.schedule(3.0)
    ref_n = ref._schedule_decodes(3.0)
    assert got.n_decode == ref_n == len(st.decoding) < 6
    assert len(st.waiting) == 6 - got.n_decode


@pytest.mark.parametrize("cut", [0, 1])
def test_skip_decode_steps_allocates_the_run_blocks(cut):
    # An uncut run allocates the blocks decode_run counted; a run cut one step short
    # the blocks of its own steps.
    st = _decoding(5, outputs=60)
    st.complete(st.schedule(1.0), 2.0)
    st.schedule(2.0)
    steps = st.decode_run(100)
    assert steps > 1
    want = st.run_blocks(steps - cut)
    before = st.kv.used
    st.skip_decode_steps(steps - cut, [3.0 + j for j in range(steps)])
    assert st.kv.used - before == want


def test_pull_returns_the_next_arrival():
    got = []
    fake = SimpleNamespace(submit=lambda req, t: got.append((req.id, t)),
                           _new=lambda i, t, p, o: Request(i, t, p, o),
                           next_arrival_s=0.0)
    pull = Cluster._puller(fake, [1.0, 2.0, 2.0, 5.0], [10] * 4, [3] * 4)
    assert pull(0.5) == 1.0 and got == []
    assert pull(2.0) == 5.0 and got == [(0, 1.0), (1, 2.0), (2, 2.0)]
    assert pull(9.0) == float("inf") and got[-1] == (3, 5.0)
    assert fake.next_arrival_s == float("inf")
