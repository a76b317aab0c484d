"""Run a cluster of pools: heterogeneous DP (mixed pools behind one router) or disaggregated
prefill and decode (docs/disaggregation.md).

A disaggregated request goes to a prefill instance (the prefill pools' router), which runs
its prefill as a one-token request: the first token (TTFT) comes from there. Its KV blocks
then stay held on the prefill instance while it waits, first come first served, for a
decode instance (the decode pools' router, among those with a free sequence slot and the
KV blocks its prompt needs: admission, whose wait is backpressure); the decode instance
reserves the blocks, the KV moves (:mod:`simulator.cluster.transfer`), the prefill side
frees its blocks, and the request joins the decode instance's decoders with its KV present.
Its second token waits for the transfer and a decode step (the gap shows in ITL).
"""

from __future__ import annotations

from collections import deque

import numpy as np
import pandas as pd
import simpy

from simulator.cluster.build import replica_costs
from simulator.cluster.contention import shared_sends
from simulator.cluster.plan import ClusterPlan, PoolPlan
from simulator.cluster.pools import kv_element_bytes
from simulator.cluster.router import make_router
from simulator.cluster.transfer import KVTransfers
from simulator.engine.clock import TICK, ticks
from simulator.engine.kvcache import blocks_for
from simulator.engine.replica import Replica
from simulator.engine.speculative import SpecStats
from simulator.metrics.gaps import GapHistogram
from simulator.metrics.records import Recorder
from simulator.topology.graph import Paths

#: Per-request columns a run with pools adds to requests.csv.
POOL_COLUMNS = ["prefill_replica", "decode_replica", "pool", "decode_pool",
                "decode_wait_s", "kv_transfer_start_s", "kv_transfer_s", "kv_bytes"]


class PoolCluster:
    """Live replicas of every pool, the front router (prefill or mixed pools), the decode
    router and admission queue, and the KV transfers, on one environment.

    A mixin: :class:`simulator.cluster.running.PooledCluster` adds the workload
    processes (arrivals, closed-loop clients) and completion bookkeeping of ``Cluster``.
    """

    def __init__(self, env: simpy.Environment, plan: ClusterPlan, recorder: Recorder,
                 rngs: dict[str, np.random.Generator]):
        # Cluster.__init__ is not run: it would build single-pool replicas. Its state
        # comes from Cluster._init_state once the pools' replicas exist.
        self.env, self.plan, self.recorder = env, plan, recorder
        s = plan.scenario
        self.gaps = GapHistogram()
        self.spec_stats = SpecStats()  # speculating pools' totals (unused without them)
        self.replicas: list[Replica] = []
        self.pool_of: list[PoolPlan] = []
        front, back = [], []
        for pool in plan.pools:
            eng = pool.scenario.engine
            sends = shared_sends(env, plan.graph, pool.replicas, pool.model, TICK)
            done = self._decoded if pool.spec.role == "decode" else (
                self._prefilled if pool.spec.role == "prefill" else self.finish)
            for k, rp in enumerate(pool.replicas):
                rep = self._replica(rp, sends[k], [self._scheduler(pool)
                                                   for _ in range(pool.streams_per_replica)],
                                    eng, done)  # Cluster's
                self.replicas.append(rep)
                self.pool_of.append(pool)
                (back if pool.spec.role == "decode" else front).append(rep)
        self.front, self.back = front, back
        self._init_state()  # Cluster's (this class is its mixin in PooledCluster)
        first = next(p for p in plan.pools if p.spec.role != "decode")
        self.router = make_router(first.spec.router or s.router.policy, rngs["router"],
                                  load_weight=s.router.load_weight)
        # The decode router's own stream: child 6 of the run's SeedSequence (simulation's
        # named streams are children 0-5, so theirs do not change).
        rng = np.random.default_rng(np.random.SeedSequence(s.seed).spawn(7)[6])
        dec = next((p for p in plan.pools if p.spec.role == "decode"), first)
        self.decode_router = make_router(dec.spec.router or s.router.policy, rng,
                                         load_weight=s.router.load_weight)
        self.transfers = KVTransfers(env, plan.graph, plan.model, TICK)
        self.queue: deque = deque()  # prefilled requests waiting for decode admission
        self._output: dict[int, int] = {}  # true output length of requests in prefill
        self._held: dict[int, list] = {}  # request id -> [replica, stream, held blocks, t]
        self._incoming = [0] * len(self.replicas)  # admitted, KV still moving
        self.extra: dict[int, list] = {}  # request id -> POOL_COLUMNS values

    # -- routing ---------------------------------------------------------------------------
    def submit(self, req, now: float | None = None) -> None:
        now = self.env.now if now is None else now
        self.last_event_s = now
        if req.prompt + req.output > self.max_len:
            req.status, req.finish_s = "rejected", now
            self.finish(req)
            return
        front = [r for r in self.front if r.up] if self.any_down else self.front
        if not front:
            self._hold(req)
            return
        rep = front[self.router.choose(front, req)]
        pool = self.pool_of[rep.index]
        self.extra[req.id] = [rep.index, rep.index, pool.spec.name, pool.spec.name,
                              np.nan, np.nan, np.nan, 0.0]
        if pool.spec.role == "prefill":
            self.extra[req.id][1], self.extra[req.id][3] = -1, ""
            # It runs there as a one-token request; the stream it joins holds its KV after.
            streams = rep.streams
            st = 0 if len(streams) == 1 else min(range(len(streams)),
                                                 key=lambda i: streams[i].outstanding)
            self._output.setdefault(req.id, req.output)  # a retry keeps its true length
            self._held[req.id] = [rep, st, 0, 0.0]
            req.output = 1
        rep.submit(req)

    def _hold(self, req) -> None:
        """No front replica is up: the request waits (as Cluster.submit holds it)."""
        self.pending.append(req)
        timeout = self.plan.scenario.recovery.pending_timeout_s
        if timeout is not None:
            token = self._waiting[req.id] = object()
            self.env.timeout(ticks(timeout)).callbacks.append(
                lambda _, req=req, token=token, t=timeout: self._give_up(req, token, t))

    def _prefilled(self, req) -> None:
        """A prefill instance emitted the first token: hold the KV, queue for decode."""
        req.output = self._output.pop(req.id)
        held = self._held[req.id]
        st = held[0].streams[held[1]]
        if req.generated >= req.output:  # a one-token reply is done here
            del self._held[req.id]
            self.finish(req)
            return
        # Its blocks were just released by the step that finished it: hold them again
        # (nothing ran in between), so the instance cannot reuse them until the KV leaves.
        blocks = min(blocks_for(req.target, st.bs), st.kv.free)
        st.kv.allocate(blocks)
        held[2], held[3] = blocks, self.env.now
        # The decode side neither reuses nor caches its prefix blocks (KV arrives whole).
        req.units, req.shared, req.next_unit, req.hashes = [], 0, 0, None
        self.queue.append(req)
        self._admit()

    def _admit(self) -> None:
        """Admit queued requests, in order, to decode instances that can take them now."""
        while self.queue:
            req = self.queue[0]
            ok = []
            for rep in self.back:
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
            self.env.process(self.move(req, rep, s))

    def move(self, req, dst: Replica, s: int):
        """Move the request's KV from its prefill instance to ``dst``, then hand it over."""
        src, s_src, blocks, ready = self._held.pop(req.id)
        src_gen, dst_gen = src.generation, dst.generation
        t0 = self.env.now
        sp, dp_ = self.pool_of[src.index], self.pool_of[dst.index]
        src_stages = sp.replicas[src.index - sp.first_replica].placement.stages
        dst_stages = dp_.replicas[dst.index - dp_.first_replica].placement.stages
        overlap = 0.0
        if sp.spec.kv_transfer == "layerwise" and t0 == ready:  # admitted at once
            overlap = max(0.0, ready - req.first_scheduled_s)
        # Attention DP: the request's cache lives on one rank of each side (by its id).
        ranks = tuple(req.id % p.spec.tp if p.spec.attention_dp else None for p in (sp, dp_))
        ev, nbytes = self.transfers.start(req.target, src_stages, dst_stages,
                                          kv_element_bytes(sp), overlap, self.plan.model.layers,
                                          ranks)
        yield ev
        now = self.env.now
        self._incoming[dst.index] -= 1
        if src.generation != src_gen or dst.generation != dst_gen:
            # Either end failed during the transfer: the KV is lost (blocks of a failed
            # replica went with it); the request starts over by the recovery rules.
            if src.generation == src_gen:
                src.streams[s_src].kv.release(blocks)
                src.wake()
            if dst.generation == dst_gen:
                dst.streams[s].kv.release(req.blocks)
                dst.outstanding -= 1
                self._admit()
            req.blocks = req.computed = 0
            req.target = req.prompt + req.generated  # re-prefill what it has
            self._retry(req, "its KV transfer lost an end (replica down)",
                        self.plan.scenario.recovery)
            return
        src.streams[s_src].kv.release(blocks)  # the prefill instance may reuse them now
        src.wake()
        self.extra[req.id][1:] = [dst.index, sp.spec.name, dp_.spec.name, t0 - ready, t0,
                                  now - t0, nbytes]
        dst.submit_prefilled(req, s, ready)

    def _decoded(self, req) -> None:
        self.finish(req)
        self._admit()

    def finish(self, req) -> None:
        """Cluster.finish, with the true output length of a request dropped while it ran
        as a one-token prefill."""
        out = self._output.pop(req.id, None)
        if out is not None:
            req.output = out
        super().finish(req)

    def close(self) -> None:
        for req in self.pending:
            req.output = self._output.pop(req.id, req.output)
        super().close()

    # -- failures (Cluster.act drives them; these are the pool-specific parts) -------------
    def _costs(self, i: int, view) -> tuple[list, list]:
        """Replica i's stage and hand-off costs on the graph as it is now (its pool's
        GPU and settings)."""
        p = self.pool_of[i]
        stages, sends = replica_costs(p.scenario, p.model, p.node,
                                      p.replicas[i - p.first_replica].placement,
                                      Paths(view))
        return list(stages), list(sends)

    def act(self, target: str, sign: int) -> None:
        """A fault or repair (Cluster.act); then the requests whose KV waited for decode
        admission on a prefill replica that went down start over."""
        super().act(target, sign)
        lost = [r for r in self.queue if not self._held[r.id][0].up]
        if lost:
            self.queue = deque(r for r in self.queue if self._held[r.id][0].up)
            for req in lost:
                del self._held[req.id]
                req.blocks = req.computed = 0
                req.target = req.prompt + req.generated
                self._retry(req, "its prefill replica went down before decode admission",
                            self.plan.scenario.recovery)
        self._admit()

    def _streams(self, i: int) -> list:
        """Fresh schedulers for replica ``i`` after a restart: its pool's own."""
        pool = self.pool_of[i]
        return [self._scheduler(pool)
                for _ in range(pool.streams_per_replica)]

    def _serve_pending(self, entry=None) -> None:
        """Waiting requests go to the front (prefill or mixed) replicas; then decode
        admission resumes (Cluster._restart calls this after a replica comes back)."""
        super()._serve_pending(self.front)
        self._admit()

    # -- results ---------------------------------------------------------------------------
    def engine_totals(self) -> dict:
        """The replicas' streaming totals, as ``summarize`` takes them (stages by index
        across pools)."""
        pp = max(len(r.stages) for r in self.replicas)
        return {"steps": sum(r.steps for r in self.replicas),
                "step_tokens": sum(r.step_tokens for r in self.replicas),
                "union_s": sum(r.union_s for r in self.replicas),
                "stage_busy_s": [sum(r.stage_busy_s[i] for r in self.replicas
                                     if i < len(r.stages)) for i in range(pp)],
                "gaps": self.gaps}

    def pool_table(self) -> pd.DataFrame:
        """One row per pool: name, role, GPUs, replicas, price, busy time of its replicas
        (``union_s``: time some stage of a replica computed or communicated)."""
        rows = []
        for pool in self.plan.pools:
            reps = [r for r in self.replicas if self.pool_of[r.index] is pool]
            rows.append({"pool": pool.spec.name, "role": pool.spec.role, "gpus": pool.gpus,
                         "replicas": len(reps), "gpu_hour_usd": pool.spec.gpu_hour_usd,
                         "busy_s": sum(r.union_s for r in reps)})
        return pd.DataFrame(rows)

    def request_columns(self, requests: pd.DataFrame) -> pd.DataFrame:
        """``requests`` with the :data:`POOL_COLUMNS` of each request (in its row order)."""
        default = [-1, -1, "", "", np.nan, np.nan, np.nan, 0.0]
        rows = [self.extra.get(int(i), default) for i in requests["request_id"]]
        extra = pd.DataFrame(rows, columns=POOL_COLUMNS, index=requests.index)
        return pd.concat([requests, extra], axis=1)
