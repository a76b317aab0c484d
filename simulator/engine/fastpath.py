"""The decode-run fast path of a single-stream replica: the scheduled decode step and the
decode-only steps that follow it with nothing else changing are advanced in one event, with
the same times and records as stepping one by one (:meth:`FastForward.decode_run`); with
``run_ahead`` a run that ends before the next arrival is applied ahead of the clock.

:class:`FastForward` owns the state of the runs (the run under way per stream, whether an
arrival may cut it, the length to plan next); the replica's step timeline
(:class:`~simulator.engine.stepping.Timeline`) prices the steps, its step log
(:class:`~simulator.engine.steplog.StepLog`) takes their aggregates and records, and what
it reads of the replica itself is the small :class:`RunHost` protocol. Which steps a run
may take is the stream's business (:mod:`simulator.engine.decoderun`).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Protocol

import numpy as np
import simpy

from simulator.engine.batching import Batch, ContinuousBatcher
from simulator.engine.clock import ticks
from simulator.engine.steplog import StepLog
from simulator.engine.stepping import Timeline

#: Runs at least this long are computed with numpy rather than step by step (longer when
#: per-step records are kept: building their columns costs more than a short Python loop).
VECTOR_MIN = 32
VECTOR_MIN_RECORDS = 48
#: Fewest steps planned for a decode run that arrivals keep cutting short.
MIN_RUN = 16
#: Most decode steps advanced in one event (bounds the records held for an interruptible run).
MAX_RUN = 512
_INF = float("inf")


class RunHost(Protocol):
    """What a decode run reads of its replica."""

    env: simpy.Environment
    streams: list[ContinuousBatcher]
    #: The time of the next request to arrive at the replica, when known.
    next_arrival: Callable[[], float] | None
    run_ahead: bool  # apply steps that end before the next arrival without waiting
    lag: bool  # async admission: a newcomer joins a step later
    generation: int  # bumped at each failure
    failed_at: dict[int, float]  # generation -> when it failed


class FastForward:
    """Decode runs of a replica's streams (see the module docstring).

    Attributes
    ----------
    runs : list of (ends, extra) or None
        Per stream, the run in progress: its step ends and the extra steps it allocates.
    running : list of bool
        Per stream, whether it is in a decode run that an arrival may cut (interrupt).
    run_len : list of int
        Per stream, the steps to plan in its next decode run.
    """

    def __init__(self, host: RunHost, timeline: Timeline, log: StepLog, streams: int):
        self.host, self.timeline, self.log = host, timeline, log
        self.run_len = [MIN_RUN] * streams
        self.reset()

    def reset(self) -> None:
        """No run under way (a new replica, or one that failed); planned lengths kept."""
        self.runs: list[tuple | None] = [None] * len(self.run_len)
        self.running = [False] * len(self.run_len)

    def progress(self, s: int, now: float) -> tuple[int, int]:
        """(decode steps completed, extra steps allocated) of stream s's run at ``now``."""
        run = self.runs[s]
        if run is None:
            return 0, 0
        ends, extra = run[0], run[1]
        done = int(np.searchsorted(ends, now, side="right"))
        return done, min(done, extra)

    def decode_run(self, s: int, batch: Batch, end: float | None, extra: int, gen: int,
                   now: float, first_rows: list[tuple] = (), first: tuple | None = None):
        """Run the scheduled decode step and the ``extra`` decode-only steps after it in
        one event, with the same times and records as stepping one by one. ``end`` is when
        the scheduled step ends, or None for a short run of a one-stage replica: the
        scheduled step is then computed (and counted) with the others; else
        ``first_rows`` are its records and ``first`` its (tokens, busy time), both kept once
        it ends. Returns when the run's last applied step ended (``env.now``, or later when
        the replica runs ahead) and when that step started (None: the scheduled step was
        the only one applied). A failure
        during the run keeps the records of the steps that ended before it (whose tokens
        :meth:`fail` counts) and drops the rest.

        Step j reads ``decode_kv + j * n`` KV entries; its end is computed from its start
        exactly as a single step would be. An arrival that could join the batch interrupts
        the run: it stops at the end of the step in progress, where a step-by-step schedule
        would have admitted the newcomer.
        """
        host, tl, log = self.host, self.timeline, self.log
        env, n, stream = host.env, batch.n_decode, host.streams[s]
        rows: list[tuple] = []
        rec = rows.append if log.row is not None else None
        # Blocks allocated per step: only the per-step records need them.
        needs = stream.run_needs(extra) if rec is not None else None
        bulk = None
        horizon = host.next_arrival() if host.next_arrival is not None else _INF
        # Async admission: a newcomer joins a step later, so plan past the arrival.
        plan_h = _INF if host.lag else horizon
        compact = None  # a short run's records, kept as one tuple (see _compact)
        planned = extra  # with async admission a short run's times may stop short of it
        if extra >= (VECTOR_MIN if rec is None else VECTOR_MIN_RECORDS):
            ends, busy, bulk = tl.decode_many(end, batch, needs or [0] * extra,
                                                 rec is not None)
        elif tl.one_stage:
            if rec is None or log.run is not None:  # the times alone, in C loops
                ends, computes, comm = tl.decode_times(end, batch, extra, horizon, now,
                                                        host.lag)
                busy = [c + comm for c in computes[: len(ends) - 1]]
                if rec is not None:  # the records kept compact, from the times
                    lead = end is None
                    compact = (tl.index, ends, ticks(tl.overhead), n, computes, comm,
                               batch.kv_blocks, [0, *needs] if lead else needs,
                               batch.decode_kv - n if lead else batch.decode_kv)
            elif end is None and host.run_ahead and not host.lag:
                # Running ahead (no faults): every step the loop records is applied (each
                # starts by the horizon), in order: record them straight away.
                ends, busy = tl.decode_few(end, batch, needs, horizon, log.row, now)
            else:
                ends, busy = tl.decode_few(end, batch, needs, plan_h, rec, now)
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
                t, b = tl.inline(t, n, 0.0, 0, batch.decode_kv + j * n, n, 0, n, n, used,
                                    rec)
                ends.append(t)
                busy.append(b)
            extra = len(ends) - 1
        steps = extra
        if host.lag:  # the steps planned, as load views and the run length count them
            extra = planned
        self.runs[s] = (ends, extra)
        if host.next_arrival is not None:
            # The next arrival is known (open loop, one replica): stop at the step in progress
            # when it comes; nothing else can join earlier, so no interrupt is needed.
            steps = min(self.joins_at(ends, horizon, now), steps)
            self.run_len[s] = (min(2 * self.run_len[s], MAX_RUN) if steps == extra
                               else max(MIN_RUN, 2 * steps))
            stop = float(ends[steps])
            if not (host.run_ahead and stop < horizon):  # else: applied ahead of the clock
                yield env.timeout(stop - env.now)
        else:
            self.running[s] = True
            try:
                yield env.timeout(float(ends[-1]) - env.now)
                # Uncut: plan longer runs next time (any length gives identical results;
                # planning far past the next interruption only wastes work).
                self.run_len[s] = min(2 * self.run_len[s], MAX_RUN)
            except simpy.Interrupt:
                steps = min(self.joins_at(ends, env.now, now), steps)
                self.run_len[s] = max(MIN_RUN, 2 * steps)
                yield env.timeout(float(ends[steps]) - env.now)
            self.running[s] = False
        if host.generation != gen:
            # A failure cut the run: keep the records of the steps that ended before it (as
            # fail() counts their tokens).
            done = min(int(np.searchsorted(ends, host.failed_at[gen], side="right")),
                       len(ends) - 1)
            if done:
                if first is not None:
                    log.count(1, *first)
                log.rows(first_rows)
                log.keep(rows, bulk, done - 1)
                log.compact(compact, end is None, done - 1)
                log.count(done - 1, (done - 1) * n, tl.busy_of(busy, done - 1))
            return now, None
        self.runs[s] = None
        # The last step applied started there (None: only the scheduled one, started at now).
        started = float(ends[steps - 1]) if steps else None
        stream.skip_decode_steps(steps, ends)
        if tl.one_stage and type(busy) is list:  # the calls below, unrolled (hot path)
            stage_busy = log.stage_busy_s
            if first is not None:
                log.steps += 1
                log.step_tokens += first[0]
                b = float(first[1])
                stage_busy[0] += b
                log.union_s += b
            log.steps += steps
            log.step_tokens += steps * n
            b = float(sum(busy[:steps]))
            stage_busy[0] += b
            log.union_s += b
            record = log.row
            if record is not None:
                for row in first_rows:
                    record(row)
                for row in rows[:steps]:
                    record(row)
                log.compact(compact, end is None, steps)
            return float(ends[steps]), started
        if first is not None:
            log.count(1, *first)
        log.count(steps, steps * n, tl.busy_of(busy, steps))
        log.rows(first_rows)
        log.keep(rows, bulk, steps)
        return float(ends[steps]), started

    def joins_at(self, ends, t: float, now: float) -> int:
        """Index into ``ends`` of the step end at which a request queued at ``t`` is first
        admitted: the end of the step in progress at ``t``; with async admission the first
        end whose step started at or after ``t`` (the scheduled step started at ``now``, step
        i >= 1 at ``ends[i - 1]``), one step later."""
        if not self.host.lag:
            return bisect.bisect_right(ends, t)
        return 0 if t <= now else bisect.bisect_left(ends, t) + 1

