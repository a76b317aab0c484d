"""Run a scenario: build the cluster, drive the SimPy loop, assemble the :class:`Result`.

:func:`run` is a pure function of the scenario (and its seed): it writes nothing to disk and
keeps no global state. The live cluster is :mod:`simulator.cluster.simulation`; the tables,
power and warnings of a finished run are :mod:`simulator.cluster.outcome`.
"""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import simpy
from simpy.core import EmptySchedule
from tqdm import tqdm

from simulator.cluster.autoscale import Autoscaler
from simulator.cluster.bench import benchmark
from simulator.cluster.disagg import pool_table, request_columns
from simulator.cluster.gateway import Gateway, check_gateway
from simulator.cluster.outcome import (
    observe,
    run_power,
    stage_hardware,
    step_fold,
)
from simulator.cluster.plan import ClusterPlan
from simulator.cluster.pools import build_plan
from simulator.cluster.poolscaling import PoolScaling
from simulator.cluster.simulation import (
    Cluster,
    check_faults,
    open_loop_workload,
    run_rngs,
    start_faults,
    workload_requests,
)
from simulator.engine.clock import ticks_array
from simulator.errors import ScenarioError
from simulator.io.scenario import load_scenario
from simulator.io.schema import Scenario
from simulator.metrics.day import day_summary, with_attainment
from simulator.metrics.links import link_utilization, link_windows
from simulator.metrics.moe import add_moe_columns, moe_summary
from simulator.metrics.pools import pool_summary
from simulator.metrics.power import StepFold
from simulator.metrics.records import Recorder
from simulator.metrics.speculative import speculative_summary
from simulator.metrics.summary import summarize
from simulator.metrics.timeseries import window_edges
from simulator.metrics.utilization import StageHardware
from simulator.workload.arrivals import release_times
from simulator.workload.lengths import LengthStream


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
    #: The simulated time at which Ctrl-C stopped the run (``run(interruptible=True)``);
    #: None for a run that ran to its end. The figures cover what was done by then.
    interrupted_s: float | None = None


def check(scenario: Scenario | dict | str) -> tuple[ClusterPlan, pd.DataFrame | None]:
    """Validate everything a run needs without running: the cluster plan and, for open-loop
    workloads, the requests (a trace file is read and checked here).

    Returns
    -------
    (ClusterPlan, DataFrame or None)
        The plan, and the open-loop requests (None for closed loop).
    """
    s = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    plan = build_plan(s)
    check_faults(s, plan)
    return plan, workload_requests(s)


def run(scenario: Scenario | dict | str, *, progress: bool = False,
        keep_steps: bool = True, energy: bool | None = None,
        interruptible: bool = False) -> Result:
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
    interruptible : bool
        Ctrl-C (KeyboardInterrupt) during the simulation stops it and returns the Result of
        what was done by then, with ``interrupted_s`` set, instead of raising.
    """
    s = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    energy = s.output.energy if energy is None else energy
    with _young_collections_rarer():
        return _run(s, progress, keep_steps, energy, interruptible)


def _start(env: simpy.Environment, cluster: Cluster, s: Scenario,
           rngs: dict[str, np.random.Generator]) -> int | None:
    """Start the workload's processes (closed-loop clients or the open-loop arrivals) and
    the faults; returns the number of requests the run expects (None: until time ends)."""
    w = s.workload
    if w.arrival == "closed_loop":
        counter = [0]
        prompts = LengthStream(w.prompt_tokens, rngs["prompts"])
        outputs = LengthStream(w.output_tokens, rngs["outputs"])
        release = None  # --request-rate inf: every client sends at once
        if w.rate_per_s is not None:
            release = ticks_array(release_times(w, rngs["arrivals"])).tolist()
        if w.client is not None:  # a named benchmark client: warm-ups first
            env.process(benchmark(env, cluster, w, prompts, outputs, release))
        else:
            for c in range(w.concurrency):
                env.process(cluster.client(c, counter, prompts, outputs, release))
        total = w.num_requests
    else:
        df = open_loop_workload(s, rngs)
        if df.empty:
            raise ScenarioError("workload: no request arrives (check num_requests, duration_s, "
                                "start_s against the trace)", source=s.source)
        env.process(cluster.arrive(df))
        total = len(df)
        if w.arrival == "sessions":
            cluster.steady_end_s = float(df.loc[df["turn"] == 0, "arrival_s"].max())
    cluster.expected = total
    start_faults(env, cluster, s, rngs["faults"])
    if s.autoscale is not None:
        cluster.scaling = Autoscaler(env, cluster, s.autoscale, s.slo,
                                     None if w.arrival == "closed_loop" else df)
        env.process(cluster.scaling.run())
    elif any(p.autoscale is not None for p in s.pools):  # per pool (docs/autoscaling.md)
        cluster.scaling = PoolScaling(env, cluster, s.slo)
        env.process(cluster.scaling.run())
    if s.gateway is not None:
        cluster.gateway = Gateway(env, cluster, check_gateway(s.gateway), s.seed)
    return total


def _availability(cluster: Cluster) -> dict:
    """Availability over the workload (mean and worst replica) and the retries."""
    avail = cluster.availability(cluster.last_event_s)
    return {"availability_mean": float(np.mean(avail)),
            "availability_min": float(np.min(avail)), "retries_total": cluster.retries}


def _run(s: Scenario, progress: bool, keep_steps: bool, energy: bool = True,
         interruptible: bool = False) -> Result:
    """:func:`run` of a colocated scenario (a cluster of one pool) or one with ``[[pools]]``
    (docs/disaggregation.md): one path; a pooled run adds the pool columns of requests.csv
    and the pool summary, and its batch efficiency is against ``[engine]``'s token budget."""
    wall0 = time.perf_counter()
    plan = build_plan(s)
    rngs = run_rngs(s.seed)
    env = simpy.Environment()
    stages = stage_hardware(plan)
    recorder, fold = _recording(s, keep_steps, energy, plan, stages, plan.speculates)
    cluster = Cluster(env, plan, recorder, rngs)
    events, stopped = _drive(env, cluster, _start(env, cluster, s, rngs), progress,
                             interruptible)
    cluster.close()
    requests = recorder.requests_frame()
    if plan.pooled:
        requests = request_columns(cluster, requests)
    if cluster.gateway is not None:
        requests = cluster.gateway.columns(requests)
    steps = recorder.steps_frame()
    engine = cluster.engine_totals()
    summary = summarize(requests, engine, ttft_slo_s=s.slo.ttft_s, tpot_slo_s=s.slo.tpot_s,
                        max_num_batched_tokens=s.engine.max_num_batched_tokens,
                        steady_end_s=cluster.steady_end_s,
                        pp=len(engine["stage_busy_s"]))
    if plan.speculates:
        summary.update(_speculation(requests, cluster, engine))
    if plan.pooled:
        summary["kv_blocks_per_replica"] = [p.memory.kv_blocks for p in plan.pools]
        summary["kv_tokens_per_replica"] = [p.memory.kv_tokens for p in plan.pools]
    else:
        summary["kv_blocks_per_replica"] = plan.memory.kv_blocks
        summary["kv_tokens_per_replica"] = plan.memory.kv_tokens
    summary["max_model_len"] = plan.max_model_len
    summary["gpus"] = plan.gpus_used
    summary["simpy_events"] = events
    summary.update(_availability(cluster))
    if plan.pooled:
        summary.update(pool_summary(requests, pool_table(cluster), summary))
    if plan.model.moe is not None:
        steps = add_moe_columns(steps, [rp.stages for rp in plan.replicas])
        summary.update(moe_summary(steps) if fold is None else fold.moe_summary())
    kv = cluster.handoff.transfers.link_bytes() if cluster.handoff is not None else None
    summary.update(link_utilization(plan, [r.step_tokens for r in cluster.replicas],
                                    [r.steps for r in cluster.replicas],
                                    summary["simulated_time_s"], kv))
    kept = steps if not steps.empty else None
    kv_capacity = {rp.placement.replica: p.memory.kv_blocks
                   for p in plan.pools for rp in p.replicas}
    stream_blocks = min(p.memory.kv_blocks // p.streams_per_replica for p in plan.pools)
    ts, events_df, window_s, warnings = observe(s, requests, kept, cluster, summary,
                                                 kv_capacity, stream_blocks)
    if kept is not None:
        edges = window_edges(float(ts["window_end_s"].iloc[-1]), window_s)
        links = link_windows(plan, [r.step_tokens for r in cluster.replicas],
                             [r.steps for r in cluster.replicas], steps, edges, kv=kv)
        ts = pd.concat([ts, links], axis=1)  # the same windows
    gpu_ts, ts = run_power(plan, kept if kept is not None else fold, stages, requests,
                           summary, ts, window_s)
    if cluster.gateway is not None:  # simulator/cluster/gateway.py
        summary.update(cluster.gateway.summary(requests, s.slo))
    if cluster.scaling is not None:  # docs/autoscaling.md
        done = requests[requests["status"] == "completed"]
        edges = ts["window_end_s"].to_numpy()
        if s.autoscale is None:  # pools that scale, each by its own table
            summary.update(cluster.scaling.summary(summary["simulated_time_s"],
                                                   summary.get("gpu_hour_usd"),
                                                   float(done["output_tokens"].sum())))
            ts = ts.assign(**cluster.scaling.timeseries_columns(edges))
        else:
            summary.update(cluster.scaling.summary(
                summary["simulated_time_s"], plan.gpus_used // s.parallel.dp,
                summary["gpu_hour_usd"], float(done["output_tokens"].sum())))
            ts = ts.assign(replicas=cluster.scaling.replicas_over_time(edges))
        ts = with_attainment(ts, requests, s.slo.ttft_s, s.slo.tpot_s)
        interval = (s.autoscale.interval_s if s.autoscale is not None
                    else min(a.interval_s for a in cluster.scaling.scaler_keys()))
        summary.update(day_summary(requests, interval,
                                   cluster.scaling.cold_start_spans(), s.slo.ttft_s,
                                   s.slo.tpot_s))
    summary["wall_time_s"] = time.perf_counter() - wall0
    return Result(summary, requests, steps, s, plan, ts, events_df, gpu_ts,
                  warnings, stopped)


def _recording(s: Scenario, keep_steps: bool, energy: bool, plan: ClusterPlan,
               stages: list[StageHardware], spec: bool) -> tuple[Recorder, StepFold | None]:
    """The run's recorder, and the fold that takes its step records when they are not kept
    but energy is asked for (``run(energy=...)``, ``output.energy``). ``spec``: whether the
    run speculates (with pools, whether any pool does)."""
    keep = s.output.steps and keep_steps
    fold = step_fold(plan, stages) if energy and not keep else None
    return Recorder(keep_steps=keep, speculative=spec, fold=fold), fold


def _speculation(requests: pd.DataFrame, cluster: Cluster, engine: dict) -> dict:
    """The speculative summary of a run that speculates, from its cluster's totals."""
    st = cluster.spec_stats
    return speculative_summary(requests, st.draft_s, sum(engine["stage_busy_s"]),
                               st.spec_steps, st.plain_steps)


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


def _drive(env: simpy.Environment, cluster: Cluster, total: int | None, progress: bool,
           interruptible: bool = False) -> tuple[int, float | None]:
    """Process every event; returns how many, and the simulated time at which Ctrl-C
    stopped the loop (None: it ran to its end; ``interruptible`` False lets Ctrl-C raise).
    Shows a progress bar when asked."""
    step, events, stopped = env.step, 0, None
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
    except KeyboardInterrupt:
        if not interruptible:
            raise
        stopped = float(env.now)
    finally:
        if bar is not None:
            bar.close()
    return events, stopped
