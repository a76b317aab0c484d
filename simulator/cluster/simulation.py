"""The live cluster on one SimPy environment: arrivals -> router -> replicas, failures and
restarts, closed-loop clients (:class:`Cluster`); and the workload a run starts from
(:func:`open_loop_workload`, :func:`workload_requests`, the random streams of :func:`run_rngs`).

:func:`simulator.cluster.running.run` drives it and :mod:`simulator.cluster.outcome` turns
its records into the run's tables. Random streams are spawned from one
``SeedSequence(seed)``: arrival gaps, prompt lengths, output lengths, router.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np
import pandas as pd
import simpy

from simulator.cluster.build import prefix_snapshot_tokens, prefix_unit, replica_costs
from simulator.cluster.contention import shared_sends
from simulator.cluster.disagg import Handoff, pool_tags
from simulator.cluster.faults import (
    FaultState,
    random_faults,
    replica_hops,
    resolve_target,
    scheduled_faults,
)
from simulator.cluster.plan import ClusterPlan, PoolPlan
from simulator.cluster.router import Scraped, make_router
from simulator.engine.batching import ContinuousBatcher
from simulator.engine.clock import TICK, ticks, ticks_array
from simulator.engine.host import ApiServer
from simulator.engine.kvcache import KVCache
from simulator.engine.replica import Replica
from simulator.engine.request import WAITING, Request
from simulator.engine.schedulers import SCHEDULERS
from simulator.engine.speculative import SpecStats, speculative_decoders
from simulator.errors import ScenarioError
from simulator.io.scenario import resolve_path
from simulator.io.schema import Scenario
from simulator.metrics.gaps import GapHistogram
from simulator.metrics.records import Recorder
from simulator.paths import ROOT
from simulator.topology.graph import Paths
from simulator.workload.arrivals import arrival_times, profiled_trace, trace_window
from simulator.workload.lengths import LengthStream, sample_lengths
from simulator.workload.mooncake import load_mooncake
from simulator.workload.sessions import session_requests
from simulator.workload.trace import load_trace


def open_loop_workload(s: Scenario, rngs: dict[str, np.random.Generator]) -> pd.DataFrame:
    """Arrival times and lengths of every request of an open-loop scenario."""
    w = s.workload
    if w.arrival == "trace":
        path = resolve_path(s, w.trace)
        if not path.exists() and not path.is_absolute() and (ROOT / w.trace).exists():
            path = ROOT / w.trace  # shipped traces, for dict scenarios run from anywhere
        try:
            if path.suffix == ".jsonl":  # Mooncake: with prefix-block hashes
                df = trace_window(load_mooncake(path, w.hash_block_tokens), w)
            else:
                df = trace_window(load_trace(path), w)
            return profiled_trace(df, w, rngs["arrivals"])
        except ScenarioError as exc:
            raise exc.with_source(s.source) from None
    if w.arrival == "sessions":
        return session_requests(w, rngs)
    t = arrival_times(w, rngs["arrivals"])
    n = len(t)
    return pd.DataFrame({"arrival_s": t,
                         "prompt_tokens": sample_lengths(w.prompt_tokens, n, rngs["prompts"]),
                         "output_tokens": sample_lengths(w.output_tokens, n, rngs["outputs"])})


class Cluster:
    """Live objects of one run on one environment: the replicas of every pool, the front
    router (over the prefill or mixed pools' replicas), the recorder, and with prefill pools
    the hand-off to the decode pools (:class:`simulator.cluster.disagg.Handoff`).

    A colocated scenario is a cluster of one mixed pool; replica ``i`` belongs to pool
    ``pool_of[i]``.
    """

    #: An Autoscaler with [autoscale]; the router's scraped views with [router] refresh_s.
    scaling = None
    views: list | None = None
    gateway = None  # a Gateway with [gateway] (simulator/cluster/gateway.py)

    def __init__(self, env: simpy.Environment, plan: ClusterPlan, recorder: Recorder,
                 rngs: dict[str, np.random.Generator]):
        self.env, self.plan, self.recorder = env, plan, recorder
        s = plan.scenario
        self.gaps = GapHistogram()
        self.spec_stats = SpecStats()  # speculating pools' totals (unused without them)
        self.handoff = (Handoff(self) if any(p.role == "prefill" for p in plan.pools)
                        else None)
        self.replicas: list[Replica] = []
        self.pool_of: list[PoolPlan] = []
        front: list[Replica] = []
        back: list[Replica] = []
        for pool in plan.pools:
            eng = pool.scenario.engine
            # PP sends of a pool's replicas sharing fabric links: flow model
            sends = shared_sends(env, plan.graph, pool.replicas, pool.model, TICK)
            done = (self.handoff.decoded if pool.role == "decode" else
                    self.handoff.prefilled if pool.role == "prefill" else self.finish)
            for k, rp in enumerate(pool.replicas):
                rep = self._replica(rp, sends[k], [self._scheduler(pool)
                                                   for _ in range(pool.streams_per_replica)],
                                    eng, done)
                self.replicas.append(rep)
                self.pool_of.append(pool)
                (back if pool.role == "decode" else front).append(rep)
        #: The replicas the front router sends new requests to, and the decode replicas.
        self.front = front if back else self.replicas
        self.back = back
        self.pooled = plan.pooled
        self.extra: dict[int, list] = {}  # request id -> POOL_COLUMNS values (with pools)
        self._init_state()
        first = next(p for p in plan.pools if p.role != "decode")
        self.router = make_router(first.router, rngs["router"],
                                  load_weight=s.router.load_weight)
        if s.router.refresh_s is not None:
            self.views = [Scraped(r) for r in self.replicas]
            env.process(self.scrape(s.router.refresh_s))

    def _replica(self, rp, send, streams: list[ContinuousBatcher], eng,
                 done: Callable) -> Replica:
        """The live replica of plan entry ``rp`` (its stages, hand-offs ``send``, one
        scheduler per stream), run as the engine keys ``eng`` say; ``done`` takes each
        request it completes."""
        return Replica(self.env, rp.placement.replica, streams, list(rp.stages), send,
                       0.0 if eng.cpu_overlap else eng.step_overhead_s,  # else in stage 0
                       done, self.recorder.step, fast=eng.fast_forward,
                       swap_s_per_block=rp.swap_s_per_block,
                       record_bulk=self.recorder.step_bulk, token_delay_s=eng.token_delay_s,
                       async_admission=eng.cpu_overlap, record_run=self.recorder.step_run)

    def _init_state(self) -> None:
        """The workload, completion and failure state of a cluster whose ``replicas``
        exist."""
        plan, env = self.plan, self.env
        self.max_len = plan.max_model_len
        self.completed = 0
        self.expected: int | None = None  # requests the workload will send, when known
        # End of the steady window when it is not the last arrival: multi-turn sessions'
        # last session start (later arrivals are the last sessions' turns, a ramp-down).
        self.steady_end_s: float | None = None
        # Every expected request is accounted for, or no replica can ever serve again.
        self.done = env.event()
        self.next_arrival_s = float("inf")
        self.waiters: dict[int, simpy.Event] = {}
        eng = plan.scenario.engine  # the API server closed-loop clients send through
        self.api = (ApiServer(eng.api_request_s, eng.api_token_s)
                    if eng.api_request_s or eng.api_token_s else None)
        # Failures: what is down, which replicas are up, requests waiting for any replica.
        self.fault_state = FaultState(plan.graph)
        self.hops = [replica_hops(rp.placement.stages) for rp in plan.replicas]
        self.pending: deque[Request] = deque()
        self._waiting: dict[int, object] = {}  # pending request id -> its current wait
        self.downtime: list[list[list[float]]] = [[] for _ in self.replicas]  # [start, end]
        self.down_causes: list[list[str]] = [[] for _ in self.replicas]  # fault target per span
        self._restarting = [False] * len(self.replicas)
        self.retries = 0
        self.last_event_s = 0.0  # last arrival or completion: the end of the workload
        self._hashes: list | None = None  # open loop: each request's block hashes
        self._sessions: list = []
        # Faults that never end; once they leave no replica that can ever be healthy, the
        # cluster can never serve again (``hopeless`` says why and when).
        self.permanent = FaultState(plan.graph)
        self.permanent_targets: list[str] = []
        self.hopeless: tuple[float, str] | None = None

    def _scheduler(self, plan: PoolPlan) -> ContinuousBatcher:
        """One stream's scheduler for a replica of pool ``plan``, as the pool's scenario
        names it, with its parameters (a pool that speculates reports to ``spec_stats``).
        """
        eng = plan.scenario.engine
        cls = SCHEDULERS[eng.scheduler]
        kwargs = dict(eng.scheduler_args or {})
        if "reserve_tokens" in cls.PARAMS:
            kwargs["max_model_len"] = plan.max_model_len
        blocks = plan.memory.kv_blocks // plan.streams_per_replica
        if plan.speculative is not None:  # speculation: a decode set any scheduler takes
            kwargs["decoders"] = speculative_decoders(plan.speculative, self.spec_stats)
        sched = cls(KVCache(blocks, eng.block_size), eng.max_num_seqs,
                    eng.max_num_batched_tokens, preemption=eng.preemption,
                    swap_blocks=plan.swap_blocks_per_stream, gaps=self.gaps,
                    prefix_tokens=prefix_unit(plan.scenario),
                    offload_units=plan.offload_units_per_stream, **kwargs)
        if sched.prefix is not None:  # a hybrid model's hits resume at state snapshots
            sched.prefix.resume = prefix_snapshot_tokens(plan.scenario, plan.model)
        return sched

    def submit(self, req: Request, now: float | None = None) -> None:
        """Route a new request to an up replica (or hold it until one is back), or reject
        it if it cannot fit the model's context. ``now``: when it arrives, if a replica
        running ahead of the clock pulls it (default: the clock)."""
        now = self.env.now if now is None else now
        self.last_event_s = now
        if req.prompt + req.output > self.max_len:
            req.status, req.finish_s = "rejected", now
            req.reason = f"prompt + output tokens exceed max_model_len {self.max_len}"
            self.finish(req)
            return
        if self.scaling is not None:
            self.scaling.on_submit()
        if self.gateway is not None:  # admission and flow control before the router
            self.gateway.admit(req, self._route)
            return
        self._route(req)

    def serving_replicas(self) -> list[Replica]:
        """The replicas that take new requests now (front replicas that are up, and serving
        under autoscaling)."""
        up = [r for r in self.front if r.up] if self.any_down else self.front
        if self.scaling is not None:  # only the replicas autoscaling has serving
            up = [r for r in up if self.scaling.routable(r)]
        return up

    def _route(self, req: Request) -> None:
        """The router's choice among the serving replicas, or hold it until one is up."""
        up = self.serving_replicas()
        if not up:
            self.pending.append(req)
            timeout = self.plan.scenario.recovery.pending_timeout_s
            if timeout is not None:  # the client gives up unless a replica is back by then
                token = self._waiting[req.id] = object()
                self.env.timeout(ticks(timeout)).callbacks.append(
                    lambda _, req=req, token=token, t=timeout: self._give_up(req, token, t))
            return
        if self.views is not None:  # the router decides on what it last scraped
            rep = up[self.router.choose([self.views[r.index] for r in up], req)]
        else:
            rep = up[self.router.choose(up, req)]
        if self.pooled:  # requests.csv's pool columns; a prefill replica runs one token
            pool = self.pool_of[rep.index]
            self.extra[req.id] = pool_tags(pool, rep.index)
            if pool.role == "prefill":
                self.handoff.prefill(rep, req)
        rep.submit(req)

    def scrape(self, every_s: float):
        """The router's metrics scrape: every ``every_s`` it refreshes its views."""
        while not self.done.triggered:
            for v in self.views:
                v.scrape()
            yield self.env.timeout(every_s)

    def finish(self, req: Request) -> None:
        if self.handoff is not None:  # a request dropped while it ran as a prefill
            self.handoff.restore(req)
        if req.id < 0:  # a benchmark client's warm-up: served, left out of the results
            self.waiters.pop(req.id).succeed()
            return
        # A replica running ahead of the clock finishes requests at their own time.
        self.last_event_s = max(self.env.now, req.finish_s)  # (NaN finish_s: env.now)
        self.completed += 1
        self.recorder.request(req)
        if self.scaling is not None:
            self.scaling.on_finish(req)
        if self.gateway is not None and self.gateway.held:
            self.gateway.dispatch(self._route)
        ev = self.waiters.pop(req.id, None)
        if ev is not None:
            ev.succeed()
        if self.completed == self.expected and not self.done.triggered:
            self.done.succeed()

    # -- failures ------------------------------------------------------------------------
    @property
    def any_down(self) -> bool:
        """Whether some replica is down (only faults change this)."""
        return bool(self.fault_state.nodes or self.fault_state.edges) and not all(
            r.up for r in self.replicas)

    def _costs(self, i: int, view) -> tuple[list, list]:
        """Replica i's stage and hand-off costs on the graph as it is now (its pool's GPU
        and settings)."""
        p = self.pool_of[i]
        stages, sends = replica_costs(p.scenario, p.model, p.node,
                                      p.replicas[i - p.first_replica].placement, Paths(view))
        return list(stages), list(sends)

    def act(self, target: str, sign: int) -> None:
        """A fault (sign 1) or its repair (sign -1) on ``target``; replicas follow: those
        that lose a GPU or every path they need go down, those whose traffic can detour
        price the detour from now on."""
        nodes, edges = resolve_target(self.plan.graph, target)
        self.fault_state.apply(nodes, edges, sign)
        view = self.fault_state.view()
        rec = self.plan.scenario.recovery
        for i, rep in enumerate(self.replicas):
            ok = self.fault_state.healthy(self.plan.replicas[i].placement.gpus, self.hops[i],
                                          view)
            if rep.up and ok and edges:
                rep.reprice(*self._costs(i, view))
            if rep.up and not ok:
                self.downtime[i].append([self.env.now, float("inf")])
                self.down_causes[i].append(target)
                lost = rep.fail()
                for req in lost:
                    self._retry(req, f"replica {i} went down ({target})", rec)
            elif not rep.up and ok and not self._restarting[i]:
                self._restarting[i] = True
                self.env.process(self._restart(i, rec.restart_s))
        if self.handoff is not None:
            self.handoff.after_fault()

    def act_permanent(self, target: str) -> None:
        """A fault that never ends was applied. When the faults that never end leave no
        replica that could ever be healthy, the cluster can never serve again: random
        faults stop (they alone would keep the run going forever), and requests waiting or
        still to come are dropped when their clients give up, else by :meth:`close`."""
        nodes, edges = resolve_target(self.plan.graph, target)
        self.permanent.apply(nodes, edges, 1)
        self.permanent_targets.append(target)
        view = self.permanent.view()
        if self.hopeless is None and not any(
                self.permanent.healthy(rp.placement.gpus, self.hops[i], view)
                for i, rp in enumerate(self.plan.replicas)):
            self.hopeless = (self.env.now, ", ".join(self.permanent_targets))
            if not self.done.triggered:
                self.done.succeed()

    def _retry(self, req: Request, why: str, rec) -> None:
        req.retries += 1
        self.retries += 1
        if rec.retry == "drop":
            self._drop(req, "dropped", why)
        elif req.retries > rec.max_retries:
            self._drop(req, "failed_after_retries", why)
        else:
            if req.first_scheduled_s == req.first_scheduled_s:  # it had been admitted:
                # queued again from now until admitted again (timeseries.csv)
                req.requeued = (req.requeued or []) + [[self.env.now, float("nan")]]
            req.state = WAITING
            self.submit(req)

    def _give_up(self, req: Request, token: object, timeout: float) -> None:
        """A pending request's client gives up (if it is still the same wait)."""
        if self._waiting.get(req.id) is token:
            del self._waiting[req.id]
            self.pending.remove(req)
            self._drop(req, "dropped", f"no replica was up within pending_timeout_s = "
                                       f"{timeout:g} s")

    def _drop(self, req: Request, status: str, why: str) -> None:
        req.status, req.reason, req.finish_s = status, why, self.env.now
        self.finish(req)

    def _restart(self, i: int, delay: float):
        """Reload weights, then serve again if the replica is still healthy."""
        yield self.env.timeout(ticks(delay))
        self._restarting[i] = False
        view = self.fault_state.view()
        if self.replicas[i].up or not self.fault_state.healthy(
                self.plan.replicas[i].placement.gpus, self.hops[i], view):
            return
        self.downtime[i][-1][1] = self.env.now
        self.replicas[i].restart(self._streams(i), *self._costs(i, view))
        self._serve_pending()

    def _streams(self, i: int) -> list[ContinuousBatcher]:
        """Fresh schedulers for replica ``i`` (it restarts with an empty KV cache): its
        pool's own."""
        pool = self.pool_of[i]
        return [self._scheduler(pool) for _ in range(pool.streams_per_replica)]

    def _serve_pending(self, entry: list[Replica] | None = None) -> None:
        """Requests that waited for an up replica go to the router again, while one of
        ``entry`` (the replicas that take new requests; default :meth:`serving_replicas`)
        is up."""
        entry = self.serving_replicas() if entry is None else entry
        while self.pending and any(r.up for r in entry):
            req = self.pending.popleft()
            self._waiting.pop(req.id, None)
            self.submit(req)
        if self.handoff is not None:  # decode admission resumes
            self.handoff.admit()

    def close(self) -> None:
        """End of the run: requests that never found an up replica are dropped, at the
        time of the workload's last arrival or completion."""
        end = self.last_event_s
        while self.pending:
            req = self.pending.popleft()
            if self.handoff is not None:
                self.handoff.restore(req)
            req.status, req.reason, req.finish_s = "dropped", "no replica was up", end
            self.completed += 1
            self.recorder.request(req)

    def availability(self, end_s: float) -> list[float]:
        """Fraction of [0, end_s] each replica was up."""
        if end_s <= 0:
            return [1.0] * len(self.replicas)
        return [1.0 - sum(max(0.0, min(b, end_s) - min(a, end_s)) for a, b in spans) / end_s
                for spans in self.downtime]

    def engine_totals(self) -> dict:
        """The replicas' streaming totals, as ``summarize`` takes them (stages by index
        across pools)."""
        reps = self.replicas
        pp = max(len(r.stages) for r in reps)
        return {"steps": sum(r.steps for r in reps),
                "step_tokens": sum(r.step_tokens for r in reps),
                "union_s": sum(r.union_s for r in reps),
                "stage_busy_s": [sum(r.stage_busy_s[i] for r in reps if i < len(r.stages))
                                 for i in range(pp)],
                "gaps": self.gaps}

    # -- workload processes ----------------------------------------------------------------
    def arrive(self, df: pd.DataFrame):
        """Open loop: submit each request at its arrival time."""
        env = self.env
        # Arrival times on the clock's grid (TICK = 2**-30 s), like every event time.
        times = ticks_array(df["arrival_s"].to_numpy(dtype=float)).tolist()
        prompts = df["prompt_tokens"].to_numpy().tolist()
        outputs = df["output_tokens"].to_numpy().tolist()
        if "hashes" in df:  # prefix-block hashes, and sessions
            self._hashes = df["hashes"].tolist()
            self._sessions = (df["session"].tolist() if "session" in df
                              else [-1] * len(df))
        timeout, submit = env.timeout, self.submit
        if len(self.replicas) == 1:  # every arrival goes to it: tell it when the next comes
            rep = self.replicas[0]
            rep.next_arrival = lambda: self.next_arrival_s
            sc = self.plan.scenario
            # Nothing but arrivals (and faults) can observe the replica between its steps.
            rep.run_ahead = (rep.fast and not sc.faults and sc.random_faults is None
                             and sc.autoscale is None and sc.gateway is None)
            if rep.run_ahead:
                # It also takes the arrivals itself as its time passes them: no event each.
                rep.pull = self._puller(times, prompts, outputs)
                self.next_arrival_s = times[0] if times else float("inf")
                rep.wake()
                return
        for i, t in enumerate(times):
            self.next_arrival_s = t
            if t > env.now:
                yield timeout(t - env.now)
            submit(self._new(i, t, prompts[i], outputs[i]))
        self.next_arrival_s = float("inf")

    def _new(self, i: int, t: float, prompt: int, output: int) -> Request:
        """Open-loop request i, with its block hashes and session when the workload has
        them."""
        req = Request(i, t, prompt, output)
        if self._hashes is not None:
            req.hashes, req.session = self._hashes[i], self._sessions[i]
        return req

    def _puller(self, times: list[float], prompts: list[int], outputs: list[int]):
        """``pull(now)``: submit every request that arrives by ``now`` (at its own time);
        returns when the next one arrives (inf: none)."""
        n, submit, state = len(times), self.submit, [0]

        def pull(now: float) -> float:
            i = state[0]
            while i < n and times[i] <= now:
                submit(self._new(i, times[i], prompts[i], outputs[i]), times[i])
                i += 1
            state[0] = i
            self.next_arrival_s = times[i] if i < n else float("inf")
            return self.next_arrival_s

        return pull

    def client(self, c: int, counter: list[int], prompts: LengthStream, outputs: LengthStream,
               release: list[float] | None = None):
        """Closed loop: one client sends its next request when its previous one finishes
        (and, with ``release``, not before request i's release time ``release[i]``)."""
        env, w = self.env, self.plan.scenario.workload
        stalls = 0
        while True:
            if w.num_requests is not None and counter[0] >= w.num_requests:
                return
            if w.duration_s is not None and env.now >= w.duration_s:
                return
            rid = counter[0]
            counter[0] += 1
            prompt, output = prompts.next(), outputs.next()
            if release is not None and release[rid] > env.now:
                yield env.timeout(release[rid] - env.now)
                if w.duration_s is not None and env.now >= w.duration_s:
                    return
            req = Request(rid, env.now, prompt, output, client=c)
            done = self.waiters[rid] = env.event()
            before = env.now
            if self.api is not None:  # through the API server first, in turn
                yield env.timeout(self.api.enter(env.now, prompt) - env.now)
            self.submit(req)
            yield done
            if req.finish_s > env.now:  # the client sees the end token_delay_s later
                yield env.timeout(req.finish_s - env.now)
            stalls = stalls + 1 if env.now == before else 0
            # With no count to reach, rejections that take no time would never end the run.
            if stalls > 1000 and w.num_requests is None:
                raise ScenarioError("workload: closed-loop requests are all rejected at once "
                                    f"(prompt + output > max_model_len {self.max_len})")
            if w.think_time_s:
                yield env.timeout(ticks(w.think_time_s))


def check_faults(s: Scenario, plan: ClusterPlan) -> None:
    """Every scheduled fault names a node, GPU or link of the cluster's graph."""
    try:
        for f in s.faults:
            resolve_target(plan.graph, f.target)
    except ScenarioError as exc:
        raise exc.with_source(s.source) from None


def start_faults(env: simpy.Environment, cluster: Cluster, s: Scenario,
                 rng: np.random.Generator) -> None:
    """Scheduled and random fault processes (targets are checked first)."""
    check_faults(s, cluster.plan)
    if s.faults:
        env.process(scheduled_faults(env, s.faults, cluster.act, cluster.act_permanent))
    if s.random_faults is not None:
        horizon = s.workload.duration_s if s.workload.arrival == "closed_loop" else None
        env.process(random_faults(env, s.random_faults, cluster.plan.graph, rng, cluster.act,
                                  cluster.done, horizon))


def run_rngs(seed: int) -> dict[str, np.random.Generator]:
    names = ("arrivals", "prompts", "outputs", "router", "faults", "sessions")
    seqs = np.random.SeedSequence(seed).spawn(len(names))
    return {n: np.random.default_rng(q) for n, q in zip(names, seqs, strict=True)}


def workload_requests(s: Scenario) -> pd.DataFrame | None:
    """The open-loop requests the scenario's seed draws (what :func:`run` replays), or None
    for a closed loop; needs no cluster (a planner draws them once for many layouts)."""
    if s.workload.arrival == "closed_loop":
        return None
    return open_loop_workload(s, run_rngs(s.seed))
