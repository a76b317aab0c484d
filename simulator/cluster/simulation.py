"""Run a scenario: arrivals -> router -> replicas on one SimPy environment -> records.

:func:`run` is a pure function of the scenario (and its seed): it writes nothing to disk and
keeps no global state. Random streams are spawned from one ``SeedSequence(seed)``: arrival
gaps, prompt lengths, output lengths, router.
"""

from __future__ import annotations

import gc
import time
from collections import deque
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import simpy
from simpy.core import EmptySchedule
from tqdm import tqdm

from simulator.cluster.build import ClusterPlan, build_plan, prefix_unit, replica_costs
from simulator.cluster.contention import shared_sends
from simulator.cluster.disagg import PoolCluster
from simulator.cluster.faults import (
    FaultState,
    random_faults,
    replica_hops,
    resolve_target,
    scheduled_faults,
)
from simulator.cluster.pools import PooledPlan, build_pools
from simulator.cluster.router import make_router
from simulator.engine.batching import ContinuousBatcher
from simulator.engine.clock import SCALE, TICK, ticks
from simulator.engine.kvcache import KVCache
from simulator.engine.replica import Replica
from simulator.engine.request import WAITING, Request
from simulator.engine.schedulers import SCHEDULERS
from simulator.engine.speculative import SpecStats, SpeculativeBatcher
from simulator.errors import ScenarioError
from simulator.hardware.prices import gpu_hour_usd
from simulator.io.scenario import load_scenario, resolve_path
from simulator.io.schema import Scenario
from simulator.metrics.alerts import THRESHOLD_KEYS as ALERT_KEYS
from simulator.metrics.alerts import alerts
from simulator.metrics.gaps import GapHistogram
from simulator.metrics.links import link_utilization, link_windows
from simulator.metrics.moe import add_moe_columns, moe_summary
from simulator.metrics.pools import pool_energy, pool_summary
from simulator.metrics.power import StepFold, add_power, cluster_power, cost_summary, energy_summary
from simulator.metrics.records import Recorder
from simulator.metrics.speculative import speculative_summary
from simulator.metrics.summary import summarize
from simulator.metrics.timeseries import batch_fill_mean, mark_down, timeseries, window_edges
from simulator.metrics.utilization import StageHardware, gpu_windows
from simulator.paths import ROOT
from simulator.topology.graph import Paths
from simulator.workload.arrivals import arrival_times, trace_window
from simulator.workload.lengths import LengthStream, sample_lengths
from simulator.workload.mooncake import load_mooncake
from simulator.workload.sessions import session_requests
from simulator.workload.trace import load_trace


@dataclass
class Result:
    """What a run produced: the summary, the per-request and per-step tables, the windowed
    time series and alert events, the scenario and its cluster plan."""

    summary: dict
    requests: pd.DataFrame
    steps: pd.DataFrame
    scenario: Scenario
    plan: ClusterPlan = field(repr=False)
    timeseries: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)
    alerts: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)
    gpu_timeseries: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)
    #: What the run could not do as asked, one sentence each (the CLI prints them).
    warnings: list[str] = field(default_factory=list)


def open_loop_workload(s: Scenario, rngs: dict[str, np.random.Generator]) -> pd.DataFrame:
    """Arrival times and lengths of every request of an open-loop scenario."""
    w = s.workload
    if w.arrival == "trace":
        path = resolve_path(s, w.trace)
        if not path.exists() and not path.is_absolute() and (ROOT / w.trace).exists():
            path = ROOT / w.trace  # shipped traces, for dict scenarios run from anywhere
        try:
            if path.suffix == ".jsonl":  # Mooncake: with prefix-block hashes
                return trace_window(load_mooncake(path, w.hash_block_tokens), w)
            return trace_window(load_trace(path), w)
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
    """Live objects of one run: replicas, router and recorder on one environment."""

    def __init__(self, env: simpy.Environment, plan: ClusterPlan, router: Any,
                 recorder: Recorder):
        self.env, self.plan, self.router, self.recorder = env, plan, router, recorder
        eng = plan.scenario.engine
        self.gaps = GapHistogram()
        self.spec_stats = SpecStats()  # speculative decoding totals (unused without it)
        sends = shared_sends(env, plan, TICK)  # PP sends sharing fabric links: flow model
        self.replicas = [
            self._replica(rp, sends[k], [self._scheduler()
                                         for _ in range(plan.streams_per_replica)],
                          eng, self.finish)
            for k, rp in enumerate(plan.replicas)]
        self._init_state()

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
                       async_admission=eng.cpu_overlap)

    def _init_state(self) -> None:
        """The workload, completion and failure state of a cluster whose ``replicas``
        exist (shared with the pooled cluster of :mod:`simulator.cluster.disagg`)."""
        plan, env = self.plan, self.env
        self.max_len = plan.max_model_len
        self.completed = 0
        self.expected: int | None = None  # requests the workload will send, when known
        # Every expected request is accounted for, or no replica can ever serve again.
        self.done = env.event()
        self.next_arrival_s = float("inf")
        self.waiters: dict[int, simpy.Event] = {}
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

    def _scheduler(self) -> ContinuousBatcher:
        """One stream's scheduler, as the scenario names it, with its parameters."""
        plan, eng = self.plan, self.plan.scenario.engine
        cls = SCHEDULERS[eng.scheduler]
        kwargs = dict(eng.scheduler_args or {})
        if "reserve_tokens" in cls.PARAMS:
            kwargs["max_model_len"] = plan.max_model_len
        blocks = plan.memory.kv_blocks // plan.streams_per_replica
        if plan.speculative is not None:  # build checked: the vLLM v1 scheduler
            cls = SpeculativeBatcher
            kwargs.update(spec=plan.speculative, stats=self.spec_stats)
        return cls(KVCache(blocks, eng.block_size), eng.max_num_seqs,
                   eng.max_num_batched_tokens, preemption=eng.preemption,
                   swap_blocks=plan.swap_blocks_per_stream, gaps=self.gaps,
                   prefix_tokens=prefix_unit(plan.scenario),
                   offload_units=plan.offload_units_per_stream, **kwargs)

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
        up = [r for r in self.replicas if r.up] if self.any_down else self.replicas
        if not up:
            self.pending.append(req)
            timeout = self.plan.scenario.recovery.pending_timeout_s
            if timeout is not None:  # the client gives up unless a replica is back by then
                token = self._waiting[req.id] = object()
                self.env.timeout(ticks(timeout)).callbacks.append(
                    lambda _, req=req, token=token, t=timeout: self._give_up(req, token, t))
            return
        up[self.router.choose(up, req)].submit(req)

    def finish(self, req: Request) -> None:
        # A replica running ahead of the clock finishes requests at their own time.
        self.last_event_s = max(self.env.now, req.finish_s)  # (NaN finish_s: env.now)
        self.completed += 1
        self.recorder.request(req)
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
        """Replica i's stage and hand-off costs on the graph as it is now."""
        p = self.plan
        stages, sends = replica_costs(p.scenario, p.model, p.node, p.replicas[i].placement,
                                      Paths(view))
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
        """Fresh schedulers for replica ``i`` (it restarts with an empty KV cache)."""
        return [self._scheduler() for _ in range(self.plan.streams_per_replica)]

    def _serve_pending(self, entry: list[Replica] | None = None) -> None:
        """Requests that waited for an up replica go to the router again, while one of
        ``entry`` (the replicas that take new requests; default all) is up."""
        entry = self.replicas if entry is None else entry
        while self.pending and any(r.up for r in entry):
            req = self.pending.popleft()
            self._waiting.pop(req.id, None)
            self.submit(req)

    def close(self) -> None:
        """End of the run: requests that never found an up replica are dropped, at the
        time of the workload's last arrival or completion."""
        end = self.last_event_s
        while self.pending:
            req = self.pending.popleft()
            req.status, req.reason, req.finish_s = "dropped", "no replica was up", end
            self.completed += 1
            self.recorder.request(req)

    def availability(self, end_s: float) -> list[float]:
        """Fraction of [0, end_s] each replica was up."""
        if end_s <= 0:
            return [1.0] * len(self.replicas)
        return [1.0 - sum(max(0.0, min(b, end_s) - min(a, end_s)) for a, b in spans) / end_s
                for spans in self.downtime]

    # -- workload processes ----------------------------------------------------------------
    def arrive(self, df: pd.DataFrame):
        """Open loop: submit each request at its arrival time."""
        env = self.env
        # Arrival times on the clock's grid (TICK = 2**-30 s), like every event time.
        times = (np.rint(df["arrival_s"].to_numpy(dtype=float) * SCALE) / SCALE).tolist()
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
            rep.run_ahead = rep.fast and not sc.faults and sc.random_faults is None
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
        """``pull(now)``: submit every request that arrives by ``now`` (at its own time)."""
        n, submit, state = len(times), self.submit, [0]

        def pull(now: float) -> None:
            i = state[0]
            while i < n and times[i] <= now:
                submit(self._new(i, times[i], prompts[i], outputs[i]), times[i])
                i += 1
            state[0] = i
            self.next_arrival_s = times[i] if i < n else float("inf")

        return pull

    def client(self, c: int, counter: list[int], prompts: LengthStream, outputs: LengthStream):
        """Closed loop: one client sends its next request when its previous one finishes."""
        env, w = self.env, self.plan.scenario.workload
        stalls = 0
        while True:
            if w.num_requests is not None and counter[0] >= w.num_requests:
                return
            if w.duration_s is not None and env.now >= w.duration_s:
                return
            rid = counter[0]
            counter[0] += 1
            req = Request(rid, env.now, prompts.next(), outputs.next(), client=c)
            done = self.waiters[rid] = env.event()
            before = env.now
            self.submit(req)
            yield done
            stalls = stalls + 1 if env.now == before else 0
            # With no count to reach, rejections that take no time would never end the run.
            if stalls > 1000 and w.num_requests is None:
                raise ScenarioError("workload: closed-loop requests are all rejected at once "
                                    f"(prompt + output > max_model_len {self.max_len})")
            if w.think_time_s:
                yield env.timeout(ticks(w.think_time_s))


def _check_faults(s: Scenario, plan: ClusterPlan) -> None:
    """Every scheduled fault names a node, GPU or link of the cluster's graph."""
    try:
        for f in s.faults:
            resolve_target(plan.graph, f.target)
    except ScenarioError as exc:
        raise exc.with_source(s.source) from None


def _start_faults(env: simpy.Environment, cluster: Cluster, s: Scenario,
                  rng: np.random.Generator) -> None:
    """Scheduled and random fault processes (targets are checked first)."""
    _check_faults(s, cluster.plan)
    if s.faults:
        env.process(scheduled_faults(env, s.faults, cluster.act, cluster.act_permanent))
    if s.random_faults is not None:
        horizon = s.workload.duration_s if s.workload.arrival == "closed_loop" else None
        env.process(random_faults(env, s.random_faults, cluster.plan.graph, rng, cluster.act,
                                  cluster.done, horizon))


def _rngs(seed: int) -> dict[str, np.random.Generator]:
    names = ("arrivals", "prompts", "outputs", "router", "faults", "sessions")
    seqs = np.random.SeedSequence(seed).spawn(len(names))
    return {n: np.random.default_rng(q) for n, q in zip(names, seqs, strict=True)}


def workload_requests(s: Scenario) -> pd.DataFrame | None:
    """The open-loop requests the scenario's seed draws (what :func:`run` replays), or None
    for a closed loop; needs no cluster (a planner draws them once for many layouts)."""
    if s.workload.arrival == "closed_loop":
        return None
    return open_loop_workload(s, _rngs(s.seed))


def check(scenario: Scenario | dict | str) -> tuple[ClusterPlan, pd.DataFrame | None]:
    """Validate everything a run needs without running: the cluster plan and, for open-loop
    workloads, the requests (a trace file is read and checked here).

    Returns
    -------
    (ClusterPlan, DataFrame or None)
        The plan, and the open-loop requests (None for closed loop).
    """
    s = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    plan = build_pools(s) if s.pools else build_plan(s)
    _check_faults(s, plan)
    return plan, workload_requests(s)


def run(scenario: Scenario | dict | str, *, progress: bool = False,
        keep_steps: bool = True, energy: bool | None = None) -> Result:
    """Simulate a scenario and return its :class:`Result`; writes nothing to disk.

    Parameters
    ----------
    scenario : Scenario, dict or path
        Validated with :func:`simulator.load_scenario` when not already a Scenario.
    progress : bool
        Show a progress bar (completed requests) on stderr.
    keep_steps : bool
        Keep one record per stage step (``Result.steps``); also off when the scenario's
        ``output.steps`` is false. Summaries do not need them.
    energy : bool or None
        When step records are not kept, still fold their work per window as the run goes
        (:class:`simulator.metrics.power.StepFold`) for energy, power and the MoE summary.
        It costs about half a run's time again on decode-heavy runs (the engine builds
        the records); False skips it and leaves those keys NaN. None: the scenario's
        ``output.energy`` (default False).
    """
    s = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    energy = s.output.energy if energy is None else energy
    with _young_collections_rarer():
        if s.pools:
            return _run_pools(s, progress, keep_steps, energy)
        return _run(s, progress, keep_steps, energy)



def _start(env: simpy.Environment, cluster: Cluster, s: Scenario,
           rngs: dict[str, np.random.Generator]) -> int | None:
    """Start the workload's processes (closed-loop clients or the open-loop arrivals) and
    the faults; returns the number of requests the run expects (None: until time ends)."""
    w = s.workload
    if w.arrival == "closed_loop":
        counter = [0]
        prompts = LengthStream(w.prompt_tokens, rngs["prompts"])
        outputs = LengthStream(w.output_tokens, rngs["outputs"])
        for c in range(w.concurrency):
            env.process(cluster.client(c, counter, prompts, outputs))
        total = w.num_requests
    else:
        df = open_loop_workload(s, rngs)
        if df.empty:
            raise ScenarioError("workload: no request arrives (check num_requests, duration_s, "
                                "start_s against the trace)", source=s.source)
        env.process(cluster.arrive(df))
        total = len(df)
    cluster.expected = total
    _start_faults(env, cluster, s, rngs["faults"])
    return total


def _availability(cluster: Cluster) -> dict:
    """Availability over the workload (mean and worst replica) and the retries."""
    avail = cluster.availability(cluster.last_event_s)
    return {"availability_mean": float(np.mean(avail)),
            "availability_min": float(np.min(avail)), "retries_total": cluster.retries}


def _run(s: Scenario, progress: bool, keep_steps: bool, energy: bool = True) -> Result:
    wall0 = time.perf_counter()
    plan = build_plan(s)
    rngs = _rngs(s.seed)
    env = simpy.Environment()
    fold = (_fold(plan, stage_hardware(plan))
            if energy and not (s.output.steps and keep_steps) else None)
    recorder = Recorder(keep_steps=s.output.steps and keep_steps,
                        speculative=s.speculative is not None, fold=fold)
    cluster = Cluster(env, plan, make_router(s.router.policy, rngs["router"],
                                             load_weight=s.router.load_weight), recorder)
    events = _drive(env, cluster, _start(env, cluster, s, rngs), progress)
    cluster.close()
    requests = recorder.requests_frame()
    steps = recorder.steps_frame()
    engine = {k: sum(getattr(r, k) for r in cluster.replicas)
              for k in ("steps", "step_tokens", "union_s")}
    engine["stage_busy_s"] = [sum(r.stage_busy_s[i] for r in cluster.replicas)
                              for i in range(s.parallel.pp)]
    engine["gaps"] = cluster.gaps
    summary = summarize(requests, engine, ttft_slo_s=s.slo.ttft_s, tpot_slo_s=s.slo.tpot_s,
                        max_num_batched_tokens=s.engine.max_num_batched_tokens,
                        pp=s.parallel.pp)
    if plan.speculative is not None:
        summary.update(speculative_summary(requests, cluster.spec_stats.draft_s,
                                           sum(engine["stage_busy_s"]),
                                           cluster.spec_stats.spec_steps,
                                           cluster.spec_stats.plain_steps))
    summary["kv_blocks_per_replica"] = plan.memory.kv_blocks
    summary["kv_tokens_per_replica"] = plan.memory.kv_tokens
    summary["max_model_len"] = plan.max_model_len
    summary["gpus"] = plan.gpus_used
    summary["simpy_events"] = events
    summary.update(_availability(cluster))
    if plan.model.moe is not None:
        steps = add_moe_columns(steps, [rp.stages for rp in plan.replicas])
        summary.update(moe_summary(steps) if fold is None else fold.moe_summary())
    summary.update(link_utilization(plan, [r.step_tokens for r in cluster.replicas],
                                    [r.steps for r in cluster.replicas],
                                    summary["simulated_time_s"]))
    kept = steps if not steps.empty else None
    kv_capacity = {r: plan.memory.kv_blocks for r in range(s.parallel.dp)}
    ts, events_df, window_s, warnings = _observe(
        s, requests, kept, cluster, summary, kv_capacity,
        plan.memory.kv_blocks // plan.streams_per_replica)
    gpu_ts = pd.DataFrame()
    if kept is not None:
        edges = window_edges(float(ts["window_end_s"].iloc[-1]), window_s)
        gpu_ts = gpu_windows(steps, stage_hardware(plan), edges)
        links = link_windows(plan, [r.step_tokens for r in cluster.replicas],
                             [r.steps for r in cluster.replicas], steps, edges)
        ts = pd.concat([ts, links], axis=1)  # the same windows
    elif fold is not None:  # steps not kept: their work folded per window as they came
        edges = window_edges(float(ts["window_end_s"].iloc[-1]), window_s)
        gpu_ts = fold.gpu_windows(fold.stages, edges)
    gpu_ts, ts = _power(s, plan, requests, summary, gpu_ts, ts, window_s)
    summary["wall_time_s"] = time.perf_counter() - wall0
    return Result(summary, requests, steps, s, plan, ts, events_df, gpu_ts, warnings)


def _power(s: Scenario, plan: ClusterPlan, requests: pd.DataFrame, summary: dict,
           gpu_ts: pd.DataFrame, ts: pd.DataFrame, window_s: float):
    """Power per GPU and window, cluster power per window (``power_w`` columns), energy and
    cost keys in ``summary`` (simulator/metrics/power.py; NaN energy without a GPU's
    ``tdp_w``/``idle_w``)."""
    gpu = plan.node.gpu
    power = np.zeros(0)
    if len(gpu_ts) and gpu.tdp_w is not None and gpu.idle_w is not None:
        gpu_ts = add_power(gpu_ts, gpu.idle_w, gpu.tdp_w)
        edges = window_edges(float(ts["window_end_s"].iloc[-1]), window_s)
        power = cluster_power(gpu_ts, edges, gpus_per_node=plan.node.gpus_per_node,
                              idle_w=gpu.idle_w)
        ts = ts.assign(power_w=power)
    summary.update(energy_summary(power, window_s, requests))
    summary.update(cost_summary(requests, plan.gpus_used,
                                gpu_hour_usd(gpu.name, s.cluster.gpu_hour_usd)))
    return gpu_ts, ts



def _observe(s: Scenario, requests: pd.DataFrame, kept: pd.DataFrame | None,
             cluster: Cluster, summary: dict, kv_capacity: dict[int, int],
             stream_blocks: int) -> tuple[pd.DataFrame, pd.DataFrame, float, list[str]]:
    """The time series, alert events, window and warnings of a run; adds the downtime
    spans to ``summary`` and, with steps kept, the binding-resource batch efficiency."""
    eng = s.engine
    window_s, warnings = _window(requests, s.output.window_s)
    warnings += _outcome_warnings(requests, cluster)
    ts = timeseries(requests, kept, window_s=window_s, budget=eng.max_num_batched_tokens,
                    kv_capacity=kv_capacity, max_num_seqs=eng.max_num_seqs,
                    stream_blocks=stream_blocks, requeues=cluster.recorder.requeues_frame())
    ts = mark_down(ts, cluster.downtime, window_edges(float(ts["window_end_s"].iloc[-1]),
                                                      window_s))
    thresholds = {k: getattr(s.alerts, k) for k in ALERT_KEYS}
    events_df = alerts(requests, kept, ts, thresholds, window_s=window_s,
                       budget=eng.max_num_batched_tokens, max_num_seqs=eng.max_num_seqs,
                       stream_blocks=stream_blocks)
    # [replica, down at (s), up again at (s) or None if never, the fault that took it down]
    if kept is not None:  # the binding resource's fill, as the time series and alert
        summary["batch_efficiency_mean"] = batch_fill_mean(
            kept, eng.max_num_batched_tokens, eng.max_num_seqs, stream_blocks)
    summary["downtime_spans"] = [[i, a, b if np.isfinite(b) else None, cause]
                                 for i, (spans, causes) in enumerate(zip(
                                     cluster.downtime, cluster.down_causes, strict=True))
                                 for (a, b), cause in zip(spans, causes, strict=True)]
    return ts, events_df, window_s, warnings


#: Most windows of a run's time series: memory must not grow with simulated time / window.
MAX_WINDOWS = 100_000


def _window(requests: pd.DataFrame, window_s: float) -> tuple[float, list[str]]:
    """The time-series window: ``output.window_s``, widened so the run spans at most
    :data:`MAX_WINDOWS` windows (with a warning saying so)."""
    times = requests[["arrival_s", "finish_s"]].to_numpy(float)
    end = float(np.nanmax(times)) if np.isfinite(times).any() else 0.0
    if end / window_s <= MAX_WINDOWS:
        return window_s, []
    wide = end / MAX_WINDOWS
    return wide, [f"output.window_s = {window_s:g} s would cut the {end:.6g} s run into "
                  f"{end / window_s:.3g} windows; timeseries.csv and the alerts use "
                  f"{wide:.6g} s windows instead (at most {MAX_WINDOWS})"]


def _outcome_warnings(requests: pd.DataFrame, cluster: Cluster) -> list[str]:
    """Sentences about a run that served nothing, or whose cluster can never serve again."""
    out = []
    if cluster.hopeless is not None:
        t, targets = cluster.hopeless
        out.append(f"no replica can ever serve again after t = {t:.6g} s (faults without "
                   f"a duration: {targets}); the requests waiting then and arriving later "
                   f"were dropped (when their clients gave up, else at the end of the "
                   f"workload)")
    status = requests["status"]
    if len(requests) and not (status == "completed").any():
        counts = status.value_counts()
        what = ", ".join(f"{int(n)} {k}" for k, n in counts.items())
        why = (f" (prompt + output tokens > max_model_len {cluster.max_len})"
               if (status == "rejected").all() else "")
        out.append(f"no request completed: {what}{why}")
    return out


def stage_hardware(plan: ClusterPlan) -> list[StageHardware]:
    """Capacities of every replica stage's GPUs, for utilization."""
    g, node = plan.graph, plan.node
    paths = Paths(g)
    gpu = node.gpu
    out = []
    for rp in plan.replicas:
        stages = rp.placement.stages
        for i, group in enumerate(stages):
            last = i == len(stages) - 1
            path = () if last else paths.path(group[0], stages[i + 1][0])
            over_nic = any(g.edges[a, b]["kind"] == "network"
                           for a, b in zip(path, path[1:], strict=False))
            out.append(StageHardware(rp.placement.replica, i, group, rp.stages[i],
                                     gpu.peak(plan.scenario.model.weight_dtype),
                                     gpu.hbm_bandwidth_Bps, node.scale_up.bandwidth_Bps,
                                     node.nic.bandwidth_Bps, over_nic, last))
    return out


@contextmanager
def _young_collections_rarer(threshold: int = 100_000):
    """Run the cyclic garbage collector's youngest generation every ``threshold``
    allocations instead of every 700, restored afterwards. A run allocates millions of
    short-lived acyclic objects (events, step records) in which the collector finds next to
    nothing (measured: ~1,000 objects freed in 600 collections on the Vidur workload) while
    costing ~5% of the run; reference counting frees them anyway."""
    old = gc.get_threshold()
    gc.set_threshold(max(old[0], threshold), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


def _drive(env: simpy.Environment, cluster: Cluster, total: int | None, progress: bool) -> int:
    """Process every event; returns how many. Shows a progress bar when asked."""
    step, events = env.step, 0
    bar = tqdm(total=total, unit="req", desc="simulating", leave=False) if progress else None
    try:
        if bar is None:
            while True:
                step()
                events += 1
        while True:
            for _ in range(20_000):
                step()
            events += 20_000
            bar.update(cluster.completed - bar.n)
            bar.set_postfix_str(f"t={env.now:.0f}s")
    except EmptySchedule:
        pass
    finally:
        if bar is not None:
            bar.close()
    return events


class PooledCluster(PoolCluster, Cluster):
    """A cluster of pools (:mod:`simulator.cluster.disagg`) with Cluster's workload
    processes."""


def _run_pools(s: Scenario, progress: bool, keep_steps: bool, energy: bool = True
               ) -> Result:
    """:func:`run` for a scenario with ``[[pools]]`` (docs/disaggregation.md): time series
    and alerts as without pools (batch efficiency against ``[engine]``'s token budget);
    link and per-GPU utilization are not computed for pools yet."""
    wall0 = time.perf_counter()
    plan = build_pools(s)
    rngs = _rngs(s.seed)
    env = simpy.Environment()
    fold = (_fold(plan, [h for p in plan.pools for h in stage_hardware(p.plan)])
            if energy and not (s.output.steps and keep_steps) else None)
    recorder = Recorder(keep_steps=s.output.steps and keep_steps, fold=fold)
    cluster = PooledCluster(env, plan, recorder, rngs)
    events = _drive(env, cluster, _start(env, cluster, s, rngs), progress)
    cluster.close()
    requests = cluster.request_columns(recorder.requests_frame())
    steps = recorder.steps_frame()
    engine = cluster.engine_totals()
    summary = summarize(requests, engine, ttft_slo_s=s.slo.ttft_s, tpot_slo_s=s.slo.tpot_s,
                        max_num_batched_tokens=s.engine.max_num_batched_tokens,
                        pp=len(engine["stage_busy_s"]))
    summary["kv_blocks_per_replica"] = [p.plan.memory.kv_blocks for p in plan.pools]
    summary["kv_tokens_per_replica"] = [p.plan.memory.kv_tokens for p in plan.pools]
    summary["max_model_len"] = plan.max_model_len
    summary["gpus"] = plan.gpus_used
    summary["simpy_events"] = events
    summary.update(_availability(cluster))
    summary.update(pool_summary(requests, cluster.pool_table(), summary))
    kept = steps if not steps.empty else None
    kv_capacity = {rp.placement.replica: p.plan.memory.kv_blocks
                   for p in plan.pools for rp in p.plan.replicas}
    stream_blocks = min(p.plan.memory.kv_blocks // p.plan.streams_per_replica
                        for p in plan.pools)
    ts, events_df, window_s, warnings = _observe(s, requests, kept, cluster, summary,
                                                 kv_capacity, stream_blocks)
    if plan.model.moe is not None:
        steps = add_moe_columns(steps, [rp.stages for rp in plan.replicas])
        summary.update(moe_summary(steps) if fold is None else fold.moe_summary())
    gpu_ts, ts = _pool_power(plan, steps if kept is not None else fold, requests, summary,
                             ts, window_s)
    usd = sum(p.gpus * gpu_hour_usd(p.plan.node.gpu.name, p.spec.gpu_hour_usd)
              for p in plan.pools)  # the GPU-weighted price, each pool's own or its default
    summary.update(cost_summary(requests, plan.gpus_used, usd / max(plan.gpus_used, 1)))
    summary["wall_time_s"] = time.perf_counter() - wall0
    return Result(summary, requests, steps, s, plan, ts, events_df, gpu_ts, warnings)


def _fold(plan: ClusterPlan | PooledPlan, stages: list[StageHardware]) -> StepFold:
    """The fold of a run that does not keep its step records: the work of ``stages`` per
    ``output.window_s`` window, and the MoE sums of a MoE model."""
    moe = [rp.stages for rp in plan.replicas] if plan.model.moe is not None else None
    return StepFold(stages, plan.scenario.output.window_s, moe)


def _pool_power(plan: PooledPlan, steps: pd.DataFrame | StepFold | None,
                requests: pd.DataFrame,
                summary: dict, ts: pd.DataFrame, window_s: float):
    """:func:`simulator.metrics.pools.pool_energy` of a pooled run: per-GPU power, the
    ``power_w`` and ``power_w_<pool>`` columns of the time series, the energy keys."""
    edges = window_edges(float(ts["window_end_s"].iloc[-1]), window_s)
    node_of = {d["index"]: d["node"] for _, d in plan.graph.nodes(data=True)
               if d["kind"] == "gpu"}
    gpu_ts, power, keys = pool_energy(
        steps, [(p.spec.name, stage_hardware(p.plan), p.plan.node.gpu) for p in plan.pools],
        node_of, edges, requests)
    summary.update(keys)
    return gpu_ts, ts.assign(**power) if power else ts
