"""The decode-run fast path of a single-stream replica: the scheduled decode step and the
decode-only steps that follow it with nothing else changing are advanced in one event, with
the same times and records as stepping one by one (:meth:`DecodeRunPath._decode_run`).
Short runs of a one-stage replica loop in Python (:meth:`DecodeRunPath._decode_few`), long
ones use numpy (:meth:`DecodeRunPath._decode_many`); with ``run_ahead`` a run that ends
before the next arrival is applied ahead of the clock.

A mixin of :class:`~simulator.engine.replica.Replica` (and of
:class:`~simulator.engine.stepping.InlineSteps`, whose ``_inline``, ``_count``, ``_record``
it calls). Which steps a run may take is the stream's business
(:mod:`simulator.engine.decoderun`).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from itertools import accumulate, islice

import numpy as np
import simpy

from simulator.engine.batching import Batch
from simulator.engine.clock import SCALE, ticks

#: Runs at least this long are computed with numpy rather than step by step (longer when
#: per-step records are kept: building their columns costs more than a short Python loop).
VECTOR_MIN = 32
VECTOR_MIN_RECORDS = 48
#: Fewest steps planned for a decode run that arrivals keep cutting short.
MIN_RUN = 16
#: Most decode steps advanced in one event (bounds the records held for an interruptible run).
MAX_RUN = 512
_INF = float("inf")


class DecodeRunPath:
    """Runs of decode-only steps in one event (see the module docstring)."""

    #: Duration of the last step priced by :meth:`_decode_times` (s; 0: none yet): sizes
    #: the next run's first chunk.
    _step_s = 0.0

    def _decode_run(self, s: int, batch: Batch, end: float | None, extra: int, gen: int,
                    now: float, first_rows: list[tuple] = (), first: tuple | None = None):
        """Run the scheduled decode step and the ``extra`` decode-only steps after it in
        one event, with the same times and records as stepping one by one. ``end`` is when
        the scheduled step ends, or None for a short run of a one-stage replica: the
        scheduled step is then computed (and counted) with the others; else
        ``first_rows`` are its records and ``first`` its (tokens, busy time), both kept once
        it ends. Returns when the run's last
        applied step ended: ``env.now``, or later when the replica runs ahead. A failure
        during the run keeps the records of the steps that ended before it (whose tokens
        :meth:`fail` counts) and drops the rest.

        Step j reads ``decode_kv + j * n`` KV entries; its end is computed from its start
        exactly as a single step would be. An arrival that could join the batch interrupts
        the run: it stops at the end of the step in progress, where a step-by-step schedule
        would have admitted the newcomer.
        """
        env, n, stream = self.env, batch.n_decode, self.streams[s]
        rows: list[tuple] = []
        rec = rows.append if self.record_step is not None else None
        # Blocks allocated per step: only the per-step records need them.
        needs = stream.run_needs(extra) if rec is not None else None
        bulk = None
        horizon = self.next_arrival() if self.next_arrival is not None else float("inf")
        # Async admission: a newcomer joins a step later, so plan past the arrival.
        plan_h = float("inf") if self.lag else horizon
        compact = None  # a short run's records, kept as one tuple (see _compact)
        planned = extra  # with async admission a short run's times may stop short of it
        if extra >= (VECTOR_MIN if rec is None else VECTOR_MIN_RECORDS):
            ends, busy, bulk = self._decode_many(end, batch, needs or [0] * extra,
                                                 rec is not None)
        elif self._one_stage:
            if rec is None or self.record_run is not None:  # the times alone, in C loops
                ends, computes, comm = self._decode_times(end, batch, extra, horizon, now,
                                                          self.lag)
                busy = [c + comm for c in computes[: len(ends) - 1]]
                if rec is not None:  # the records kept compact, from the times
                    lead = end is None
                    compact = (self.index, ends, ticks(self.overhead), n, computes, comm,
                               batch.kv_blocks, [0, *needs] if lead else needs,
                               batch.decode_kv - n if lead else batch.decode_kv)
            elif end is None and self.run_ahead and not self.lag:
                # Running ahead (no faults): every step the loop records is applied (each
                # starts by the horizon), in order: record them straight away.
                ends, busy = self._decode_few(end, batch, needs, horizon, self.record_step,
                                              now)
            else:
                ends, busy = self._decode_few(end, batch, needs, plan_h, rec, now)
            if end is None:  # the scheduled step came first: keep it apart from the rest
                first = (n, busy[0])
                ends, busy = ends[1:], busy[1:]
                if rows:
                    first_rows = [rows.pop(0)]
            extra = len(ends) - 1
        else:
            needs = needs or [0] * extra
            ends, busy = [end], []
            used, t = batch.kv_blocks, end
            for j, need in enumerate(needs, 1):
                if t > horizon:  # the arrival comes during an earlier step: stop planning
                    break
                used += need
                t, b = self._inline(t, n, 0.0, 0, batch.decode_kv + j * n, n, 0, n, n, used,
                                    rec)
                ends.append(t)
                busy.append(b)
            extra = len(ends) - 1
        steps = extra
        if self.lag:  # the steps planned, as load views and the run length count them
            extra = planned
        self._runs[s] = (ends, extra)
        if self.next_arrival is not None:
            # The next arrival is known (open loop, one replica): stop at the step in progress
            # when it comes; nothing else can join earlier, so no interrupt is needed.
            steps = min(self._joins_at(ends, horizon, now), steps)
            self._run_len[s] = (min(2 * self._run_len[s], MAX_RUN) if steps == extra
                                else max(MIN_RUN, 2 * steps))
            stop = float(ends[steps])
            if not (self.run_ahead and stop < horizon):  # else: applied ahead of the clock
                yield env.timeout(stop - env.now)
        else:
            self._running[s] = True
            try:
                yield env.timeout(float(ends[-1]) - env.now)
                # Uncut: plan longer runs next time (any length gives identical results;
                # planning far past the next interruption only wastes work).
                self._run_len[s] = min(2 * self._run_len[s], MAX_RUN)
            except simpy.Interrupt:
                steps = min(self._joins_at(ends, env.now, now), steps)
                self._run_len[s] = max(MIN_RUN, 2 * steps)
                yield env.timeout(float(ends[steps]) - env.now)
            self._running[s] = False
        if self.generation != gen:
            # A failure cut the run: keep the records of the steps that ended before it (as
            # fail() counts their tokens).
            done = min(int(np.searchsorted(ends, self.failed_at[gen], side="right")),
                       len(ends) - 1)
            if done:
                if first is not None:
                    self._count(1, *first)
                self._record(first_rows)
                self._keep(rows, bulk, done - 1)
                self._compact(compact, end is None, done - 1)
                self._count(done - 1, (done - 1) * n, self._busy_of(busy, done - 1))
            return now
        self._runs[s] = None
        if steps:
            self._started = float(ends[steps - 1])  # the last step applied started there
        stream.skip_decode_steps(steps, ends)
        if self._one_stage and type(busy) is list:  # the calls below, unrolled (hot path)
            stage_busy = self.stage_busy_s
            if first is not None:
                self.steps += 1
                self.step_tokens += first[0]
                b = float(first[1])
                stage_busy[0] += b
                self.union_s += b
            self.steps += steps
            self.step_tokens += steps * n
            b = float(sum(busy[:steps]))
            stage_busy[0] += b
            self.union_s += b
            record = self.record_step
            if record is not None:
                for row in first_rows:
                    record(row)
                for row in rows[:steps]:
                    record(row)
                self._compact(compact, end is None, steps)
            return float(ends[steps])
        if first is not None:
            self._count(1, *first)
        self._count(steps, steps * n, self._busy_of(busy, steps))
        self._record(first_rows)
        self._keep(rows, bulk, steps)
        return float(ends[steps])

    def _joins_at(self, ends, t: float, now: float) -> int:
        """Index into ``ends`` of the step end at which a request queued at ``t`` is first
        admitted: the end of the step in progress at ``t``; with async admission the first
        end whose step started at or after ``t`` (the scheduled step started at ``now``, step
        i >= 1 at ``ends[i - 1]``), one step later."""
        if not self.lag:
            return bisect.bisect_right(ends, t)
        return 0 if t <= now else bisect.bisect_left(ends, t) + 1

    def _busy_of(self, busy, steps: int):
        """Busy time of the first ``steps`` extra steps of a run (per stage, or a float)."""
        if isinstance(busy, np.ndarray):
            return busy[..., :steps].sum(axis=-1)
        if self._one_stage:
            return sum(busy[:steps])
        return [sum(b[i] for b in busy[:steps]) for i in range(len(self.stages))]

    def _compact(self, run: tuple | None, lead: bool, steps: int) -> None:
        """Records of a short run kept in compact form: the scheduled step if it came
        first (``lead``) and the first ``steps`` extra steps (as ``record_run`` takes them)."""
        m = lead + steps
        if run is not None and m:
            index, ends, off, n, computes, comm, used, needs, kv = run
            self.record_run((index, ends[: m + 1], off, n, computes[:m], comm, used, needs[:m],
                             kv))

    def _keep(self, rows: list[tuple], bulk: dict | None, steps: int) -> None:
        """Records of the first ``steps`` extra steps of a run (rows or bulk columns)."""
        if bulk is not None:
            self.record_bulk({k: v[: steps * len(self.stages)] for k, v in bulk.items()})
        elif rows:
            self._record(rows[: steps * len(self.stages)])

    def _decode_few(self, end: float | None, batch: Batch, needs: list[int],
                    horizon: float, rec: Callable[[tuple], None], now: float
                    ) -> tuple[list[float], list[float]]:
        """:meth:`_inline` for a short run of decode steps of a one-stage replica, step costs
        from :meth:`StageCost.decode_run`; stops planning once a step starts after
        ``horizon``. Returns the end of each step (the scheduled one first) and the steps'
        busy times; records each step with ``rec`` (``needs`` lists the blocks each step
        allocates; without records :meth:`_decode_times` gives the times). With ``end``
        None the scheduled step (no swap) starts at ``now`` and is computed first: the times
        then start with ``now`` and the busy times with the scheduled step's."""
        n = batch.n_decode
        first = end is None
        kv0 = batch.decode_kv - n if first else batch.decode_kv
        computes, comm = self._stage0.decode_run(n, kv0, len(needs) + first)
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

    def _decode_times(self, end: float | None, batch: Batch, extra: int, horizon: float,
                      now: float, lag: bool = False) -> tuple[list[float], list[float], float]:
        """The times of :meth:`_decode_few` without its records, in C loops: the end of
        each step (the scheduled one first; with ``end`` None it is computed too and the
        times start with ``now``), each computed step's compute time and the communication
        time. Stops once a step starts after ``horizon`` (the first computed step is kept);
        with async admission (``lag``) a newcomer joins a step later, so the times go on
        until three steps have ended after the horizon (:meth:`_joins_at` and a failure's
        cut then read the same steps as from every planned one).

        Steps are priced in chunks sized from the last step's duration, so that a run
        the horizon cuts short does not price the steps past it; ``decode_run`` of a
        later chunk from ``kv0 + c * n`` gives the values a single call would (integer
        KV counts), and the ends are summed on in the same order."""
        n = batch.n_decode
        first = end is None
        kv0 = batch.decode_kv - n if first else batch.decode_kv
        k, t = extra + first, now if first else end
        off, cost = self.overhead, self._stage0  # + 0 swapped blocks * swap_s, as _inline
        past = 3 if lag else 1  # ends after the horizon that the caller reads
        c = k
        if horizon < _INF and self._step_s > 0.0:
            c = min(k, max(int((horizon - t) / self._step_s) + 1 + past, 1))
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
            self._step_s = ends[-1] - ends[-2]
        if not lag and horizon < ends[-1]:  # keep the steps that start by the horizon
            ends = ends[: max(bisect.bisect_right(ends, horizon), first) + 1]  # and the 1st
        return ends, computes, comm

    def _decode_many(self, end: float, batch: Batch, needs: list[int], records: bool
                     ) -> tuple[np.ndarray, np.ndarray, dict | None]:
        """:meth:`_inline` for a run of decode steps, vectorized: the same operations in the
        same order per element, so ends and records are bit-identical. Returns the end of
        each step (the scheduled one first), the extra steps' busy time (per stage), and,
        if ``records``, the steps' records as columns (step-major, stage-minor order)."""
        n, k = batch.n_decode, len(needs)
        kv = np.arange(batch.decode_kv + n, batch.decode_kv + n * k + 1, n)
        if self._one_stage and not records:
            compute, comm = self._stage0.decode_steps(n, kv)
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
            bulk = {
                "replica": np.full(k * p, self.index),
                "stage": np.tile(np.arange(p), k) if p > 1 else np.zeros(k, dtype=np.int64),
                "stream": np.zeros(k * p, dtype=np.int64),
                "start_s": interleave([np.rint(a * SCALE) / SCALE + starts for a, *_ in spans]),
                "end_s": interleave([np.rint(b * SCALE) / SCALE + starts for _, b, *_ in spans]),
                "prefill_tokens": np.zeros(k * p, dtype=np.int64),
                "decode_tokens": np.full(k * p, n), "batch_size": np.full(k * p, n),
                "compute_s": interleave([c for *_, c, _ in spans]),
                "comm_s": interleave([np.full(k, m) for *_, m in spans]),
                "kv_blocks": np.repeat(used, p) if p > 1 else used,
                "prefill_pairs": np.zeros(k * p), "prefill_ctx": np.zeros(k * p, dtype=np.int64),
                "decode_kv": np.repeat(kv, p) if p > 1 else kv,
                "sampled": np.full(k * p, n),
            }
        busy = busy[0] if self._one_stage else np.vstack(busy)
        return np.concatenate(([end], ends)), busy, bulk
