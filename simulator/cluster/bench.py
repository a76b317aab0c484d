"""A named benchmark client's run (simulator/workload/clients.py): its warm-up requests,
its pause, then the closed loop of C clients (:meth:`Cluster.client`)."""

from __future__ import annotations

import simpy

from simulator.engine.clock import ticks
from simulator.engine.request import Request
from simulator.io.schema import WorkloadKeys
from simulator.workload.clients import CLIENTS
from simulator.workload.lengths import LengthStream


def warm(env: simpy.Environment, cluster, rid: int, prompt: int, output: int):
    """Process: one warm-up request (a negative id: the cluster serves it and records
    nothing), sent now, through the API server when there is one; ends when the client
    has its last token."""
    req = Request(rid, env.now, prompt, output)
    done = cluster.waiters[rid] = env.event()
    if cluster.api is not None:
        yield env.timeout(cluster.api.enter(env.now, prompt) - env.now)
    cluster.submit(req)
    yield done
    if req.finish_s > env.now:  # the client sees the end token_delay_s later
        yield env.timeout(req.finish_s - env.now)


def benchmark(env: simpy.Environment, cluster, w: WorkloadKeys, prompts: LengthStream,
              outputs: LengthStream, release: list[float] | None):
    """Process: the client ``w.client``'s warm-ups (copies of the first request's prompt,
    one after another or all at once), its pause, then ``w.concurrency`` clients that start
    together; ``release`` times (a finite request rate) count from that start."""
    client = CLIENTS[w.client]
    if not client.through_api:  # token ids handed to the engine in-process
        cluster.api = None
    n = client.warmups if w.warmup_requests is None else w.warmup_requests
    if n:
        prompt, output = prompts.peek(), outputs.peek()
        if client.warmup_output is not None:
            output = min(output, client.warmup_output)
        if client.warmups_together:
            yield env.all_of([env.process(warm(env, cluster, -1 - k, prompt, output))
                              for k in range(n)])
        else:
            for k in range(n):
                yield env.process(warm(env, cluster, -1 - k, prompt, output))
        if client.pause_s:
            yield env.timeout(ticks(client.pause_s))
    start = env.now
    if release is not None:
        release = [start + t for t in release]
    counter = [0]
    for c in range(w.concurrency):
        env.process(cluster.client(c, counter, prompts, outputs, release))
