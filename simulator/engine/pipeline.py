"""Pipeline stages of a replica with several micro-batch streams: the micro-batch that travels
through the stages, each stage's inbox, and the stage process (:meth:`StagePipeline.forward`)
that runs one micro-batch at a time and hands it to the next stage over the graph.

A mixin of :class:`~simulator.engine.replica.Replica`, whose stage costs, hand-off costs,
aggregates and generation it reads and updates. The hand-off between stages sends
``T * h * 2`` bytes over the graph path between the stages, without blocking the stage.
"""

from __future__ import annotations

from collections import deque

import simpy

from simulator.engine.batching import Batch
from simulator.engine.clock import SCALE


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


class StagePipeline:
    """Stage processes of a pipelined replica (see the module docstring)."""

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
                                      b.sampled, b.kernel_seqs)
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
            if last:  # a step counts once its micro-batch is through every stage
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
