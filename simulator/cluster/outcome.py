"""What a finished run's records become beside the request and step tables: power,
energy and cost (:func:`run_power`, :func:`step_fold`), the time series and
alerts (:func:`observe`, :func:`series_window`), the warnings about what the run could not do
(:func:`outcome_warnings`), and each stage's hardware (:func:`stage_hardware`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import networkx as nx
import numpy as np
import pandas as pd

from simulator.cluster.plan import ClusterPlan, PoolPlan
from simulator.engine.schedulers import sarathi_chunk
from simulator.hardware.prices import gpu_hour_usd
from simulator.io.schema import Scenario
from simulator.metrics.alerts import THRESHOLD_KEYS as ALERT_KEYS
from simulator.metrics.alerts import alerts
from simulator.metrics.pools import pool_energy
from simulator.metrics.power import StepFold, add_power, cluster_power, cost_summary, energy_summary
from simulator.metrics.timeseries import batch_fill_mean, mark_down, timeseries, window_edges
from simulator.metrics.utilization import StageHardware, gpu_windows
from simulator.topology.graph import Paths

if TYPE_CHECKING:
    from simulator.cluster.simulation import Cluster


def run_power(plan: ClusterPlan, work: pd.DataFrame | StepFold | None,
              stages: list[StageHardware], requests: pd.DataFrame, summary: dict,
              ts: pd.DataFrame, window_s: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-GPU utilization and power per window of every pool's GPUs (the step records
    ``work``, or their fold; None: neither, and the energy keys are NaN), the cluster's
    power per window (the ``power_w`` column; with pools also ``power_w_<pool>``), and the
    energy and cost keys in ``summary`` (simulator/metrics/power.py; NaN energy without a
    GPU's ``tdp_w``/``idle_w``).

    A colocated plan's one pool powers its nodes as
    :func:`simulator.metrics.power.cluster_power` says; with ``[[pools]]`` each pool's
    share of its nodes is :func:`simulator.metrics.pools.pool_energy`'s, and the price is the
    GPU-weighted mean of each pool's own (or its GPU's default).
    """
    edges = window_edges(float(ts["window_end_s"].iloc[-1]), window_s)
    if work is None:
        gpu_ts = pd.DataFrame()
    elif isinstance(work, StepFold):  # steps not kept: their work folded as they came
        gpu_ts = work.gpu_windows(stages, edges)
    else:
        gpu_ts = gpu_windows(work, stages, edges)
    if plan.pooled:
        node_of = {d["index"]: d["node"] for _, d in plan.graph.nodes(data=True)
                   if d["kind"] == "gpu"}
        gpu_ts, power, keys = pool_energy(
            gpu_ts, [(p.name, pool_hardware(plan.graph, p), p.node.gpu) for p in plan.pools],
            node_of, edges, requests)
        summary.update(keys)
        usd = sum(p.gpus * gpu_hour_usd(p.node.gpu.name, p.spec.gpu_hour_usd)
                  for p in plan.pools)  # the GPU-weighted price, each pool's own or default
        summary.update(cost_summary(requests, plan.gpus_used, usd / max(plan.gpus_used, 1)))
        return gpu_ts, ts.assign(**power) if power else ts
    gpu = plan.node.gpu
    power_w = np.zeros(0)
    if len(gpu_ts) and gpu.tdp_w is not None and gpu.idle_w is not None:
        gpu_ts = add_power(gpu_ts, gpu.idle_w, gpu.tdp_w)
        power_w = cluster_power(gpu_ts, edges, gpus_per_node=plan.node.gpus_per_node,
                                idle_w=gpu.idle_w)
        ts = ts.assign(power_w=power_w)
    summary.update(energy_summary(power_w, window_s, requests))
    summary.update(cost_summary(requests, plan.gpus_used,
                                gpu_hour_usd(gpu.name, plan.scenario.cluster.gpu_hour_usd)))
    return gpu_ts, ts


def observe(s: Scenario, requests: pd.DataFrame, kept: pd.DataFrame | None,
             cluster: Cluster, summary: dict, kv_capacity: dict[int, int],
             stream_blocks: int) -> tuple[pd.DataFrame, pd.DataFrame, float, list[str]]:
    """The time series, alert events, window and warnings of a run; adds the downtime
    spans to ``summary`` and, with steps kept, the binding-resource batch efficiency."""
    eng = s.engine
    window_s, warnings = series_window(requests, s.output.window_s)
    warnings += outcome_warnings(requests, cluster) + engine_warnings(s)
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


def series_window(requests: pd.DataFrame, window_s: float) -> tuple[float, list[str]]:
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


def outcome_warnings(requests: pd.DataFrame, cluster: Cluster) -> list[str]:
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


def engine_warnings(s: Scenario) -> list[str]:
    """Sentences about engine keys the run could not take as written: a ``sarathi`` chunk
    smaller than ``max_num_seqs`` (its budget is max(chunk_size, max_num_seqs), so that
    every running decode fits a step; simulator/engine/schedulers.py)."""
    e = s.engine
    if e.scheduler != "sarathi":
        return []
    chunk = sarathi_chunk(e)
    if chunk >= e.max_num_seqs:
        return []
    return [f"engine.scheduler_args.chunk_size = {chunk} is below engine.max_num_seqs = "
            f"{e.max_num_seqs}: the sarathi token budget is max(chunk_size, max_num_seqs) "
            f"= {e.max_num_seqs} so that every running decode fits a step; set "
            f"max_num_seqs <= {chunk} for a {chunk}-token budget"]


def stage_hardware(plan: ClusterPlan) -> list[StageHardware]:
    """Capacities of every replica stage's GPUs, for utilization (pools in order)."""
    return [h for pool in plan.pools for h in pool_hardware(plan.graph, pool)]


def pool_hardware(g: nx.DiGraph, pool: PoolPlan) -> list[StageHardware]:
    """Capacities of the stages of ``pool``'s replicas on the cluster graph ``g``: the
    pool's GPU at the pool's weight dtype."""
    node = pool.node
    paths = Paths(g)
    gpu = node.gpu
    out = []
    for rp in pool.replicas:
        stages = rp.placement.stages
        for i, group in enumerate(stages):
            last = i == len(stages) - 1
            path = () if last else paths.path(group[0], stages[i + 1][0])
            over_nic = any(g.edges[a, b]["kind"] == "network"
                           for a, b in zip(path, path[1:], strict=False))
            out.append(StageHardware(rp.placement.replica, i, group, rp.stages[i],
                                     gpu.peak(pool.scenario.model.weight_dtype),
                                     gpu.hbm_bandwidth_Bps, node.scale_up_per_gpu_Bps,
                                     node.nic.bandwidth_Bps, over_nic, last))
    return out


def step_fold(plan: ClusterPlan, stages: list[StageHardware]) -> StepFold:
    """The fold of a run that does not keep its step records: the work of ``stages`` per
    ``output.window_s`` window, and the MoE sums of a MoE model."""
    moe = [rp.stages for rp in plan.replicas] if plan.model.moe is not None else None
    return StepFold(stages, plan.scenario.output.window_s, moe)
