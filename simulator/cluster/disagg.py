"""The prefill-to-decode hand-off of a disaggregated cluster (docs/disaggregation.md).

A disaggregated request goes to a prefill instance (the front router of
:class:`simulator.cluster.simulation.Cluster`), which runs its prefill as a one-token
request: the first token (TTFT) comes from there, or, with the prefill pool's
``first_token = "decode"``, reaches the client when its KV reaches the decode instance. Its
KV blocks then stay held on the prefill instance while it waits, first come first served,
for a decode instance (the decode pools' router, among those with a free sequence slot and
the KV blocks its prompt needs: admission, whose wait is backpressure); the decode instance
reserves the blocks, the KV moves (:mod:`simulator.cluster.transfer`), the prefill side
frees its blocks, and the request joins the decode instance's decoders with its KV present.
Its second token waits for the transfer and a decode step (the gap shows in ITL).

:class:`Handoff` holds that state (the admission queue, the held blocks, the transfers);
the cluster owns one when some pool has the prefill role. :func:`pool_table` and
:func:`request_columns` are the per-pool and per-request tables of any run with pools.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
import pandas as pd

from simulator.cluster.plan import PoolPlan
from simulator.cluster.pools import kv_element_bytes
from simulator.cluster.router import make_router
from simulator.cluster.transfer import KVTransfers
from simulator.engine.clock import TICK
from simulator.engine.kvcache import blocks_for
from simulator.engine.replica import Replica

#: The live cluster, :class:`simulator.cluster.simulation.Cluster` (it owns the hand-off and
#: imports this module, so it is not imported back here).
Cluster = Any

#: Per-request columns a run with pools adds to requests.csv.
POOL_COLUMNS = ["prefill_replica", "decode_replica", "pool", "decode_pool",
                "decode_wait_s", "kv_transfer_start_s", "kv_transfer_s", "kv_bytes"]


class Handoff:
    """The decode router and admission queue of a disaggregated cluster, and its KV
    transfers; ``cluster``'s prefill replicas report to :meth:`prefilled`, its decode
    replicas to :meth:`decoded`."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        plan, s = cluster.plan, cluster.plan.scenario
        # The decode router's own stream: child 6 of the run's SeedSequence (simulation's
        # named streams are children 0-5, so theirs do not change).
        rng = np.random.default_rng(np.random.SeedSequence(s.seed).spawn(7)[6])
        dec = next(p for p in plan.pools if p.role == "decode")
        self.decode_router = make_router(dec.router, rng, load_weight=s.router.load_weight)
        self.transfers = KVTransfers(cluster.env, plan.graph, plan.model, TICK)
        self.queue: deque = deque()  # prefilled requests waiting for decode admission
        self._output: dict[int, int] = {}  # true output length of requests in prefill
        self._held: dict[int, list] = {}  # request id -> [replica, stream, held blocks, t]
        self._incoming: list[int] = []  # per replica: admitted, KV still moving
        # Prefill replica index -> requests whose KV it still holds (waiting for decode
        # admission or moving): a draining prefill replica is parked only at 0.
        self.holding: dict[int, int] = {}

    def prefill(self, rep: Replica, req) -> None:
        """``req`` goes to prefill instance ``rep``: it runs there as a one-token request;
        the stream it joins holds its KV after."""
        streams = rep.streams
        st = 0 if len(streams) == 1 else min(range(len(streams)),
                                             key=lambda i: streams[i].outstanding)
        self._output.setdefault(req.id, req.output)  # a retry keeps its true length
        self._held[req.id] = [rep, st, 0, 0.0]
        req.output = 1

    def restore(self, req) -> None:
        """The true output length of a request dropped while it ran as a one-token
        prefill."""
        out = self._output.pop(req.id, None)
        if out is not None:
            req.output = out

    def prefilled(self, req) -> None:
        """A prefill instance emitted the first token: hold the KV, queue for decode."""
        req.output = self._output.pop(req.id)
        held = self._held[req.id]
        st = held[0].streams[held[1]]
        if req.generated >= req.output:  # a one-token reply is done here
            del self._held[req.id]
            self.cluster.finish(req)
            return
        # Its blocks were just released by the step that finished it: hold them again
        # (nothing ran in between), so the instance cannot reuse them until the KV leaves.
        blocks = min(blocks_for(req.target, st.bs), st.kv.free)
        st.kv.allocate(blocks)
        held[2], held[3] = blocks, self.cluster.env.now
        index = held[0].index
        self.holding[index] = self.holding.get(index, 0) + 1
        # The decode side neither reuses nor caches its prefix blocks (KV arrives whole).
        req.units, req.shared, req.next_unit, req.hashes = [], 0, 0, None
        self.queue.append(req)
        self.admit()

    def admit(self) -> None:
        """Admit queued requests, in order, to decode instances that can take them now."""
        if not self._incoming:
            self._incoming = [0] * len(self.cluster.replicas)
        scaling = self.cluster.scaling
        while self.queue:
            req = self.queue[0]
            ok = []
            for rep in self.cluster.back:
                if scaling is not None and not scaling.routable(rep):
                    continue  # cold-starting, draining or parked (autoscaling)
                free = [rep.unclaimed_blocks(i) for i in range(len(rep.streams))]
                s = free.index(max(free))
                st = rep.streams[s]
                need = st._admit_blocks(req, req.target)
                seqs = self._incoming[rep.index] + sum(
                    x.running + len(x.waiting) + len(x.arrived) for x in rep.streams)
                if rep.up and need <= free[s] and seqs < st.max_seqs * len(rep.streams):
                    ok.append((rep, s, need))
            if not ok:
                return
            rep, s, need = ok[self.decode_router.choose([o[0] for o in ok], req)]
            self.queue.popleft()
            rep.streams[s].kv.allocate(need)
            req.blocks = need
            rep.outstanding += 1
            self._incoming[rep.index] += 1
            self.cluster.env.process(self.move(req, rep, s))

    def move(self, req, dst: Replica, s: int):
        """Move the request's KV from its prefill instance to ``dst``, then hand it over."""
        cluster = self.cluster
        env = cluster.env
        src, s_src, blocks, ready = self._held.pop(req.id)
        src_gen, dst_gen = src.generation, dst.generation
        t0 = env.now
        sp, dp_ = cluster.pool_of[src.index], cluster.pool_of[dst.index]
        src_stages = sp.replicas[src.index - sp.first_replica].placement.stages
        dst_stages = dp_.replicas[dst.index - dp_.first_replica].placement.stages
        overlap = 0.0
        if sp.spec.kv_transfer == "layerwise" and t0 == ready:  # admitted at once
            overlap = max(0.0, ready - req.first_scheduled_s)
        # Attention DP: the request's cache lives on one rank of each side (by its id).
        ranks = tuple(req.id % p.spec.tp if p.spec.attention_dp else None for p in (sp, dp_))
        ev, nbytes = self.transfers.start(req.target, src_stages, dst_stages,
                                          kv_element_bytes(sp), overlap,
                                          cluster.plan.model.layers, ranks)
        yield ev
        now = env.now
        self._incoming[dst.index] -= 1
        self._let_go(src)  # its blocks are released below, on either branch
        if src.generation != src_gen or dst.generation != dst_gen:
            # Either end failed during the transfer: the KV is lost (blocks of a failed
            # replica went with it); the request starts over by the recovery rules.
            if src.generation == src_gen:
                src.streams[s_src].kv.release(blocks)
                src.wake()
            if dst.generation == dst_gen:
                dst.streams[s].kv.release(req.blocks)
                dst.outstanding -= 1
                self.admit()
            req.blocks = req.computed = 0
            req.target = req.prompt + req.generated  # re-prefill what it has
            cluster._retry(req, "its KV transfer lost an end (replica down)",
                           cluster.plan.scenario.recovery)
            return
        src.streams[s_src].kv.release(blocks)  # the prefill instance may reuse them now
        src.wake()
        cluster.extra[req.id][1:] = [dst.index, sp.spec.name, dp_.spec.name, t0 - ready, t0,
                                     now - t0, nbytes]
        if sp.spec.first_token == "decode":
            # The front end streams every token from the decode instance: the client's
            # first token arrives with the KV, and the next gap starts there.
            req.first_token_s = ready = now
        dst.submit_prefilled(req, s, ready)

    def _let_go(self, src: Replica) -> None:
        """Prefill replica ``src`` no longer holds one request's KV; autoscaling may park
        it if it was draining and holds nothing else."""
        self.holding[src.index] -= 1
        if self.cluster.scaling is not None:
            self.cluster.scaling.release(src.index)

    def decoded(self, req) -> None:
        self.cluster.finish(req)
        self.admit()

    def after_fault(self) -> None:
        """After a fault or repair: the requests whose KV waited for decode admission on a
        prefill replica that went down start over; admission resumes."""
        cluster = self.cluster
        lost = [r for r in self.queue if not self._held[r.id][0].up]
        if lost:
            self.queue = deque(r for r in self.queue if self._held[r.id][0].up)
            for req in lost:
                self._let_go(self._held.pop(req.id)[0])
                req.blocks = req.computed = 0
                req.target = req.prompt + req.generated
                cluster._retry(req, "its prefill replica went down before decode admission",
                               cluster.plan.scenario.recovery)
        self.admit()


def pool_table(cluster: Cluster) -> pd.DataFrame:
    """One row per pool: name, role, GPUs, replicas, price, busy time of its replicas
    (``union_s``: time some stage of a replica computed or communicated)."""
    rows = []
    for pool in cluster.plan.pools:
        reps = [r for r in cluster.replicas if cluster.pool_of[r.index] is pool]
        rows.append({"pool": pool.spec.name, "role": pool.spec.role, "gpus": pool.gpus,
                     "replicas": len(reps), "gpu_hour_usd": pool.spec.gpu_hour_usd,
                     "busy_s": sum(r.union_s for r in reps)})
    return pd.DataFrame(rows)


def request_columns(cluster: Cluster, requests: pd.DataFrame) -> pd.DataFrame:
    """``requests`` with the :data:`POOL_COLUMNS` of each request (in its row order)."""
    default = [-1, -1, "", "", np.nan, np.nan, np.nan, 0.0]
    rows = [cluster.extra.get(int(i), default) for i in requests["request_id"]]
    extra = pd.DataFrame(rows, columns=POOL_COLUMNS, index=requests.index)
    return pd.concat([requests, extra], axis=1)


def pool_tags(pool: PoolPlan, index: int) -> list:
    """A request's :data:`POOL_COLUMNS` as it enters replica ``index`` of ``pool`` (the
    decode side and the transfer are filled in by the hand-off)."""
    if pool.role == "prefill":
        return [index, -1, pool.spec.name, "", np.nan, np.nan, np.nan, 0.0]
    return [index, index, pool.spec.name, pool.spec.name, np.nan, np.nan, np.nan, 0.0]
