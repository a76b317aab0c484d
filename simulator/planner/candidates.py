"""One layout's candidates: the scenario overrides of a (layout, engine limits) point, its
memory plan, and the rows of candidates.csv for every engine limit (built, fitted, checked
for a useful KV cache and estimated). A module of its own so that worker processes run
:func:`layout_rows` (:func:`simulator.planner.search.enumerate_candidates`).
"""

from __future__ import annotations

import math

from simulator.cluster.build import (
    ClusterPlan,
    drafter_of,
    expert_setup,
    with_draft_kv,
)
from simulator.cluster.pools import build_plan
from simulator.engine.speculative import Acceptance
from simulator.errors import ScenarioError
from simulator.io.scenario import load_scenario
from simulator.model.memory import GIB, plan_memory, plan_moe_memory
from simulator.model.speculative import draft_kv_bytes_per_token
from simulator.planner.estimate import SpecStep, estimate
from simulator.planner.space import Layout, Limits
from simulator.sweep import resolve_point

#: Speculative tokens per step searched when the scenario has a ``[speculative]`` section
#: with one acceptance probability (geometric model: any k is defined); with a list of
#: per-position probabilities or ``mean_accepted_tokens``, only the scenario's k.
SPEC_TOKENS = (1, 3, 5)


def point_overrides(lay: Layout, lim: Limits, moe_model: bool = False) -> dict:
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


def without_spec(point: dict) -> dict:
    """A resolved scenario without its ``[speculative]`` section."""
    return {k: v for k, v in point.items() if k != "speculative"}


def memory_plan(cp: ClusterPlan, lim: Limits, drafter: bool = False):
    """The memory plan at ``lim``; with ``drafter``, the [speculative] drafter's weights
    and KV as the cluster build charges them."""
    s, m = cp.scenario, cp.model
    e = s.engine
    draft, extra = drafter_of(s, m, s.parallel.tp, cp.node) if drafter else (None, 0.0)
    reserve = e.runtime_reserve_gib * GIB + extra
    if m.layer_plan:
        mem = plan_moe_memory(m, cp.node.gpu.memory_bytes, s.parallel.tp, s.parallel.pp,
                              expert_setup(s, m, cp.node)[0], s.model.weight_dtype,
                              s.model.kv_dtype, e.block_size, e.gpu_memory_utilization,
                              lim.budget, lim.max_num_seqs, reserve)
    else:
        mem = plan_memory(m, cp.node.gpu.memory_bytes, s.parallel.tp, s.parallel.pp,
                          s.model.weight_dtype, s.model.kv_dtype, e.block_size,
                          e.gpu_memory_utilization, lim.budget, lim.max_num_seqs, reserve)
    if drafter:
        mem = with_draft_kv(mem, draft_kv_bytes_per_token(
            s.speculative.method, m, draft, s.parallel.tp, s.model.kv_dtype))
    return mem


def spec_options(cp: ClusterPlan) -> list[SpecStep]:
    """The speculative settings searched for a built plan with a [speculative] section:
    its k and, when the acceptance is one probability, every k of ``SPEC_TOKENS``."""
    sp, cfg = cp.scenario.speculative, cp.speculative
    if sp is None or cfg is None:
        return []
    ks = sorted({sp.num_speculative_tokens, *SPEC_TOKENS}) if isinstance(
        sp.acceptance, int | float) else [sp.num_speculative_tokens]
    out = []
    for k in ks:
        acc = (cfg.acceptance if k == cfg.k else Acceptance.geometric(float(sp.acceptance), k))
        out.append(SpecStep(k, acc.mean, cfg.draft, sp.disable_by_batch_size))
    return out


def layout_plan(base: dict, seed: int, lay: Layout, probe: Limits, moe: bool
                ) -> tuple[ClusterPlan | None, str]:
    """The built plan of ``lay`` at the ``probe`` limits on ``base`` (a resolved scenario),
    and why it does not build ("" when it does at once); a layout that does not build
    with a ``[speculative]`` section is built without it (without the drafter it may still
    fit; its reason is kept)."""
    point = resolve_point(base, point_overrides(lay, probe, moe), seed)
    try:
        return build_plan(load_scenario(point)), ""
    except ScenarioError as exc:
        cp, why = None, "; ".join(exc.problems)
        if "speculative" in point:  # without the drafter the layout may still fit
            try:
                cp = build_plan(load_scenario(without_spec(point)))
            except ScenarioError:
                pass
    return cp, why


def layout_rows(job: tuple, built: tuple[ClusterPlan | None, str] | None = None
                ) -> list[dict]:
    """Candidate rows of one layout x every engine limit (see
    :func:`enumerate_candidates`); a top-level function so that worker processes run it.
    ``built`` is the layout's :func:`layout_plan` when the caller has it."""
    base, seed, lay, limits, probe, need, stats, ttft_s, tpot_s, moe = job
    cp, why = built if built is not None else layout_plan(base, seed, lay, probe, moe)
    specs = spec_options(cp) if cp is not None else []
    rows = []
    for lim in limits:
        for spec in [None, *specs]:
            row = {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "ep": lay.ep,
                   "attention_dp": lay.attention_dp,
                   "max_num_seqs": lim.max_num_seqs,
                   "max_num_batched_tokens": lim.max_num_batched_tokens,
                   "chunk_size": lim.chunk_size, "gpus": lay.gpus, "status": "excluded",
                   "reason": "", "kv_tokens_per_replica": math.nan, "simulated": False,
                   "kind": "colocated", "spec_k": spec.k if spec is not None else 0}
            rows.append(row)
            if cp is None:
                row["reason"] = why
                continue
            try:
                mem = memory_plan(cp, lim, drafter=spec is not None)
            except ScenarioError as exc:
                row["reason"] = "; ".join(exc.problems)
                continue
            row["kv_tokens_per_replica"] = mem.kv_tokens
            per_stream = mem.kv_tokens // cp.streams_per_replica
            if per_stream < need:
                row["reason"] = (f"KV cache of {per_stream} tokens per stream is under the "
                                 f"useful {need} (the longest request, and 8 mean ones)")
                continue
            est = estimate(cp, lim, mem.kv_tokens, stats, ttft_s, tpot_s, spec)
            row.update(est.as_row(), status="feasible")
    return rows
