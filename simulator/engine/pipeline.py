"""Pipeline stages of a replica with several micro-batch streams: the micro-batch that travels
through the stages, each stage's inbox, and the stage process (:meth:`StagePipeline.forward`)
that runs one micro-batch at a time and hands it to the next stage over the graph.

:class:`StagePipeline` owns the inboxes and the count of busy stages (for the busy union);
the stage costs and hand-offs are the replica's step timeline
(:class:`~simulator.engine.stepping.Timeline`), the aggregates and records go to its step
log (:class:`~simulator.engine.steplog.StepLog`), and of the replica itself it reads the
clock and the generation (:class:`StageHost`). The hand-off between stages sends
``T * h * 2`` bytes over the graph path between the stages, without blocking the stage.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

import simpy

from simulator.engine.batching import Batch
from simulator.engine.clock import SCALE
from simulator.engine.steplog import StepLog
from simulator.engine.stepping import Timeline


class MicroBatch:
    """A batch on its way through the stages: ``done`` succeeds when the last stage ends it;
    ``stream`` is the batch stream that formed it (as in records)."""

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
        """Hand ``item`` to the stage waiting on this inbox, else queue it."""
        if self.waiter is not None:
            waiter, self.waiter = self.waiter, None
            waiter.succeed(item)
        else:
            self.items.append(item)


class StageHost(Protocol):
    """What the stage processes read of their replica."""

    env: simpy.Environment
    generation: int  # bumped at each failure: a stage process that sees it move stops


class StagePipeline:
    """Stage processes of a pipelined replica (see the module docstring)."""

    def __init__(self, host: StageHost, timeline: Timeline, log: StepLog):
        self.host, self.timeline, self.log = host, timeline, log
        self.inboxes: list[Inbox] = []
        self._active, self._active_since = 0, 0.0

    def start(self, gen: int) -> None:
        """Empty inboxes and one process per stage, for the replica's generation ``gen``."""
        self._active, self._active_since = 0, 0.0
        stages = len(self.timeline.stages)
        self.inboxes = [Inbox() for _ in range(stages)]
        for i in range(stages):
            self.host.env.process(self.forward(i, gen))

    def forward(self, i: int, gen: int):
        """Stage ``i``: run micro-batches one at a time, hand each to the next stage."""
        host, tl, log = self.host, self.timeline, self.log
        # The stage's cost as priced when the process started: a reprice while the replica
        # is up reaches the hand-offs at once and the stage costs at the next restart.
        env, cost, inbox = host.env, tl.stages[i], self.inboxes[i]
        last = i == len(tl.stages) - 1
        while True:
            if inbox.items:
                mb = inbox.items.popleft()
            else:
                inbox.waiter = env.event()
                mb = yield inbox.waiter
                if host.generation != gen:
                    return
            b = mb.batch
            compute, comm = cost.step(b.tokens, b.prefill_pairs, b.prefill_ctx, b.decode_kv,
                                      b.sampled, b.kernel_seqs)
            start = env.now
            if self._active == 0:
                self._active_since = start
            self._active += 1
            yield env.timeout(round((compute + comm) * SCALE) / SCALE)  # ticks(), inlined
            if host.generation != gen:
                return
            self._active -= 1
            log.stage_busy_s[i] += compute + comm
            if self._active == 0:
                log.union_s += env.now - self._active_since
            if last:  # a step counts once its micro-batch is through every stage
                log.steps += 1
                log.step_tokens += b.tokens
            if log.row is not None:
                log.row((tl.index, i, mb.stream, start, env.now, b.prefill_tokens,
                                  b.tokens - b.prefill_tokens, b.batch_size, compute, comm,
                                  b.kv_blocks, b.prefill_pairs, b.prefill_ctx, b.decode_kv,
                                  b.sampled))
            if last:
                mb.done.succeed()
                continue
            lat, per_token = send = tl.sends[i]
            nxt = self.inboxes[i + 1]
            if hasattr(send, "network"):  # links shared with other replicas: max-min fair
                send.network.transfer(send.edges, b.tokens * send.bytes_per_token,
                                      lat).callbacks.append(
                    lambda _, mb=mb, nxt=nxt, g=gen: nxt.put(mb) if host.generation == g
                    else None)
                continue
            delay = round((lat + b.tokens * per_token) * SCALE) / SCALE  # ticks(), inlined
            if delay > 0:
                env.timeout(delay).callbacks.append(
                    lambda _, mb=mb, nxt=nxt, g=gen: nxt.put(mb) if host.generation == g
                    else None)
            else:
                nxt.put(mb)
