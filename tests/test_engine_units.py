"""The replica's pieces on their own (simulator.engine.{replica,stepping,fastpath,pipeline,
failure}): a tiny replica with stub stage costs whose every step time is known, so each
timeline below is computed by hand.

The stub's costs are dyadic (powers of two): sums of them are exact in floating point and
already on the clock's grid, so the expected times are exact, not approximate.
"""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from simulator.engine.batching import ContinuousBatcher
from simulator.engine.kvcache import KVCache
from simulator.engine.replica import MIN_RUN, VECTOR_MIN_RECORDS, Inbox, MicroBatch, Replica
from simulator.engine.request import Request
from simulator.engine.steplog import StepLog
from simulator.metrics.records import STEP_COLUMNS, Recorder

A = 2.0**-7  # s: fixed compute per step
B = 2.0**-20  # s per KV entry read by decoders
C = 2.0**-16  # s per token in the step
COMM = 2.0**-9  # s: communication per step and stage
OVERHEAD = 2.0**-10  # s: CPU time per step before the GPUs start
LAT, PER_TOKEN = 2.0**-12, 2.0**-18  # hand-off between stages: s, s per token


class ConstCost:
    """A StageCost stub: ``compute = A + B * decode_kv + C * tokens``, ``comm = COMM``."""

    def step(self, tokens, pairs, ctx, decode_kv, sampled, seqs=0):
        return A + B * decode_kv + C * tokens, COMM

    def decode_run(self, n, decode_kv, k):
        return [A + B * (decode_kv + j * n) + C * n for j in range(1, k + 1)], COMM

    def decode_steps(self, n, decode_kv):
        return A + B * decode_kv + C * n, COMM


def _replica(fast: bool = True, stages: int = 1, streams: int = 1, records: bool = True):
    env = simpy.Environment()
    rows, bulks, done = [], [], []
    rep = Replica(env, 0, [ContinuousBatcher(KVCache(200, 16), 8, 256) for _ in range(streams)],
                  [ConstCost() for _ in range(stages)], [(LAT, PER_TOKEN)] * (stages - 1),
                  OVERHEAD, done.append, rows.append if records else None, fast=fast,
                  record_bulk=bulks.append)
    return env, rep, rows, bulks, done


def _columns(rows: list[tuple], bulks: list[dict]) -> dict[str, np.ndarray]:
    """Every record as columns, in time order (rows and bulk records together)."""
    cols = {c: np.array([r[i] for r in rows]) for i, c in enumerate(STEP_COLUMNS)}
    for b in bulks:
        cols = {c: np.concatenate([cols[c], b[c]]) for c in STEP_COLUMNS}
    order = np.lexsort((cols["stage"], cols["start_s"]))
    return {c: v[order] for c, v in cols.items()}


def _hand_timeline(prompts: list[int], output: int, stages: int = 1):
    """Per stage record (start, end, decode_kv, compute) of a batch of requests arriving
    together at 0 whose prompts fit one step: one prefill step of ``sum(prompts)`` tokens
    (it samples every request's first token), then ``output - 1`` decode steps of
    ``n = len(prompts)`` tokens, step j reading ``sum(prompts) + j * n`` KV entries."""
    n, p = len(prompts), sum(prompts)
    out, t = [], 0.0
    for j in range(output):
        tokens, kv = (p, 0) if j == 0 else (n, p + j * n)
        compute = A + B * kv + C * tokens
        off = t + OVERHEAD
        for i in range(stages):
            out.append((off, off + compute + COMM, kv, compute))
            off += compute + COMM
            if i < stages - 1:
                off += LAT + tokens * PER_TOKEN
        t = off
    return out, t


@pytest.mark.parametrize(("output", "stages"), [(20, 1), (120, 1), (20, 2), (120, 2)])
def test_decode_run_hand_timeline(output, stages):
    # 20 tokens: a short run (Python loop); 120: a long one (numpy columns, bulk records).
    env, rep, rows, bulks, done = _replica(stages=stages)
    for rid, prompt in enumerate((40, 24)):
        rep.submit(Request(rid, 0.0, prompt, output))
    env.run()
    expected, finish = _hand_timeline([40, 24], output, stages)
    cols = _columns(rows, bulks)
    assert len(cols["start_s"]) == output * stages
    assert cols["start_s"].tolist() == [e[0] for e in expected]
    assert cols["end_s"].tolist() == [e[1] for e in expected]
    assert cols["decode_kv"].tolist() == [e[2] for e in expected]
    assert cols["compute_s"].tolist() == [e[3] for e in expected]
    assert cols["stage"].tolist() == list(range(stages)) * output
    assert cols["decode_tokens"].tolist() == [0] * stages + [2] * (output - 1) * stages
    # First token at the end of the prefill step, the last at the end of the last step.
    first_end = expected[stages - 1][1]
    assert [(r.first_token_s, r.finish_s) for r in done] == [(first_end, finish)] * 2
    assert env.now == finish
    assert rep.steps == output and rep.step_tokens == 64 + 2 * (output - 1)
    busy = sum(e[3] + COMM for e in expected[::stages])
    assert rep.stage_busy_s[0] == pytest.approx(busy, rel=1e-12)
    assert rep.union_s == pytest.approx(sum(e[3] + COMM for e in expected), rel=1e-12)
    # The fast path ran (uncut runs double the planned length: 16, 32, 64 extra steps, ...)
    # and the runs of at least VECTOR_MIN_RECORDS steps came as bulk columns.
    assert rep.ff.run_len[0] > MIN_RUN
    assert bool(bulks) == (output - 1 > 1 + 16 + 1 + 32 + 1 + VECTOR_MIN_RECORDS)


@pytest.mark.parametrize("records", [True, False])
def test_decode_run_equals_step_by_step(records):
    results = []
    for fast in (True, False):
        env, rep, rows, bulks, done = _replica(fast=fast, stages=2, records=records)
        for rid, (prompt, output) in enumerate([(40, 90), (24, 30), (100, 200)]):
            rep.submit(Request(rid, 0.0, prompt, output))
        env.run()
        results.append(([(r.id, r.first_token_s, r.finish_s) for r in done],
                        {c: v.tolist() for c, v in _columns(rows, bulks).items()},
                        rep.steps, rep.step_tokens))
    assert results[0] == results[1]


def test_router_views_exact_during_a_decode_run():
    # Mid-run, the replica reports what a step-by-step replica would show at that time.
    views = []
    for fast in (True, False):
        env, rep, *_ = _replica(fast=fast)
        rep.submit(Request(0, 0.0, 40, 300))
        env.run(until=1.0)
        views.append((rep.kv_used_fraction, rep.load_tokens, rep.unclaimed_blocks(0)))
        assert (rep.ff.runs[0] is not None) == fast  # the fast replica is in a decode run
    expected, _ = _hand_timeline([40], 300)
    decoded = sum(e[1] <= 1.0 for e in expected[1:])  # decode steps ended by t = 1 s
    kv = 40 + decoded  # KV tokens held: the prompt and every token fed back since
    assert views[0][:2] == views[1][:2] == (-(-kv // 16) / 200, kv)
    # Free blocks for a newcomer: a run in progress holds back the blocks it will take.
    assert views[1][2] == 200 - (-(-kv // 16)) and views[0][2] <= views[1][2]


def test_failure_mid_run_keeps_the_steps_that_ended():
    env, rep, rows, bulks, done = _replica()
    req = Request(0, 0.0, 40, 300)
    rep.submit(req)
    expected, _ = _hand_timeline([40], 300)
    ends = [e[1] for e in expected]
    t = (ends[10] + ends[11]) / 2  # during the 12th step (the 11th decode step)
    env.run(until=t)
    assert rep.ff.runs[0] is not None  # in a decode run
    lost = rep.fail()
    env.run(until=2 * t)
    assert lost == [req]
    assert req.generated == 11  # the prefill step's token and ten decode steps'
    cols = _columns(rows, bulks)
    assert cols["end_s"].tolist() == ends[:11]
    assert rep.steps == 11 and not done and not rep.up


def test_inline_step_record_layout():
    # One step of two stages at t = 1: overhead, stage 0, hand-off, stage 1, in sequence.
    env, rep, *_ = _replica(stages=2)
    rows: list[tuple] = []
    start = 1.0
    end, busy = rep.timeline.inline(start, 96, 1234.0, 7, 500, 3, 64, 32, 35, 12, rows.append,
                                    swap_blocks=0, draft_s=2.0**-8)
    compute = A + B * 500 + C * 96
    s0 = start + OVERHEAD + 2.0**-8  # drafts run before the first stage
    s1 = s0 + compute + COMM + LAT + 96 * PER_TOKEN
    assert rows == [
        (0, 0, 0, s0, s0 + compute + COMM, 64, 32, 35, compute, COMM, 12, 1234.0, 7, 500, 3),
        (0, 1, 0, s1, s1 + compute + COMM, 64, 32, 35, compute, COMM, 12, 1234.0, 7, 500, 3)]
    assert tuple(STEP_COLUMNS[:4]) == ("replica", "stage", "stream", "start_s")
    assert end == s1 + compute + COMM
    assert busy == [compute + COMM, compute + COMM]
    # Without a recorder the same times come back and nothing is recorded.
    assert rep.timeline.inline(start, 96, 1234.0, 7, 500, 3, 64, 32, 35, 12, None,
                               draft_s=2.0**-8) == (end, busy)


def test_inline_step_one_stage_with_swap():
    env, rep, *_ = _replica(stages=1)
    rows: list[tuple] = []
    rep.timeline.swap_s = 2.0**-14
    end, busy = rep.timeline.inline(0.5, 10, 0.0, 0, 0, 1, 10, 0, 1, 1, rows.append, swap_blocks=4)
    compute = A + C * 10
    assert rows == [(0, 0, 0, 0.5 + OVERHEAD + 4 * 2.0**-14, end, 10, 0, 1, compute, COMM, 1,
                     0.0, 0, 0, 1)]
    assert end == 0.5 + OVERHEAD + 4 * 2.0**-14 + compute + COMM and busy == compute + COMM


def test_inbox_is_fifo_and_hands_over_to_a_waiting_stage():
    env = simpy.Environment()
    box = Inbox()
    items = [MicroBatch(None, env.event(), s) for s in range(3)]
    for mb in items:
        box.put(mb)  # nobody waits: queued, no event
    assert list(box.items) == items and box.waiter is None
    assert [box.items.popleft().stream for _ in range(3)] == [0, 1, 2]
    box.waiter = waiter = env.event()
    box.put(items[1])  # a stage waits: it gets the item at once, nothing is queued
    assert not box.items and box.waiter is None
    assert waiter.triggered and waiter.value is items[1]
    box.put(items[2])  # the waiter was used up: queued again
    assert list(box.items) == [items[2]]


def test_two_streams_overlap_in_the_pipeline():
    # Two streams, two stages, one prefill-only request each (output 1): stream 1's batch
    # waits in stage 0's inbox while stream 0's runs there, then follows it down the pipe.
    env, rep, rows, _, done = _replica(stages=2, streams=2)
    rep.submit(Request(0, 0.0, 40, 1))
    rep.submit(Request(1, 0.0, 24, 1))
    env.run()
    d0, d1 = A + C * 40 + COMM, A + C * 24 + COMM  # stage time of each batch
    h0, h1 = LAT + 40 * PER_TOKEN, LAT + 24 * PER_TOKEN  # their hand-offs
    a0 = OVERHEAD  # stream 0 on stage 0
    a1 = a0 + d0  # stream 1 waits for stage 0
    b0 = a0 + d0 + h0  # stream 0 on stage 1
    b1 = max(a1 + d1 + h1, b0 + d0)
    got = sorted((r[3], r[1], r[2], r[4]) for r in rows)
    assert got == sorted([(a0, 0, 0, a0 + d0), (a1, 0, 1, a1 + d1), (b0, 1, 0, b0 + d0),
                          (b1, 1, 1, b1 + d1)])
    assert sorted(r.finish_s for r in done) == [b0 + d0, b1 + d1]
    # Busy union: stage spans overlap, so it is less than the sum of the busy times.
    assert rep.union_s < sum(rep.stage_busy_s)
    assert rep.steps == 2


def test_step_log_takes_every_record_form_and_counts_inline_steps():
    rows, runs, cols = [], [], []
    log = StepLog(2, rows.append, runs.append, cols.append)
    log.count(2, 10, [0.5, 0.25])  # two steps of two stages, nothing overlapping
    assert (log.steps, log.step_tokens, log.stage_busy_s, log.union_s) == (2, 10, [0.5, 0.25],
                                                                            0.75)
    # The first two steps of a run's rows: two stages each.
    log.keep([(i,) for i in range(6)], None, 2)
    assert rows == [(0,), (1,), (2,), (3,)]
    log.keep([], {"end_s": np.arange(6.0)}, 2)  # or its columns
    assert cols[0]["end_s"].tolist() == [0.0, 1.0, 2.0, 3.0]
    # A short run in compact form: the scheduled step (lead) and one extra step of three.
    run = (0, [0.0, 1.0, 2.0, 3.0], 0.25, 4, [0.5, 0.6, 0.7], 0.1, 9, [1, 2, 3], 100)
    log.compact(run, True, 1)
    assert runs == [(0, [0.0, 1.0, 2.0], 0.25, 4, [0.5, 0.6], 0.1, 9, [1, 2], 100)]
    # Without per-step rows there is no compact form either.
    assert StepLog(1, None, runs.append).run is None
    # The recorder's steps table has the record's fields, in order.
    assert list(Recorder().steps_frame().columns) == STEP_COLUMNS
