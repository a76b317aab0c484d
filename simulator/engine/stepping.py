"""The step timeline of a replica: what each stage of a step costs and when the step ends.

:class:`Timeline` owns the replica's stage costs, the hand-off costs between stages, the CPU
step overhead and the swap cost per KV block. With a single batch stream nothing overlaps,
so a step is one timeout of its exact total (overhead + swap + drafts + every stage + every
hand-off) and its per-stage records are laid out in sequence (:meth:`Timeline.inline`).
Runs of decode-only steps are priced here too: short ones of a one-stage replica in Python
loops (:meth:`Timeline.decode_few`, or their times alone, :meth:`Timeline.decode_times`),
long ones with numpy (:meth:`Timeline.decode_many`), each bit-identical to stepping one by
one. Times are on the clock's grid (:mod:`simulator.engine.clock`).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from itertools import accumulate, islice

import numpy as np

from simulator.engine.batching import Batch
from simulator.engine.clock import SCALE, ticks
from simulator.engine.steplog import STEP_COLUMNS
from simulator.model.cost import StageCost

_INF = float("inf")


class Timeline:
    """Step costs and end times of one replica (see the module docstring).

    Parameters
    ----------
    index : int
        Replica number (as in records).
    stages : list of StageCost
        Cost of each pipeline stage.
    sends : list of (latency_s, s_per_token)
        Hand-off cost from stage i to i + 1: ``latency + tokens * s_per_token``.
    overhead_s : float
        CPU time per step before the GPUs start.
    swap_s_per_block : float
        Seconds to copy one KV block between GPU and CPU memory.
    """

    #: Duration of the last step priced by :meth:`decode_times` (s; 0: none yet): sizes
    #: the next run's first chunk.
    step_s = 0.0

    def __init__(self, index: int, stages: list[StageCost], sends: list[tuple[float, float]],
                 overhead_s: float, swap_s_per_block: float = 0.0):
        self.index = index
        self.overhead, self.swap_s = overhead_s, swap_s_per_block
        self.one_stage = len(stages) == 1
        self.reprice(stages, sends)

    def reprice(self, stages: list[StageCost], sends: list[tuple[float, float]]) -> None:
        """Price the steps from now on with new stage and hand-off costs (the same number
        of stages)."""
        self.stages, self.stage0, self.sends = stages, stages[0], sends

    def busy_of(self, busy, steps: int):
        """Busy time of the first ``steps`` extra steps of a run (per stage, or a float)."""
        if isinstance(busy, np.ndarray):
            return busy[..., :steps].sum(axis=-1)
        if self.one_stage:
            return sum(busy[:steps])
        return [sum(b[i] for b in busy[:steps]) for i in range(len(self.stages))]

    def inline(self, start: float, tokens: int, pairs: float, ctx: int, decode_kv: int,
                sampled: int, prefill_tokens: int, n_decode: int, batch_size: int,
                kv_blocks: int, rec: Callable[[tuple], None] | None,
                swap_blocks: int = 0, draft_s: float = 0.0,
                seqs: int = 0) -> tuple[float, object]:
        """End time and busy time (a float for one stage, else per stage) of a step starting
        at ``start`` with nothing overlapping; records each stage's span (overhead and swap,
        stage, hand-off, stage, ...). Times are on the clock's grid (``start`` is), so the end
        depends on the step alone, not on when it runs."""
        off = self.overhead + swap_blocks * self.swap_s
        if draft_s:  # speculative drafts run on the replica's GPUs before the forward
            off += draft_s
        if self.one_stage:  # the loop below for a single stage, unrolled (hot path)
            compute, comm = self.stage0.step(tokens, pairs, ctx, decode_kv, sampled, seqs)
            end = round((off + compute + comm) * SCALE) / SCALE
            if rec is not None:  # (ticks(off), inline)
                rec((self.index, 0, 0, start + round(off * SCALE) / SCALE, start + end,
                     prefill_tokens, n_decode, batch_size, compute, comm, kv_blocks, pairs,
                     ctx, decode_kv, sampled))
            return start + end, compute + comm
        busy = []
        last = len(self.stages) - 1
        for i, cost in enumerate(self.stages):
            compute, comm = cost.step(tokens, pairs, ctx, decode_kv, sampled, seqs)
            end = off + compute + comm
            busy.append(compute + comm)
            if rec is not None:
                rec((self.index, i, 0, start + ticks(off), start + ticks(end), prefill_tokens,
                     n_decode, batch_size, compute, comm, kv_blocks, pairs, ctx, decode_kv,
                     sampled))
            off = end
            if i < last:
                lat, per_token = self.sends[i]
                off += lat + tokens * per_token
        return start + ticks(off), busy


    def decode_few(self, end: float | None, batch: Batch, needs: list[int],
                    horizon: float, rec: Callable[[tuple], None], now: float
                    ) -> tuple[list[float], list[float]]:
        """:meth:`inline` for a short run of decode steps of a one-stage replica, step costs
        from :meth:`StageCost.decode_run`; stops planning once a step starts after
        ``horizon``. Returns the end of each step (the scheduled one first) and the steps'
        busy times; records each step with ``rec`` (``needs`` lists the blocks each step
        allocates; without records :meth:`decode_times` gives the times). With ``end``
        None the scheduled step (no swap) starts at ``now`` and is computed first: the times
        then start with ``now`` and the busy times with the scheduled step's."""
        n = batch.n_decode
        first = end is None
        kv0 = batch.decode_kv - n if first else batch.decode_kv
        computes, comm = self.stage0.decode_run(n, kv0, len(needs) + first)
        off = self.overhead  # + 0 swapped blocks * swap_s, as _inline adds it
        t = now if first else end
        off_ticks = ticks(off)
        ends, busy = [t], []
        used, index = batch.kv_blocks, self.index
        if first:
            needs = [0, *needs]
        for j, compute in enumerate(computes, 1):
            if t > horizon and j > first:  # the arrival comes during an earlier step
                break
            nxt = t + round((off + compute + comm) * SCALE) / SCALE
            used += needs[j - 1]
            rec((index, 0, 0, t + off_ticks, nxt, 0, n, n, compute, comm, used, 0.0, 0,
                 kv0 + j * n, n))
            t = nxt
            ends.append(t)
            busy.append(compute + comm)
        return ends, busy

    def decode_times(self, end: float | None, batch: Batch, extra: int, horizon: float,
                      now: float, lag: bool = False) -> tuple[list[float], list[float], float]:
        """The times of :meth:`decode_few` without its records, in C loops: the end of
        each step (the scheduled one first; with ``end`` None it is computed too and the
        times start with ``now``), each computed step's compute time and the communication
        time. Stops once a step starts after ``horizon`` (the first computed step is kept);
        with async admission (``lag``) a newcomer joins a step later, so the times go on
        until three steps have ended after the horizon (where
        :meth:`~simulator.engine.fastpath.FastForward.joins_at` and a failure's cut then
        read the same steps as from every planned one).

        Steps are priced in chunks sized from the last step's duration, so that a run
        the horizon cuts short does not price the steps past it; ``decode_run`` of a
        later chunk from ``kv0 + c * n`` gives the values a single call would (integer
        KV counts), and the ends are summed on in the same order."""
        n = batch.n_decode
        first = end is None
        kv0 = batch.decode_kv - n if first else batch.decode_kv
        k, t = extra + first, now if first else end
        off, cost = self.overhead, self.stage0  # + 0 swapped blocks * swap_s, as _inline
        past = 3 if lag else 1  # ends after the horizon that the caller reads
        c = k
        if horizon < _INF and self.step_s > 0.0:
            c = min(k, max(int((horizon - t) / self.step_s) + 1 + past, 1))
        computes, comm = cost.decode_run(n, kv0, c)

        def step_ends(xs: list[float], start: float):
            """Each end from its start as _inline computes it, summed left to right."""
            return accumulate([round((off + x + comm) * SCALE) / SCALE for x in xs],
                              initial=start)

        ends = list(step_ends(computes, t))
        while c < k and (len(ends) < past or ends[-past] <= horizon):  # price more
            more, _ = cost.decode_run(n, kv0 + c * n, min(c, k - c))
            ends += islice(step_ends(more, ends[-1]), 1, None)
            computes += more
            c += len(more)
        if len(ends) > 1:
            self.step_s = ends[-1] - ends[-2]
        if not lag and horizon < ends[-1]:  # keep the steps that start by the horizon
            ends = ends[: max(bisect.bisect_right(ends, horizon), first) + 1]  # and the 1st
        return ends, computes, comm

    def decode_many(self, end: float, batch: Batch, needs: list[int], records: bool
                     ) -> tuple[np.ndarray, np.ndarray, dict | None]:
        """:meth:`inline` for a run of decode steps, vectorized: the same operations in the
        same order per element, so ends and records are bit-identical. Returns the end of
        each step (the scheduled one first), the extra steps' busy time (per stage), and,
        if ``records``, the steps' records as columns (step-major, stage-minor order)."""
        n, k = batch.n_decode, len(needs)
        kv = np.arange(batch.decode_kv + n, batch.decode_kv + n * k + 1, n)
        if self.one_stage and not records:
            compute, comm = self.stage0.decode_steps(n, kv)
            busy = compute + comm
            q = self.overhead + compute
            q += comm
            q *= SCALE
            np.rint(q, out=q)
            q /= SCALE
            q[0] += end  # exact: every term is on the clock grid
            return np.concatenate(([end], q.cumsum())), busy, None
        off = np.full(k, self.overhead)
        busy = []
        spans = []
        last = len(self.stages) - 1
        for i, cost in enumerate(self.stages):
            compute, comm = cost.decode_steps(n, kv)
            stage_end = off + compute + comm
            busy.append(compute + comm)
            spans.append((off, stage_end, compute, comm))
            off = stage_end
            if i < last:
                lat, per_token = self.sends[i]
                off = off + (lat + n * per_token)
        ends = end + np.cumsum(np.rint(off * SCALE) / SCALE)
        starts = np.concatenate(([end], ends[:-1]))
        bulk = None
        if records:
            p = len(self.stages)

            def interleave(per_stage: list[np.ndarray]) -> np.ndarray:
                if p == 1:
                    return per_stage[0]
                return np.stack(per_stage, axis=1).reshape(-1)  # step-major, stage-minor

            used = batch.kv_blocks + np.cumsum(needs)
            bulk = dict(zip(STEP_COLUMNS, [  # the step record's fields, as columns
                np.full(k * p, self.index),
                np.tile(np.arange(p), k) if p > 1 else np.zeros(k, dtype=np.int64),
                np.zeros(k * p, dtype=np.int64),
                interleave([np.rint(a * SCALE) / SCALE + starts for a, *_ in spans]),
                interleave([np.rint(b * SCALE) / SCALE + starts for _, b, *_ in spans]),
                np.zeros(k * p, dtype=np.int64),
                np.full(k * p, n), np.full(k * p, n),
                interleave([c for *_, c, _ in spans]),
                interleave([np.full(k, m) for *_, m in spans]),
                np.repeat(used, p) if p > 1 else used,
                np.zeros(k * p), np.zeros(k * p, dtype=np.int64),
                np.repeat(kv, p) if p > 1 else kv,
                np.full(k * p, n),
            ], strict=True))
        busy = busy[0] if self.one_stage else np.vstack(busy)
        return np.concatenate(([end], ends)), busy, bulk
