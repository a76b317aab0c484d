"""One layout's candidates: the scenario overrides of a (layout, engine limits) point, its
memory plan, and the rows of candidates.csv for every engine limit (built, fitted, checked
for a useful KV cache and estimated). A module of its own so that worker processes run
:func:`layout_rows` (:func:`simulator.planner.plan.enumerate_candidates`).
"""

from __future__ import annotations

import math

from simulator.cluster.build import ClusterPlan, build_plan, expert_setup
from simulator.errors import ScenarioError
from simulator.io.scenario import load_scenario
from simulator.model.memory import GIB, plan_memory, plan_moe_memory
from simulator.planner.estimate import estimate
from simulator.planner.space import Layout, Limits
from simulator.sweep import resolve_point


def _point(lay: Layout, lim: Limits, moe_model: bool = False) -> dict:
    """Scenario overrides of a candidate. A MoE model's layout always sets ep and
    attention_dp (the scenario's own [parallel] is ignored), and no redundant experts
    without EP."""
    moe: dict = {}
    if moe_model:
        moe = {"parallel.ep": lay.ep, "parallel.attention_dp": lay.attention_dp}
        if lay.ep == 1:
            moe["parallel.redundant_experts"] = 0
    return {"parallel.tp": lay.tp, "parallel.pp": lay.pp, "parallel.dp": lay.dp, **moe,
            **lim.overrides()}


def _memory(cp: ClusterPlan, lim: Limits):
    s, m = cp.scenario, cp.model
    e = s.engine
    if m.moe is not None or m.mla is not None:
        return plan_moe_memory(m, cp.node.gpu.memory_bytes, s.parallel.tp, s.parallel.pp,
                               expert_setup(s, m, cp.node)[0], s.model.weight_dtype,
                               s.model.kv_dtype, e.block_size, e.gpu_memory_utilization,
                               lim.budget, lim.max_num_seqs, e.runtime_reserve_gib * GIB)
    return plan_memory(m, cp.node.gpu.memory_bytes, s.parallel.tp, s.parallel.pp,
                       s.model.weight_dtype, s.model.kv_dtype, e.block_size,
                       e.gpu_memory_utilization, lim.budget, lim.max_num_seqs,
                       e.runtime_reserve_gib * GIB)


def layout_rows(job: tuple) -> list[dict]:
    """Candidate rows of one layout x every engine limit (see
    :func:`enumerate_candidates`); a top-level function so that worker processes run it."""
    base, seed, lay, limits, probe, need, stats, ttft_s, tpot_s, moe = job
    try:
        cp = build_plan(load_scenario(resolve_point(base, _point(lay, probe, moe), seed)))
    except ScenarioError as exc:
        cp, why = None, "; ".join(exc.problems)
    rows = []
    for lim in limits:
        row = {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "ep": lay.ep,
               "attention_dp": lay.attention_dp,
               "max_num_seqs": lim.max_num_seqs,
               "max_num_batched_tokens": lim.max_num_batched_tokens,
               "chunk_size": lim.chunk_size, "gpus": lay.gpus, "status": "excluded",
               "reason": "", "kv_tokens_per_replica": math.nan, "simulated": False}
        rows.append(row)
        if cp is None:
            row["reason"] = why
            continue
        try:
            mem = _memory(cp, lim)
        except ScenarioError as exc:
            row["reason"] = "; ".join(exc.problems)
            continue
        row["kv_tokens_per_replica"] = mem.kv_tokens
        per_stream = mem.kv_tokens // cp.streams_per_replica
        if per_stream < need:
            row["reason"] = (f"KV cache of {per_stream} tokens per stream is under the "
                             f"useful {need} (the longest request, and 8 mean ones)")
            continue
        est = estimate(cp, lim, mem.kv_tokens, stats, ttft_s, tpot_s)
        row.update(est.as_row(), status="feasible")
    return rows
