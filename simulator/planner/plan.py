"""The plan: enumerate layouts -> estimate -> simulate the best K and the rule of thumb ->
rank -> recommend, with the constraint that binds.

:func:`plan` is a pure function of the scenario (and its seed): it returns a
:class:`PlanResult` with the candidates table (every enumerated layout and engine limit,
with its estimate or the reason it is out), the simulated table (plan.csv, ranked) and the
recommendation (the candidates table is built by :mod:`~simulator.planner.search`);
the CLI writes the files. Ties sort by a stable key (GPUs, tp, pp, dp,
limits), so the same scenario and seed give the same tables.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import pandas as pd

from simulator.cluster.simulation import workload_requests
from simulator.engine.schedulers import sarathi_chunk
from simulator.errors import NoAnswer, ScenarioError
from simulator.hardware.specs import load_node
from simulator.io.scenario import load_scenario
from simulator.io.schema import Scenario
from simulator.model.spec import load_model
from simulator.planner.candidates import point_overrides, without_spec
from simulator.planner.disagg import pools_of
from simulator.planner.hetero import CrossPairs, cross_pools
from simulator.planner.nearmiss import (
    MAX_DOUBLINGS,
    MAX_REQUESTS,
    flags,
    group_of,
)
from simulator.planner.objectives import (
    compare,
    no_fit,
    no_slo,
    reason,
    versus_groups,
)
from simulator.planner.ranking import (
    group_correlations,
    plan_table,
    rank_correlation,
)
from simulator.planner.search import (
    Colocated,
    Disaggregated,
    Rounds,
    candidates_of,
    enumerate_candidates,
    group_series,
    per_group,
    rerank,
    simulate,
    simulate_best,
    with_columns,
)
from simulator.planner.simulate import Progress, base_scenario, without_pools
from simulator.planner.space import (
    Layout,
    Limits,
    WorkloadStats,
    rule_of_thumb,
    workload_stats,
)
from simulator.sweep import resolve_point

OBJECTIVES = ("goodput_per_gpu", "goodput_per_usd", "tokens_per_joule", "min_ttft",
              "min_tpot")
#: Candidates simulated by default, at most PER_LAYOUT of them with one (tp, pp, dp).
DEFAULT_TOP = 8
PER_LAYOUT = 2
#: Rounds of `top` simulations while no simulated candidate (but the rule) meets the SLOs.
MAX_ROUNDS = 3
#: Rounds after the first that found a meeting point, each only for the candidates the
#: estimate rates ahead of the best that met (:func:`ahead_of_met`).
CHASE_ROUNDS = 1
#: Requests simulated per candidate by default (the scenario's count, capped).
DEFAULT_REQUESTS = 500

#: Columns of plan.csv, in order; the last, INTERVAL_COLUMNS, are each point's 95%
#: intervals and sample (simulator.planner.nearmiss).
PLAN_COLUMNS = [
    "rank", "tp", "pp", "dp", "max_num_seqs", "max_num_batched_tokens", "chunk_size", "gpus",
    "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "ttft_slo_q_s", "tpot_slo_q_s",
    "throughput_tok_per_s", "throughput_tok_per_s_per_gpu", "tok_per_s_per_user",
    "offered_req_per_s", "goodput_req_per_s", "goodput_req_per_s_per_gpu",
    "slo_attainment", "keep_up_ratio", "keep_up_least", "slo_met", "kv_tokens_per_replica",
    "pp_bubble_fraction", "preemptions_total", "est_capacity_req_per_s", "est_ttft_p99_s",
    "est_tpot_s", "placement", "note", "est_objective", "gpu_hour_usd",
    "cost_per_million_output_tokens_usd", "goodput_req_per_usd", "power_mean_w",
    "energy_per_output_token_j", "tokens_per_joule", "binds", "status", "error", "kind",
    "spec_k", "pools", "est_slo", *(INTERVAL_COLUMNS := [
        "ttft_slo_q_lo_s", "ttft_slo_q_hi_s", "tpot_slo_q_lo_s", "tpot_slo_q_hi_s",
        "goodput_req_per_s_per_gpu_ci_half", "requests_total"])]


@dataclass
class PlanResult:
    """What :func:`plan` found. ``error`` is set (and ``best`` is None) when no simulated
    candidate meets the SLOs; the tables are still complete."""

    scenario: Scenario
    objective: str
    quantile: float
    gpus: int
    cluster_gpus: int
    stats: WorkloadStats
    candidates: pd.DataFrame
    table: pd.DataFrame
    rule: Layout | None
    rule_why: str
    best: pd.Series | None
    reason: str
    comparison: str
    error: str | None = None
    wall_time_s: float = 0.0  # the whole plan
    simulated_s: float = 0.0  # sum of the simulations' wall times
    # Spearman's rho between the estimate's and the simulation's objective on the simulated
    # points (simulator.planner.objectives.spearman; NaN with fewer than 3).
    rank_correlation: float = math.nan
    # Spearman's rho per simulation group (colocated, colocated+spec, disaggregated) and
    # the near-miss ratios (estimate / simulation) the plan ended with.
    rank_correlations: dict | None = None
    margins: dict | None = None
    # Ctrl-C stopped the simulations: the tables hold the runs that finished.
    interrupted: bool = False
    # The scenario's own request count (None: its workload has none), kept by
    # recommended.toml; ``stats.requests`` is the sample simulated per candidate.
    own_requests: int | None = None
    # What is within noise about the pick (simulator.planner.nearmiss), after the rounds on
    # a larger sample; empty when the pick is clear of its targets and of the runner-up.
    noise: list | None = None


def plan(scenario: str | dict | Scenario, *, gpus: int | None = None,
         objective: str = "goodput_per_gpu", top: int = DEFAULT_TOP,
         requests: int | None = None, jobs: int | None = None,
         slo_quantile: float = 0.99, overrides: list[str] | None = None,
         disagg: bool = False, cross: CrossPairs | None = None, only: str | None = None,
         progress: bool = False,
         backend: str = "local", address: str | None = None) -> PlanResult:
    """Search layouts and engine limits for a scenario; simulate the best and recommend one.

    Parameters
    ----------
    scenario : path, dict or Scenario
        Model, cluster, workload and SLOs; its own layout is ignored.
    gpus : int, optional
        Most GPUs a layout may use (default: all in the cluster).
    objective : {"goodput_per_gpu", "goodput_per_usd", "tokens_per_joule", "min_ttft", \
"min_tpot"}
        Goodput (requests/s meeting both SLOs) per GPU used, goodput requests per dollar,
        output tokens per joule (simulator.planner.objectives), or the TTFT / TPOT
        quantile.
    top : int
        Candidates simulated per round (best by the estimate, at most 2 per layout), plus
        the rule of thumb; up to 3 rounds while none but the rule meets the SLOs, then
        one more for the unsimulated candidates the estimate rates better than the best
        that met, if any (:func:`ahead_of_met`).
    requests : int, optional
        Requests simulated per candidate, above the scenario's count too (None: the
        scenario's, at most ``DEFAULT_REQUESTS``). recommended.toml keeps the scenario's.
    jobs : int, optional
        Worker processes (default: the CPUs).
    slo_quantile : float
        Quantile of TTFT and TPOT that must meet the SLO targets.
    overrides : list of str, optional
        ``section.key=value`` overrides of the scenario.
    disagg : bool
        Also search prefill + decode pool layouts (:mod:`simulator.planner.disagg`), in
        the same ranking; the best few of each group are simulated.
    cross : CrossPairs, optional
        With ``disagg``, also the pairs whose decode pool is on another node kind
        (:mod:`simulator.planner.hetero`; ``plan --disagg --nodes``).
    only : {None, "disaggregated"}
        With ``disagg``, ``"disaggregated"`` keeps only the prefill + decode pool layouts
        (``plan --disagg-only``); the others are listed as excluded.
    progress : bool
        A progress line on stderr when it is a terminal (:mod:`simulator.planner.simulate`).
    backend, address : str
        Where the simulations run: ``local`` (``jobs`` processes) or ``ray`` (the cluster
        at ``address``, or a local one), as for sweeps; the results do not depend on it.
        Ctrl-C stops them: the plan returns what finished, ``interrupted`` set.

    Raises
    ------
    ScenarioError
        Bad arguments, or no layout fits (saying by how much the closest one misses).
    """
    t0 = time.perf_counter()
    if objective not in OBJECTIVES:
        raise ScenarioError(f"--objective: {objective!r} is not an objective "
                            f"(allowed: {', '.join(OBJECTIVES)})")
    if top < 1:
        raise ScenarioError(f"--top: must be >= 1, got {top}")
    if not 0 < slo_quantile <= 1:
        raise ScenarioError(f"--slo-quantile: must be in (0, 1], got {slo_quantile}")
    base = without_pools(base_scenario(scenario, overrides, requests, DEFAULT_REQUESTS))
    own_requests = load_scenario(scenario, overrides=overrides).workload.num_requests
    s = load_scenario(base)
    node = load_node(s.cluster.topology, s.base_dir)
    model = load_model(s.model.name, s.base_dir)
    total = s.cluster.nodes * node.gpus_per_node
    if gpus is not None and not 1 <= gpus <= total:
        raise ScenarioError(f"--gpus: {gpus} is not between 1 and the cluster's {total} GPUs "
                            f"({s.cluster.nodes} x {node.name})")
    cap = gpus or total
    reqs = workload_requests(s)
    stats = workload_stats(s, reqs)
    bar = Progress(objective, progress)
    try:
        cands = enumerate_candidates(base, s, cap, stats, objective, jobs, disagg, cross)
        if only is not None:
            if only != "disaggregated" or not disagg:
                raise ScenarioError(f"plan: only={only!r} needs disagg=True (allowed: "
                                    f"'disaggregated')")
            out = (cands["kind"] != "disaggregated") & (cands["status"] == "feasible")
            cands.loc[out, "status"] = "excluded"
            cands.loc[out, "reason"] = "--disagg-only: colocated layouts not searched"
        feasible = cands[cands["status"] == "feasible"]
        if feasible.empty:
            raise NoAnswer(no_fit(cands, model.name, s.model.weight_dtype, cap))
        bar.estimated(len(cands), len(feasible))
        return _search(base, s, node, model, total, cap, stats, cands, objective, top,
                       jobs, slo_quantile, disagg, cross, bar, backend, address, t0,
                       own_requests)
    finally:
        bar.close()


def _search(base, s, node, model, total, cap, stats, cands, objective, top, jobs,
            slo_quantile, disagg, cross, bar, backend, address, t0,
            own_requests) -> PlanResult:
    """The rounds of simulation and the ranking of :func:`plan` (its arguments)."""

    e = s.engine
    own = Limits(e.max_num_seqs, e.max_num_batched_tokens,
                 sarathi_chunk(e)
                 if e.scheduler == "sarathi" else None)
    try:
        domain = ("NVLink" if node.scale_up.link.startswith("NVLink") else
                  "xGMI" if node.scale_up.kind == "xgmi_mesh" else "PCIe")
        rule, rule_why = rule_of_thumb(s, model, node.gpu.memory_bytes, node.gpus_per_node,
                                       cap, stats, domain)
    except ScenarioError as exc:
        rule, rule_why = None, exc.problems[0]
    typed = candidates_of(cands)
    rule_idx = None if rule is None else next(
        (i for i, c in typed.items() if isinstance(c, Colocated) and c.spec_k == 0
         and (c.layout.tp, c.layout.pp, c.layout.dp) == (rule.tp, rule.pp, rule.dp)
         and c.limits.max_num_seqs == own.max_num_seqs
         and c.limits.max_num_batched_tokens == own.max_num_batched_tokens
         and (own.chunk_size is None or c.limits.chunk_size == own.chunk_size)), None)
    if rule_idx is not None and cands.loc[rule_idx, "status"] != "feasible":
        rule_why += f" (but it is out: {cands.loc[rule_idx, 'reason']})"
        rule_idx = None

    def job(i: int) -> dict:
        c = typed[i]
        point = resolve_point(base, point_overrides(c.layout, c.limits, model.moe is not None),
                              s.seed)
        if "speculative" in point:  # the searched k, or none
            point = (without_spec(point) if c.spec_k == 0 else resolve_point(
                point, {"speculative.num_speculative_tokens": c.spec_k}, s.seed))
        if isinstance(c, Disaggregated):  # cross-kind: pools on two node kinds (hetero)
            point["pools"] = (cross_pools(c.row(), s) if c.decode_node
                              else pools_of(c.row(), s.cluster.nodes, s))
        if objective == "tokens_per_joule":  # energy needs the step records
            point["output"] = {**point.get("output", {}), "steps": True}
        return point

    # Rounds (simulator.planner.search): per group (colocated, colocated+spec,
    # disaggregated) the next by the estimate, at most PER_LAYOUT per layout, `top` in
    # all, MAX_ROUNDS while none but the rule of thumb meets the SLOs, then CHASE_ROUNDS
    # for the candidates the estimate rates ahead of the best that met.
    feasible = cands.index[cands["status"] == "feasible"]
    how = Rounds(per_group(top, typed, feasible), PER_LAYOUT, MAX_ROUNDS, CHASE_ROUNDS,
                 rule_idx)
    kinds = group_series(typed)

    def rank(m: dict) -> pd.DataFrame:
        return rerank(cands, s, stats, objective, m, cross, kinds)

    found = simulate_best(cands, typed, rank, job, objective, s.slo, how, slo_quantile, jobs,
                          bar, backend, address)
    picked, sims, m, interrupted = found.picked, found.sims, found.margins, found.interrupted
    cands.loc[picked, "simulated"] = True
    ranked = rank(m)
    cands["est_slo"], cands["est_objective"] = ranked["est_slo"], ranked["est_objective"]

    if not picked:
        raise KeyboardInterrupt  # stopped before any simulation finished: nothing known
    def tabulate():
        return plan_table(cands, picked, sims, rule_idx, s, slo_quantile, objective,
                      with_columns(PLAN_COLUMNS, model, disagg, cross is not None), total)

    table, rule_row, wall = tabulate()
    # Answers within their noise: a pick whose interval reaches past a target, or whose
    # objective overlaps the runner-up's, is simulated again on a larger sample
    # (simulator.planner.nearmiss), up to MAX_DOUBLINGS times; what is still within noise
    # then is said, not hidden.
    column = "goodput_req_per_s_per_gpu" if objective == "goodput_per_gpu" else None
    sample = stats.requests
    noise, again = flags(table, s.slo.ttft_s, s.slo.tpot_s, slo_quantile, column)
    for _ in range(MAX_DOUBLINGS):
        if not again or interrupted or sample * 2 > MAX_REQUESTS:
            break
        sample *= 2
        todo = {int(table.loc[j, "_cand"]): resolve_point(
            job(int(table.loc[j, "_cand"])), {"workload.num_requests": sample}, s.seed)
            for j in again}
        interrupted = simulate(todo, sims, s.slo, slo_quantile, jobs, bar, backend, address)
        table, rule_row, wall = tabulate()
        noise, again = flags(table, s.slo.ttft_s, s.slo.tpot_s, slo_quantile, column)
    if sample > stats.requests:  # more were simulated: say what they settled
        met = table[table["slo_met"]]
        n = int(met["requests_total"].iloc[0]) if not met.empty else sample
        noise.append(f"still within noise after {n} requests for the pick: the "
                     f"simulation cannot tell (raise --requests)" if again else
                     f"the pick was within noise at {stats.requests} requests; clear "
                     f"after {n}")
    table = table.drop(columns=["_rule", "_cand"])
    slo = s.slo

    met = table[table["slo_met"]]
    best = met.iloc[0] if not met.empty else None
    error = None if best is not None else no_slo(table, slo, slo_quantile, stats)
    why = (reason(best, table, cands, objective, slo, slo_quantile, stats, total)
           if best is not None else "")
    comparison = compare(best, rule_row.iloc[0] if not rule_row.empty else None, rule,
                          objective, slo, slo_quantile)
    if best is not None and table.apply(group_of, axis=1).nunique() > 1:
        comparison += "; " + versus_groups(best, table, objective)
    columns = with_columns(PLAN_COLUMNS, model, disagg, cross is not None)
    return PlanResult(s, objective, slo_quantile, cap, total, stats,
                      cands.reset_index(drop=True), table[columns].copy(), rule,
                      rule_why, best, why, comparison, error, time.perf_counter() - t0,
                      wall, rank_correlation(table, objective),
                      rank_correlations=group_correlations(table, objective), margins=m,
                      interrupted=interrupted, own_requests=own_requests, noise=noise)

