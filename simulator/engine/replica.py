"""A replica as SimPy processes: micro-batch streams feeding a pipeline of stages.

A replica with ``pp`` stages runs ``M = max_inflight_microbatches`` independent batch
streams (vLLM's virtual engines), each with its own scheduler and an equal share of the KV
blocks; a request joins the stream with the fewest outstanding requests. A stream forms a
batch, pays the CPU step overhead (and any KV swap over PCIe), and sends it through the
stages; each stage is a process that takes one micro-batch at a time from its inbox, so
micro-batches of different streams overlap and bubbles appear where the events put them.
The hand-off between stages sends ``T * h * 2`` bytes over the graph path between the
stages, without blocking the stage.

With a single stream nothing can overlap, so a step is one timeout of its exact total
(overhead + every stage + every send) and the per-stage records are laid out in sequence:
the same timeline as the stage processes would give, with a fraction of the events. Runs of
decode-only steps go further: many steps in one event (see :meth:`Replica._decode_run`).
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable
from itertools import accumulate

import numpy as np
import simpy

from simulator.engine.batching import Batch, ContinuousBatcher
from simulator.engine.clock import SCALE, ticks
from simulator.engine.request import Request
from simulator.model.cost import StageCost

#: Runs at least this long are computed with numpy rather than step by step (longer when
#: per-step records are kept: building their columns costs more than a short Python loop).
VECTOR_MIN = 32
VECTOR_MIN_RECORDS = 48
#: Fewest steps planned for a decode run that arrivals keep cutting short.
MIN_RUN = 16
#: Most decode steps advanced in one event (bounds the records held for an interruptible run).
MAX_RUN = 512


class MicroBatch:
    __slots__ = ("batch", "done", "stream")

    def __init__(self, batch: Batch, done: simpy.Event, stream: int):
        self.batch, self.done, self.stream = batch, done, stream


class Inbox:
    """A stage's FIFO of micro-batches: ``put`` never waits and costs no event; a stage
    waits on an event only when its inbox is empty (a ``simpy.Store`` schedules two
    events per hand-off, a third of a pipelined replica's events)."""

    __slots__ = ("items", "waiter")

    def __init__(self) -> None:
        self.items: deque[MicroBatch] = deque()
        self.waiter: simpy.Event | None = None

    def put(self, item: MicroBatch) -> None:
        if self.waiter is not None:
            waiter, self.waiter = self.waiter, None
            waiter.succeed(item)
        else:
            self.items.append(item)


class Replica:
    """One model replica on ``tp * pp`` GPUs.

    Parameters
    ----------
    env : simpy.Environment
    index : int
        Replica number (as in records).
    streams : list of ContinuousBatcher
        One scheduler per in-flight micro-batch.
    stages : list of StageCost
        Cost of each pipeline stage.
    sends : list of (latency_s, s_per_token)
        Hand-off cost from stage i to i+1: ``latency + tokens * s_per_token``.
    step_overhead_s : float
        CPU time per step before the GPUs start.
    on_finish : callable(Request)
        Called at each completion.
    record_step : callable(tuple) or None
        Receives ``(replica, stage, stream, start_s, end_s, prefill_tokens, decode_tokens,
        batch_size, compute_s, comm_s, kv_blocks, prefill_pairs, prefill_ctx, decode_kv,
        sampled)`` for each stage step; None keeps no
        per-step records (the aggregates below are kept either way).
    fast : bool
        Advance runs of decode-only steps in one event (identical results).
    record_bulk : callable(dict) or None
        Receives the records of a decode run as columns (same fields as ``record_step``).
    swap_s_per_block : float
        Seconds to copy one KV block between GPU and CPU memory (the slowest stage's PCIe).
    token_delay_s : float
        Delay before a produced token reaches the client (output processing,
        detokenization, streaming): added to each finished request's first-token and
        finish times, so TTFT and end-to-end latency grow by it and TPOT does not change.

    Attributes
    ----------
    steps, step_tokens : int
        Micro-batches run and their tokens (for batching efficiency).
    stage_busy_s : list of float
        Time each stage computed or communicated.
    union_s : float
        Time during which at least one stage of the replica was busy (for bubbles).
    """

    def __init__(self, env: simpy.Environment, index: int, streams: list[ContinuousBatcher],
                 stages: list[StageCost], sends: list[tuple[float, float]],
                 step_overhead_s: float, on_finish: Callable[[Request], None],
                 record_step: Callable[[tuple], None] | None, fast: bool = True,
                 swap_s_per_block: float = 0.0,
                 record_bulk: Callable[[dict], None] | None = None,
                 token_delay_s: float = 0.0):
        self.env, self.index = env, index
        self.streams, self.stages, self.sends = streams, stages, sends
        self.overhead = step_overhead_s
        self.swap_s = swap_s_per_block
        self.token_delay = token_delay_s
        self._one_stage, self._stage0 = len(stages) == 1, stages[0]
        self.on_finish, self.record_step = on_finish, record_step
        self.record_bulk = record_bulk
        self._idle: list[simpy.Event | None] = [None] * len(streams)
        self._running = [False] * len(streams)  # in a decode run that an arrival may cut
        self._run_len = [MIN_RUN] * len(streams)  # steps to plan in the next decode run
        self._runs: list[tuple | None] = [None] * len(streams)  # the run in progress
        self.fast = fast and len(streams) == 1
        #: When set, returns the time of the next request to arrive at this replica.
        self.next_arrival: Callable[[], float] | None = None
        #: Apply steps that end before the next arrival without waiting (set by the
        #: cluster: one replica, open loop, no faults; needs ``next_arrival``).
        self.run_ahead = False
        #: With ``run_ahead``: ``pull(now)`` submits the requests that arrive by ``now``
        #: (the replica takes its arrivals as its time passes them; no event each).
        self.pull: Callable[[float], None] | None = None
        self.outstanding = 0
        self.steps = self.step_tokens = 0
        self.stage_busy_s = [0.0] * len(stages)
        self.union_s = 0.0
        self.up = True
        self.generation = 0  # bumped at each failure: older processes stop when they wake
        self.failed_at: dict[int, float] = {}  # generation -> when it failed
        self._start()

    def _start(self) -> None:
        env = self.env
        self._active, self._active_since = 0, 0.0
        if len(self.streams) > 1:
            self.inboxes = [Inbox() for _ in self.stages]
            for i in range(len(self.stages)):
                env.process(self.forward(i, self.generation))
        self.procs = [env.process(self.serve(s, self.generation))
                      for s in range(len(self.streams))]

    # -- failures ------------------------------------------------------------------------
    def fail(self) -> list[Request]:
        """The replica goes down: its processes stop at their next wake-up, and every
        request it held loses its KV. Returns them (with their progress so far) for the
        cluster to reroute or drop."""
        now = self.env.now
        self.failed_at[self.generation] = now
        self.generation += 1
        self.up = False
        lost: list[Request] = []
        for s, st in enumerate(self.streams):
            # The steps of a decode run under way that ended by now did happen: their
            # tokens count (the scheduled step and the extra ones alike).
            run = self._runs[s]
            done = 0
            if run is not None:  # (not its last step: that one may finish requests)
                done = min(int(np.searchsorted(run[0], now, side="right")), len(run[0]) - 1)
            if done:
                st.emit_run(run[0][:done])
            st.sync_decoders()
            for req, last in zip(st.decoding.values(), st.last_tokens(), strict=True):
                req.generated += st.k - req.k0 + done  # tokens it had produced
                req.last_token_s = last  # the next gap runs from its last token
            lost += [*st.waiting, *st.prefilling, *st.decoding.values(), *st.swapped,
                     *(r for r, _ in st.arrived)]  # (disaggregated: KV just arrived)
        for req in lost:
            req.blocks = req.computed = 0
            req.target = req.prompt + req.generated
            if req.generated and req.last_token_s != req.last_token_s:  # NaN: not known
                req.last_token_s = now
        self._idle = [None] * len(self.streams)
        self._running = [False] * len(self.streams)
        self._runs = [None] * len(self.streams)
        self.outstanding = 0
        return lost

    def reprice(self, stages: list[StageCost], sends: list[tuple[float, float]]) -> None:
        """Price the steps that start from now on with new stage and hand-off costs (the
        graph changed under the replica)."""
        self.stages, self._stage0, self.sends = stages, stages[0], sends

    def restart(self, streams: list[ContinuousBatcher], stages: list[StageCost] | None = None,
                sends: list[tuple[float, float]] | None = None) -> None:
        """Back up with empty schedulers (weights reloaded, KV cache empty), and the stage
        costs of the topology as it is now."""
        self.streams = streams
        if stages is not None:
            self.reprice(stages, sends if sends is not None else self.sends)
        self.up = True
        self.generation += 1
        self._start()

    # -- load view for routers (exact at the current time, also during decode runs) --------
    def _run_progress(self, s: int) -> tuple[int, int]:
        """(decode steps completed, extra steps allocated) of stream s's run, at now."""
        run = self._runs[s]
        if run is None:
            return 0, 0
        ends, extra = run[0], run[1]
        done = int(np.searchsorted(ends, self.env.now, side="right"))
        return done, min(done, extra)

    @property
    def kv_used_fraction(self) -> float:
        """KV blocks in use over capacity, as a step-by-step run would show now."""
        used = cap = 0
        for s, st in enumerate(self.streams):
            used += st.kv.in_use + (st.run_blocks(self._run_progress(s)[1])
                                  if self._runs[s] else 0)
            cap += st.kv.capacity
        return used / max(cap, 1)

    @property
    def load_tokens(self) -> int:
        """Prompt tokens still to prefill plus KV tokens held by running requests."""
        total = 0
        for s, st in enumerate(self.streams):
            done = self._run_progress(s)[0] if self._runs[s] else 0
            total += (st.pending_tokens + st.prefilled_tokens + st.sum_kv
                      + done * len(st.decoding))
        return total

    def cached_tokens(self, req: Request) -> int:
        """Prompt tokens of ``req`` cached in the prefix cache of a stream (the best one)."""
        return max((st.prefix.cached_tokens(req) for st in self.streams
                    if st.prefix is not None), default=0)

    def wake(self) -> None:
        """Wake idle streams (they then look for work: arrivals to pull, or requests)."""
        for s, idle in enumerate(self._idle):
            if idle is not None:
                self._idle[s] = None
                idle.succeed()

    def submit(self, req: Request) -> None:
        """Queue a request on the stream with the fewest outstanding requests."""
        req.replica = self.index
        self.outstanding += 1
        streams = self.streams
        s = 0 if len(streams) == 1 else min(range(len(streams)),
                                            key=lambda i: streams[i].outstanding)
        stream = streams[s]
        if self._running[s] and stream.can_admit():
            self._running[s] = False
            self.procs[s].interrupt()
        stream.add(req)
        idle = self._idle[s]
        if idle is not None:
            self._idle[s] = None
            idle.succeed()

    def unclaimed_blocks(self, s: int) -> int:
        """KV blocks of stream ``s`` free for a newcomer: free now, less what a decode run
        in progress allocates for its planned steps (it takes them when it ends)."""
        st, run = self.streams[s], self._runs[s]
        return st.kv.free - (st.run_blocks(run[1]) if run is not None else 0)

    def submit_prefilled(self, req: Request, s: int, last_token_s: float) -> None:
        """Hand stream ``s`` a request whose prompt KV arrived from a prefill instance
        (disaggregated serving; its blocks already allocated and counted in
        ``outstanding``): it joins the decoders at the stream's next step."""
        req.replica = self.index
        if self._running[s]:  # a decode run cannot take a new decoder: cut it
            self._running[s] = False
            self.procs[s].interrupt()
        self.streams[s].add_prefilled(req, last_token_s)
        idle = self._idle[s]
        if idle is not None:
            self._idle[s] = None
            idle.succeed()

    # -- processes -----------------------------------------------------------------------
    def serve(self, s: int, gen: int):
        """Stream ``s``: form a batch, run it through the stages, apply the results. Stops
        when the replica fails (its generation moves on).

        With :attr:`run_ahead` (one replica, the next arrival known, no faults), a step that
        ends before the next arrival is applied at its end without waiting for the clock:
        nothing can observe the replica in between. ``now`` is then the stream's own time,
        ahead of ``env.now`` until the next wait.
        """
        env, stream = self.env, self.streams[s]
        single = len(self.streams) == 1
        now = env.now
        while True:
            if self.pull is not None:
                self.pull(now)
            if stream.arrived:  # disaggregated: decoders whose KV has arrived join
                stream.join_prefilled()
            batch = stream.schedule(now)
            if batch is None:
                if self.pull is not None:  # nothing to do until the next arrival
                    t = self.next_arrival()
                    if t == float("inf"):
                        return
                    yield env.timeout(t - env.now)
                    now = t
                    continue
                self._idle[s] = env.event()
                yield self._idle[s]
                if self.generation != gen:
                    return
                now = env.now
                continue
            if single:
                extra = (stream.decode_run(self._run_len[s]) if self.fast and not batch.chunks
                         else 0)
                if extra and self._one_stage and not batch.swap_blocks and extra < (
                        VECTOR_MIN if self.record_step is None else VECTOR_MIN_RECORDS):
                    # A short run: the scheduled step is its first, in the same loop.
                    now = yield from self._decode_run(s, batch, None, extra, gen, now)
                else:
                    # The step's records wait for it to end: a failure in between drops them.
                    rows: list[tuple] = []
                    end, busy = self._inline(now, batch.tokens, batch.prefill_pairs,
                                             batch.prefill_ctx, batch.decode_kv, batch.sampled,
                                             batch.prefill_tokens,
                                             batch.tokens - batch.prefill_tokens,
                                             batch.batch_size, batch.kv_blocks,
                                             rows.append if self.record_step else None,
                                             batch.swap_blocks, batch.draft_s)
                    # Counted once it happened, as recorded: a failure cuts it from both.
                    if extra:
                        now = yield from self._decode_run(s, batch, end, extra, gen, now, rows,
                                                          (batch.tokens, busy))
                    elif self.run_ahead and end < self.next_arrival():
                        now = end  # apply it now: nothing arrives before it ends
                        self._count(1, batch.tokens, busy)
                        self._record(rows)
                    else:
                        yield env.timeout(end - env.now)
                        now = env.now
                        if self.generation == gen:
                            self._count(1, batch.tokens, busy)
                            self._record(rows)
            else:
                lead = self.overhead + batch.swap_blocks * self.swap_s
                if batch.draft_s:  # speculative drafts, before the first stage
                    lead += batch.draft_s
                if lead:
                    yield env.timeout(ticks(lead))
                    if self.generation != gen:
                        return
                mb = MicroBatch(batch, env.event(), s)
                self.inboxes[0].put(mb)
                yield mb.done
                now = env.now
            if self.generation != gen:
                return
            for req in stream.complete(batch, now):
                self.outstanding -= 1
                if self.token_delay:
                    req.first_token_s += self.token_delay
                    req.finish_s += self.token_delay
                self.on_finish(req)

    def _record(self, rows) -> None:
        for row in rows:
            self.record_step(row)

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
        needs = stream.run_needs(extra) if rec is not None else [0] * extra
        bulk = None
        horizon = self.next_arrival() if self.next_arrival is not None else float("inf")
        if extra >= (VECTOR_MIN if rec is None else VECTOR_MIN_RECORDS):
            ends, busy, bulk = self._decode_many(end, batch, needs, rec is not None)
        elif self._one_stage:
            ends, busy = self._decode_few(end, batch, needs if rec is not None else extra,
                                          horizon, rec, now)
            if end is None:  # the scheduled step came first: keep it apart from the rest
                first = (n, busy[0])
                ends, busy = ends[1:], busy[1:]
                if rec is not None:
                    first_rows = [rows.pop(0)]
            extra = len(ends) - 1
        else:
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
        self._runs[s] = (ends, extra)
        if self.next_arrival is not None:
            # The next arrival is known (open loop, one replica): stop at the step in progress
            # when it comes; nothing else can join earlier, so no interrupt is needed.
            steps = min(bisect.bisect_right(ends, horizon), steps)
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
                steps = min(bisect.bisect_right(ends, env.now), steps)
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
                self._count(done - 1, (done - 1) * n, self._busy_of(busy, done - 1))
            return now
        self._runs[s] = None
        stream.skip_decode_steps(steps, ends)
        if first is not None:
            self._count(1, *first)
        self._count(steps, steps * n, self._busy_of(busy, steps))
        self._record(first_rows)
        self._keep(rows, bulk, steps)
        return float(ends[steps])

    def _busy_of(self, busy, steps: int):
        """Busy time of the first ``steps`` extra steps of a run (per stage, or a float)."""
        if isinstance(busy, np.ndarray):
            return busy[..., :steps].sum(axis=-1)
        if self._one_stage:
            return sum(busy[:steps])
        return [sum(b[i] for b in busy[:steps]) for i in range(len(self.stages))]

    def _keep(self, rows: list[tuple], bulk: dict | None, steps: int) -> None:
        """Records of the first ``steps`` extra steps of a run (rows or bulk columns)."""
        if bulk is not None:
            self.record_bulk({k: v[: steps * len(self.stages)] for k, v in bulk.items()})
        elif rows:
            self._record(rows[: steps * len(self.stages)])

    def _decode_few(self, end: float | None, batch: Batch, needs: list[int] | int,
                    horizon: float, rec: Callable[[tuple], None] | None, now: float
                    ) -> tuple[list[float], list[float]]:
        """:meth:`_inline` for a short run of decode steps of a one-stage replica, step costs
        from :meth:`StageCost.decode_run`; stops planning once a step starts after
        ``horizon``. Returns the end of each step (the scheduled one first) and the steps'
        busy times; records each step when ``rec`` is given (``needs`` then lists the blocks
        each step allocates; without records it is just the number of steps). With ``end``
        None the scheduled step (no swap) starts at ``now`` and is computed first: the times
        then start with ``now`` and the busy times with the scheduled step's."""
        n = batch.n_decode
        first = end is None
        kv0 = batch.decode_kv - n if first else batch.decode_kv
        k = (needs if rec is None else len(needs)) + first
        computes, comm = self._stage0.decode_run(n, kv0, k)
        off = self.overhead  # + 0 swapped blocks * swap_s, as _inline adds it
        t = now if first else end
        if rec is None:
            # Each end from its start as _inline computes it, summed left to right (C loops).
            ends = list(accumulate([round((off + c + comm) * SCALE) / SCALE for c in computes],
                                   initial=t))
            if horizon < ends[-1]:  # keep the steps that start by the horizon (and the first)
                ends = ends[: max(bisect.bisect_right(ends, horizon), first) + 1]
            return ends, [c + comm for c in computes[: len(ends) - 1]]
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

    def _count(self, steps: int, tokens: int, busy) -> None:
        """Aggregates of inline steps (their stage spans never overlap, so the busy union
        is the sum); ``busy`` is a float for one stage, else per stage."""
        self.steps += steps
        self.step_tokens += tokens
        if self._one_stage:
            b = float(busy)
            self.stage_busy_s[0] += b
            self.union_s += b
        else:
            for i, b in enumerate(busy):
                self.stage_busy_s[i] += float(b)
                self.union_s += float(b)

    def _inline(self, start: float, tokens: int, pairs: float, ctx: int, decode_kv: int,
                sampled: int, prefill_tokens: int, n_decode: int, batch_size: int,
                kv_blocks: int, rec: Callable[[tuple], None] | None,
                swap_blocks: int = 0, draft_s: float = 0.0) -> tuple[float, object]:
        """End time and busy time (a float for one stage, else per stage) of a step starting
        at ``start`` with nothing overlapping; records each stage's span (overhead and swap,
        stage, hand-off, stage, ...). Times are on the clock's grid (``start`` is), so the end
        depends on the step alone, not on when it runs."""
        off = self.overhead + swap_blocks * self.swap_s
        if draft_s:  # speculative drafts run on the replica's GPUs before the forward
            off += draft_s
        if self._one_stage:  # the loop below for a single stage, unrolled (hot path)
            compute, comm = self._stage0.step(tokens, pairs, ctx, decode_kv, sampled)
            end = round((off + compute + comm) * SCALE) / SCALE
            if rec is not None:
                rec((self.index, 0, 0, start + ticks(off), start + end, prefill_tokens,
                     n_decode, batch_size, compute, comm, kv_blocks, pairs, ctx, decode_kv,
                     sampled))
            return start + end, compute + comm
        busy = []
        last = len(self.stages) - 1
        for i, cost in enumerate(self.stages):
            compute, comm = cost.step(tokens, pairs, ctx, decode_kv, sampled)
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

    def forward(self, i: int, gen: int):
        """Stage ``i``: run micro-batches one at a time, hand each to the next stage."""
        env, cost, inbox = self.env, self.stages[i], self.inboxes[i]
        last = i == len(self.stages) - 1
        while True:
            if inbox.items:
                mb = inbox.items.popleft()
            else:
                inbox.waiter = env.event()
                mb = yield inbox.waiter
                if self.generation != gen:
                    return
            b = mb.batch
            compute, comm = cost.step(b.tokens, b.prefill_pairs, b.prefill_ctx, b.decode_kv,
                                      b.sampled)
            start = env.now
            if self._active == 0:
                self._active_since = start
            self._active += 1
            yield env.timeout(round((compute + comm) * SCALE) / SCALE)  # ticks(), inlined
            if self.generation != gen:
                return
            self._active -= 1
            self.stage_busy_s[i] += compute + comm
            if self._active == 0:
                self.union_s += env.now - self._active_since
            if i == 0:
                self.steps += 1
                self.step_tokens += b.tokens
            if self.record_step is not None:
                self.record_step((self.index, i, mb.stream, start, env.now, b.prefill_tokens,
                                  b.tokens - b.prefill_tokens, b.batch_size, compute, comm,
                                  b.kv_blocks, b.prefill_pairs, b.prefill_ctx, b.decode_kv,
                                  b.sampled))
            if last:
                mb.done.succeed()
                continue
            lat, per_token = send = self.sends[i]
            nxt = self.inboxes[i + 1]
            if hasattr(send, "network"):  # links shared with other replicas: max-min fair
                send.network.transfer(send.edges, b.tokens * send.bytes_per_token,
                                      lat).callbacks.append(
                    lambda _, mb=mb, nxt=nxt, g=gen: nxt.put(mb) if self.generation == g
                    else None)
                continue
            delay = round((lat + b.tokens * per_token) * SCALE) / SCALE  # ticks(), inlined
            if delay > 0:
                env.timeout(delay).callbacks.append(
                    lambda _, mb=mb, nxt=nxt, g=gen: nxt.put(mb) if self.generation == g
                    else None)
            else:
                nxt.put(mb)
