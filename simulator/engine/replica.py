"""A replica as SimPy processes: micro-batch streams feeding a pipeline of stages.

A replica with ``pp`` stages runs ``M = max_inflight_microbatches`` independent batch
streams (vLLM's virtual engines), each with its own scheduler and an equal share of the KV
blocks; a request joins the stream with the fewest outstanding requests. A stream forms a
batch, pays the CPU step overhead, and sends it through the stages; each stage is a process
that takes one micro-batch at a time from its inbox, so micro-batches of different streams
overlap and bubbles appear where the events put them. The hand-off between stages sends
``T * h * 2`` bytes over the graph path between the stages, without blocking the stage.

With a single stream nothing can overlap, so a step is one timeout of its exact total
(overhead + every stage + every send) and the per-stage records are laid out in sequence:
the same timeline as the stage processes would give, with a fraction of the events.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

import simpy

from simulator.engine.batching import Batch, ContinuousBatcher
from simulator.engine.clock import ticks
from simulator.engine.request import Request
from simulator.model.cost import StageCost

#: Most decode steps advanced in one event (bounds the records held for an interruptible run).
MAX_RUN = 512


class MicroBatch:
    __slots__ = ("batch", "done", "stream")

    def __init__(self, batch: Batch, done: simpy.Event, stream: int):
        self.batch, self.done, self.stream = batch, done, stream


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
    fast : bool
        Advance runs of decode-only steps in one event (identical results).
    on_finish : callable(Request)
        Called at each completion.
    record_step : callable(tuple)
        Receives ``(replica, stage, start_s, end_s, prefill_tokens, decode_tokens,
        batch_size, compute_s, comm_s, kv_blocks)`` for each stage step.
    """

    def __init__(self, env: simpy.Environment, index: int, streams: list[ContinuousBatcher],
                 stages: list[StageCost], sends: list[tuple[float, float]],
                 step_overhead_s: float, on_finish: Callable[[Request], None],
                 record_step: Callable[[tuple], None], fast: bool = True):
        self.env, self.index = env, index
        self.streams, self.stages, self.sends = streams, stages, sends
        self.overhead = step_overhead_s
        self.on_finish, self.record_step = on_finish, record_step
        self._idle: list[simpy.Event | None] = [None] * len(streams)
        self._running = [False] * len(streams)  # in a decode run that an arrival may cut
        self.fast = fast and len(streams) == 1
        self.outstanding = 0
        if len(streams) > 1:
            self.inboxes = [simpy.Store(env) for _ in stages]
            for i in range(len(stages)):
                env.process(self.forward(i))
        self.procs = [env.process(self.serve(s)) for s in range(len(streams))]

    # -- load view for routers -----------------------------------------------------------
    @property
    def kv_used_fraction(self) -> float:
        used = sum(s.kv.used for s in self.streams)
        return used / max(1, sum(s.kv.capacity for s in self.streams))

    def submit(self, req: Request) -> None:
        """Queue a request on the stream with the fewest outstanding requests."""
        req.replica = self.index
        self.outstanding += 1
        s = min(range(len(self.streams)), key=lambda i: self.streams[i].outstanding)
        stream = self.streams[s]
        if self._running[s] and stream.can_admit():
            self._running[s] = False
            self.procs[s].interrupt()
        stream.add(req)
        idle = self._idle[s]
        if idle is not None:
            self._idle[s] = None
            idle.succeed()

    # -- processes -----------------------------------------------------------------------
    def serve(self, s: int):
        """Stream ``s``: form a batch, run it through the stages, apply the results."""
        env, stream = self.env, self.streams[s]
        single = len(self.streams) == 1
        while True:
            batch = stream.schedule(env.now)
            if batch is None:
                self._idle[s] = env.event()
                yield self._idle[s]
                continue
            if single:
                now = env.now
                end = self._inline(now, batch.tokens, batch.prefill_pairs, batch.prefill_ctx,
                                   batch.decode_kv, batch.sampled, batch.prefill_tokens,
                                   batch.n_decode, batch.batch_size, batch.kv_blocks,
                                   self.record_step)
                needs = stream.decode_run(MAX_RUN) if self.fast and not batch.chunks else ()
                if needs:
                    yield from self._decode_run(s, batch, end, needs)
                else:
                    yield env.timeout(end - now)
            else:
                if self.overhead:
                    yield env.timeout(ticks(self.overhead))
                mb = MicroBatch(batch, env.event(), s)
                self.inboxes[0].put(mb)
                yield mb.done
            for req in stream.complete(batch, env.now):
                self.outstanding -= 1
                self.on_finish(req)

    def _decode_run(self, s: int, batch: Batch, end: float, needs: list[int]):
        """Run the scheduled decode step and the ``len(needs)`` decode-only steps after it in
        one event, with the same times and records as stepping one by one.

        Step j reads ``decode_kv + j * n`` KV entries; its end is computed from its start
        exactly as a single step would be. An arrival that could join the batch interrupts
        the run: it stops at the end of the step in progress, where a step-by-step schedule
        would have admitted the newcomer.
        """
        env, n = self.env, batch.n_decode
        ends, rows = [end], []
        used, t = batch.kv_blocks, end
        for j, need in enumerate(needs, 1):
            used += need
            t = self._inline(t, n, 0.0, 0, batch.decode_kv + j * n, n, 0, n, n, used,
                             rows.append)
            ends.append(t)
        self._running[s] = True
        try:
            yield env.timeout(t - env.now)
            steps = len(needs)
        except simpy.Interrupt:
            steps = min(bisect.bisect_right(ends, env.now), len(needs))
            yield env.timeout(ends[steps] - env.now)
        self._running[s] = False
        self.streams[s].skip_decode_steps(needs[:steps])
        stages = len(self.stages)
        for row in rows[: steps * stages]:
            self.record_step(row)

    def _inline(self, start: float, tokens: int, pairs: float, ctx: int, decode_kv: int,
                sampled: int, prefill_tokens: int, n_decode: int, batch_size: int,
                kv_blocks: int, rec: Callable[[tuple], None]) -> float:
        """End time of a step starting at ``start`` with nothing overlapping; records each
        stage's span (overhead, stage, hand-off, stage, ...). Times are on the clock's grid
        (``start`` is), so the end depends on the step alone, not on when it runs."""
        off = self.overhead
        last = len(self.stages) - 1
        for i, cost in enumerate(self.stages):
            compute, comm = cost.step(tokens, pairs, ctx, decode_kv, sampled)
            end = off + compute + comm
            rec((self.index, i, start + ticks(off), start + ticks(end), prefill_tokens, n_decode,
                 batch_size, compute, comm, kv_blocks))
            off = end
            if i < last:
                lat, per_token = self.sends[i]
                off += lat + tokens * per_token
        return start + ticks(off)

    def forward(self, i: int):
        """Stage ``i``: run micro-batches one at a time, hand each to the next stage."""
        env, cost, inbox = self.env, self.stages[i], self.inboxes[i]
        last = i == len(self.stages) - 1
        while True:
            mb = yield inbox.get()
            b = mb.batch
            compute, comm = cost.step(b.tokens, b.prefill_pairs, b.prefill_ctx, b.decode_kv,
                                      b.sampled)
            start = env.now
            yield env.timeout(ticks(compute + comm))
            self.record_step((self.index, i, start, env.now, b.prefill_tokens, b.n_decode,
                              b.batch_size, compute, comm, b.kv_blocks))
            if last:
                mb.done.succeed()
                continue
            lat, per_token = self.sends[i]
            nxt = self.inboxes[i + 1]
            delay = ticks(lat + b.tokens * per_token)
            if delay > 0:
                env.timeout(delay).callbacks.append(lambda _, mb=mb, nxt=nxt: nxt.put(mb))
            else:
                nxt.put(mb)
