"""A replica as SimPy processes: micro-batch streams feeding a pipeline of stages.

A replica with ``pp`` stages runs ``M = max_inflight_microbatches`` independent batch
streams (vLLM's virtual engines), each with its own scheduler and an equal share of the KV
blocks; a request joins the stream with the fewest outstanding requests. A stream forms a
batch, pays the CPU step overhead (and any KV swap over PCIe), and sends it through the
stages; each stage is a process that takes one micro-batch at a time from its inbox, so
micro-batches of different streams overlap and bubbles appear where the events put them.

With a single stream nothing can overlap, so a step is one timeout of its exact total
(overhead + every stage + every send) and the per-stage records are laid out in sequence:
the same timeline as the stage processes would give, with a fraction of the events. Runs of
decode-only steps go further: many steps in one event (see :meth:`Replica._decode_run`).

This module owns the :class:`Replica` itself: its construction, the stream process
(:meth:`Replica.serve`), request submission, failure and restart, and the load views
routers read. It is composed of components that each own their state, behind small
interfaces:

- :class:`~simulator.engine.stepping.Timeline` (``timeline``): the step timeline, stage and
  hand-off costs, a step run inline, decode runs priced;
- :class:`~simulator.engine.steplog.StepLog` (``log``): the step aggregates and the one sink
  of step records;
- :class:`~simulator.engine.fastpath.FastForward` (``ff``): runs of decode steps in one
  event, running ahead;
- :class:`~simulator.engine.pipeline.StagePipeline` (``pipeline``): micro-batches, stage
  inboxes, the stage processes;
- the batch streams (``streams``, one scheduler each, whose KV cache is theirs) and
  :func:`~simulator.engine.failure.lost_requests` (what a failure does to the requests).

``MicroBatch``, ``Inbox`` and the run constants are re-exported here.
"""
from __future__ import annotations

from collections.abc import Callable

import simpy

from simulator.engine.batching import ContinuousBatcher
from simulator.engine.clock import ticks
from simulator.engine.failure import lost_requests
from simulator.engine.fastpath import (
    MAX_RUN,
    MIN_RUN,
    VECTOR_MIN,
    VECTOR_MIN_RECORDS,
    FastForward,
)
from simulator.engine.pipeline import Inbox, MicroBatch, StagePipeline
from simulator.engine.request import Request
from simulator.engine.steplog import StepLog
from simulator.engine.stepping import Timeline
from simulator.model.cost import StageCost

__all__ = ["MAX_RUN", "MIN_RUN", "VECTOR_MIN", "VECTOR_MIN_RECORDS", "Inbox", "MicroBatch",
           "Replica"]


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
    async_admission : bool
        The engine schedules step n + 1 while step n runs (vLLM V1 async scheduling, the
        SGLang and TensorRT-LLM overlap schedulers): a request queued after step n started
        joins step n + 2 at the earliest; an idle replica schedules at once. Applies to a
        one-stage, one-stream replica (vLLM keeps ``pp`` batches in flight with pipeline
        parallelism and adds none for async scheduling); see docs/cost-model.md.
    record_run : callable(tuple) or None
        Receives a short decode run's records of a one-stage replica in compact form (see
        :meth:`simulator.metrics.records.Recorder.step_run`) instead of a tuple per step;
        None: ``record_step`` gets them.

    Attributes
    ----------
    steps, step_tokens, stage_busy_s, union_s
        The step aggregates (:class:`~simulator.engine.steplog.StepLog`).
    """

    def __init__(self, env: simpy.Environment, index: int, streams: list[ContinuousBatcher],
                 stages: list[StageCost], sends: list[tuple[float, float]],
                 step_overhead_s: float, on_finish: Callable[[Request], None],
                 record_step: Callable[[tuple], None] | None, fast: bool = True,
                 swap_s_per_block: float = 0.0,
                 record_bulk: Callable[[dict], None] | None = None,
                 token_delay_s: float = 0.0, async_admission: bool = False,
                 record_run: Callable[[tuple], None] | None = None):
        self.env, self.index = env, index
        self.streams = streams
        self.token_delay = token_delay_s
        self.on_finish = on_finish
        self.timeline = Timeline(index, stages, sends, step_overhead_s, swap_s_per_block)
        self.log = StepLog(len(stages), record_step, record_run, record_bulk)
        self.ff = FastForward(self, self.timeline, self.log, len(streams))
        self.pipeline = StagePipeline(self, self.timeline, self.log)
        self._idle: list[simpy.Event | None] = [None] * len(streams)
        self.fast = fast and len(streams) == 1
        self.lag = async_admission and len(streams) == 1 and len(stages) == 1
        #: When set, returns the time of the next request to arrive at this replica.
        self.next_arrival: Callable[[], float] | None = None
        #: Apply steps that end before the next arrival without waiting (set by the
        #: cluster: one replica, open loop, no faults; needs ``next_arrival``).
        self.run_ahead = False
        #: With ``run_ahead``: ``pull(now)`` submits the requests that arrive by ``now``
        #: (the replica takes its arrivals as its time passes them; no event each) and
        #: returns when the next one arrives: until then a call would change nothing.
        self.pull: Callable[[float], float] | None = None
        self.outstanding = 0
        self.up = True
        self.generation = 0  # bumped at each failure: older processes stop when they wake
        self.failed_at: dict[int, float] = {}  # generation -> when it failed
        self._start()

    def _start(self) -> None:
        self._started: float | None = None  # start of the last step (None: went idle)
        if len(self.streams) > 1:
            self.pipeline.start(self.generation)
        self.procs = [self.env.process(self.serve(s, self.generation))
                      for s in range(len(self.streams))]

    # -- the step aggregates and costs, as the cluster reads them --------------------------
    @property
    def steps(self) -> int:
        return self.log.steps

    @property
    def step_tokens(self) -> int:
        return self.log.step_tokens

    @property
    def stage_busy_s(self) -> list[float]:
        return self.log.stage_busy_s

    @property
    def union_s(self) -> float:
        return self.log.union_s

    @property
    def stages(self) -> list[StageCost]:
        return self.timeline.stages

    # -- load view for routers (exact at the current time, also during decode runs) --------
    @property
    def kv_used_fraction(self) -> float:
        """KV blocks in use over capacity, as a step-by-step run would show now."""
        used = cap = 0
        ff, now = self.ff, self.env.now
        for s, st in enumerate(self.streams):
            used += st.kv.in_use + (st.run_blocks(ff.progress(s, now)[1])
                                  if ff.runs[s] else 0)
            cap += st.kv.capacity
        return used / max(cap, 1)

    @property
    def load_tokens(self) -> int:
        """Prompt tokens still to prefill plus KV tokens held by running requests."""
        total = 0
        ff, now = self.ff, self.env.now
        for s, st in enumerate(self.streams):
            done = ff.progress(s, now)[0] if ff.runs[s] else 0
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
        # Queued now; a request pulled ahead of the clock (``pull``) at its arrival.
        req.queued_s = req.arrival_s if self.pull is not None else self.env.now
        self.outstanding += 1
        streams = self.streams
        s = 0 if len(streams) == 1 else min(range(len(streams)),
                                            key=lambda i: streams[i].outstanding)
        stream, running = streams[s], self.ff.running
        if running[s] and stream.can_admit():
            running[s] = False
            self.procs[s].interrupt()
        stream.add(req)
        idle = self._idle[s]
        if idle is not None:
            self._idle[s] = None
            idle.succeed()

    def unclaimed_blocks(self, s: int) -> int:
        """KV blocks of stream ``s`` free for a newcomer: free now, less what a decode run
        in progress allocates for its planned steps (it takes them when it ends)."""
        st, run = self.streams[s], self.ff.runs[s]
        return st.kv.free - (st.run_blocks(run[1]) if run is not None else 0)

    def submit_prefilled(self, req: Request, s: int, last_token_s: float) -> None:
        """Hand stream ``s`` a request whose prompt KV arrived from a prefill instance
        (disaggregated serving; its blocks already allocated and counted in
        ``outstanding``): it joins the decoders at the stream's next step."""
        req.replica = self.index
        if self.ff.running[s]:  # a decode run cannot take a new decoder: cut it
            self.ff.running[s] = False
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
        tl, log, ff = self.timeline, self.log, self.ff
        now = env.now
        # The next arrival that pull() reported (running ahead, pull alone submits: it
        # stays next_arrival() until the next call).
        pull_at = -float("inf")
        while True:
            if self.pull is not None and now >= pull_at:
                pull_at = self.pull(now)
            if stream.arrived:  # disaggregated: decoders whose KV has arrived join
                stream.join_prefilled()
            if self.lag:  # step n + 1 was scheduled when step n started
                stream.admit_by = now if self._started is None else self._started
            batch = stream.schedule(now)
            if batch is None and self.lag and stream.waiting and stream.admit_by < now:
                stream.admit_by = now  # the step scheduled in advance is empty: at once
                batch = stream.schedule(now)
            if batch is None:
                self._started = None
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
            self._started = now
            if single:
                extra = (stream.decode_run(ff.run_len[s]) if self.fast and not batch.chunks
                         else 0)
                if extra and tl.one_stage and not batch.swap_blocks and extra < (
                        VECTOR_MIN if log.row is None else VECTOR_MIN_RECORDS):
                    # A short run: the scheduled step is its first, in the same loop.
                    now, started = yield from ff.decode_run(s, batch, None, extra, gen, now)
                    if started is not None:
                        self._started = started
                else:
                    # The step's records wait for it to end: a failure in between drops them.
                    rows: list[tuple] = []
                    end, busy = tl.inline(now, batch.tokens, batch.prefill_pairs,
                                             batch.prefill_ctx, batch.decode_kv, batch.sampled,
                                             batch.prefill_tokens,
                                             batch.tokens - batch.prefill_tokens,
                                             batch.batch_size, batch.kv_blocks,
                                             rows.append if log.row else None,
                                             batch.swap_blocks, batch.draft_s,
                                             batch.kernel_seqs)
                    # Counted once it happened, as recorded: a failure cuts it from both.
                    if extra:
                        now, started = yield from ff.decode_run(s, batch, end, extra, gen, now,
                                                                rows, (batch.tokens, busy))
                        if started is not None:
                            self._started = started
                    elif self.run_ahead and end < pull_at:  # pull_at: next_arrival()
                        now = end  # apply it now: nothing arrives before it ends
                        if tl.one_stage:  # log.count and log.rows, unrolled (hot path)
                            log.steps += 1
                            log.step_tokens += batch.tokens
                            busy = float(busy)
                            log.stage_busy_s[0] += busy
                            log.union_s += busy
                            if rows:
                                log.row(rows[0])
                        else:
                            log.count(1, batch.tokens, busy)
                            log.rows(rows)
                    else:
                        yield env.timeout(end - env.now)
                        now = env.now
                        if self.generation == gen:
                            log.count(1, batch.tokens, busy)
                            log.rows(rows)
            else:
                lead = tl.overhead + batch.swap_blocks * tl.swap_s
                if batch.draft_s:  # speculative drafts, before the first stage
                    lead += batch.draft_s
                if lead:
                    yield env.timeout(ticks(lead))
                    if self.generation != gen:
                        return
                mb = MicroBatch(batch, env.event(), s)
                self.pipeline.inboxes[0].put(mb)
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

    # -- failure and restart ---------------------------------------------------------------
    def fail(self) -> list[Request]:
        """The replica goes down: its processes stop at their next wake-up, and every
        request it held loses its KV. Returns them (with their progress so far) for the
        cluster to reroute or drop."""
        now = self.env.now
        self.failed_at[self.generation] = now
        self.generation += 1
        self.up = False
        lost = lost_requests(self.streams, self.ff.runs, now)
        self._idle = [None] * len(self.streams)
        self.ff.reset()
        self.outstanding = 0
        return lost

    def reprice(self, stages: list[StageCost], sends: list[tuple[float, float]]) -> None:
        """Price the steps that start from now on with new stage and hand-off costs (the
        graph changed under the replica)."""
        self.timeline.reprice(stages, sends)

    def restart(self, streams: list[ContinuousBatcher], stages: list[StageCost] | None = None,
                sends: list[tuple[float, float]] | None = None) -> None:
        """Back up with empty schedulers (weights reloaded, KV cache empty), and the stage
        costs of the topology as it is now."""
        self.streams = streams
        if stages is not None:
            self.reprice(stages, sends if sends is not None else self.timeline.sends)
        self.up = True
        self.generation += 1
        self._start()
