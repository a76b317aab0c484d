"""The candidates table of a plan: every layout and engine limit enumerated, built (fit,
placement), estimated and ranked by the estimate (``candidates.csv``).

:func:`enumerate_candidates` runs the colocated layouts' estimates
(:func:`simulator.planner.candidates.layout_rows`, in worker processes for many layouts),
adds the disaggregated pairs (:mod:`simulator.planner.disagg`) and the cross-kind pairs
(:mod:`simulator.planner.hetero`); :func:`rerank` orders the table by the objective at the
near-miss ratios of the simulated points (:mod:`simulator.planner.nearmiss`), as
:func:`simulator.planner.plan.plan` does between its rounds of simulations.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ProcessPoolExecutor

import pandas as pd

from simulator.hardware.prices import gpu_hour_usd
from simulator.hardware.specs import load_node
from simulator.io.schema import Scenario
from simulator.model.spec import load_model
from simulator.planner.candidates import layout_rows
from simulator.planner.disagg import disagg_rows
from simulator.planner.hetero import CrossPairs
from simulator.planner.nearmiss import chance, est_slo, groups_of, margins, objective_values
from simulator.planner.nearmiss import order as est_order
from simulator.planner.ranking import PREFILL_COLUMNS, stable_key
from simulator.planner.space import WorkloadStats, engine_limits, layouts, useful_kv_tokens

#: Layouts from which the estimate runs in worker processes (fewer: start-up dominates).
PARALLEL_LAYOUTS = 8
CANDIDATE_COLUMNS = [
    "tp", "pp", "dp", "max_num_seqs", "max_num_batched_tokens", "chunk_size", "gpus",
    "status", "reason", "kv_tokens_per_replica", "est_capacity_req_per_s", "est_utilization",
    "est_batch", "est_cycle_s", "est_prefill_s", "est_ttft_s", "est_ttft_p99_s", "est_tpot_s",
    "est_goodput_req_per_s", "est_rank", "simulated", "est_objective", "kind", "spec_k",
    "est_slo", "est_tpot_p99_s"]


def with_columns(columns: list[str], model, disagg: bool = False, cross: bool = False
             ) -> list[str]:
    """``columns`` with ``ep`` and ``attention_dp`` after ``dp`` for a MoE model, and the
    prefill pool's columns after ``kind`` with disaggregated candidates (after the decode
    pool's ``decode_node`` with cross-kind pairs)."""
    if disagg:
        i = columns.index("kind") + 1
        pre = [c for c in PREFILL_COLUMNS if model.moe is not None or "_ep" not in c
               and "attention" not in c]
        pre = ["decode_node", *pre] if cross else pre
        columns = [*columns[:i], *pre, *columns[i:]]
    if model.moe is None:
        return columns
    i = columns.index("dp") + 1
    return [*columns[:i], "ep", "attention_dp", *columns[i:]]


def enumerate_candidates(base: dict, s: Scenario, gpus: int, stats: WorkloadStats,
                         objective: str, jobs: int | None = 1, disagg: bool = False,
                         cross: CrossPairs | None = None) -> pd.DataFrame:
    """Every layout of at most ``gpus`` GPUs x every engine limit: built (placement, fit),
    checked for a useful KV cache and estimated; ``status`` is ``feasible`` or
    ``excluded`` with the ``reason``. Sorted by the estimate (``est_rank``). Layouts are
    estimated in ``jobs`` processes (None: the CPUs); the table does not depend on it.
    With ``disagg``, every prefill + decode pool pair joins them
    (:func:`simulator.planner.disagg.disagg_rows`); with a ``[speculative]`` section,
    every layout with and without speculation (``spec_k``); with ``cross``, the pairs with
    the decode pool on another node kind (:mod:`simulator.planner.hetero`)."""
    model = load_model(s.model.name, s.base_dir)
    limits = engine_limits(s)
    probe = min(limits, key=lambda lim: (lim.budget, lim.max_num_seqs))
    positions = s.engine.max_model_len or model.max_position_embeddings
    need = useful_kv_tokens(stats, positions)
    work = [(base, s.seed, lay, limits, probe, need, stats, s.slo.ttft_s, s.slo.tpot_s,
             model.moe is not None) for lay in layouts(model, gpus)]
    workers = max(1, min(jobs or os.cpu_count() or 1, len(work)))
    if workers == 1 or len(work) < PARALLEL_LAYOUTS:
        rows = [row for job in work for row in layout_rows(job)]
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            rows = [row for part in pool.map(layout_rows, work, chunksize=4) for row in part]
    if disagg:
        rows += disagg_rows(base, s, model, gpus, stats, need, s.slo.ttft_s, s.slo.tpot_s)
    if disagg and cross is not None:
        rows += cross.rows(base, s, model, gpus, stats, need, s.slo.ttft_s, s.slo.tpot_s)
    df = pd.DataFrame(rows)
    columns = with_columns(CANDIDATE_COLUMNS, model, disagg, cross is not None)
    for c in columns:
        if c not in df:
            df[c] = math.nan
    df["chunk_size"] = df["chunk_size"].astype("Int64")
    df = rerank(df, s, stats, objective, margins(None), cross).reset_index(drop=True)
    feasible = df["status"] == "feasible"
    df["est_rank"] = pd.Series(range(1, len(df) + 1)).where(feasible).astype("Int64")
    return df[columns]


def rerank(df: pd.DataFrame, s: Scenario, stats: WorkloadStats, objective: str,
           m: dict[str, float], cross: CrossPairs | None = None) -> pd.DataFrame:
    """``df`` with ``est_slo`` and ``est_objective`` at the near-miss ratios ``m``
    (:mod:`simulator.planner.nearmiss`; cross-kind pairs at each pool's own price and
    power), sorted in ranking order (index kept)."""
    node = load_node(s.cluster.topology, s.base_dir)
    price = gpu_hour_usd(node.gpu.name, s.cluster.gpu_hour_usd)
    df = df.copy()
    groups = groups_of(df) if m.get("groups") else None  # once for both
    df["est_slo"] = est_slo(df, s.slo, m, groups)
    p = chance(df, s.slo, m, groups)  # measured error: the likely ones first (nearmiss.order)
    if p is not None:
        df["est_chance"] = p
    df["est_objective"] = objective_values(df, objective, price, node, stats.output_mean,
                                           stats.rate_per_s)
    if cross is not None:
        df["est_objective"] = cross.values(df, objective, s, stats)
    return df.loc[est_order(df, objective, stable_key)]
