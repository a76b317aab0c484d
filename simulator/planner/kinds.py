"""A plan over several node kinds (``plan --nodes dgx-h100,hgx-h200``): one search per kind
on as many of its nodes as the GPU budget needs, then one ranking of every simulated point
by the objective, the pick, and by how much it beats the best of every other kind and the
best rule-of-thumb layout.

Each kind's search is :func:`simulator.planner.plan.plan` (estimate every candidate,
simulate the best few and the kind's rule of thumb); the merged tables carry a ``node``
column. With ``disagg`` and two kinds or more, each kind's search also ranks the pairs
whose prefill pool is on its nodes and decode pool on another kind's
(:mod:`simulator.planner.hetero`); the merged tables then carry ``decode_node`` (every
disaggregated row: its decode pool's kind; ``node`` is its prefill pool's) and their
``pools`` label names both kinds. With two kinds or more, the replicas of one colocated
layout may also fill whole nodes of two kinds behind one router
(:mod:`simulator.planner.mixdp`): those rows carry ``mix_node`` and ``mix_dp``. Goodput
per GPU does not see prices: use ``goodput_per_usd`` to weigh a cheaper kind against a
faster one.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

import pandas as pd

from simulator.errors import NoAnswer, ScenarioError
from simulator.hardware.specs import load_node
from simulator.io.scenario import load_scenario
from simulator.io.schema import Scenario
from simulator.model.spec import load_model
from simulator.planner.hetero import CrossPairs
from simulator.planner.mixdp import MIX_COLUMNS, MixedDP
from simulator.planner.nearmiss import group_of
from simulator.planner.objectives import (
    compare,
    label,
    no_slo,
    reason,
    versus,
    versus_groups,
)
from simulator.planner.plan import DEFAULT_REQUESTS, DEFAULT_TOP, PlanResult, plan
from simulator.planner.ranking import RULE, group_correlations, rank_correlation, rank_key
from simulator.planner.simulate import base_scenario, own_pools
from simulator.planner.space import cross_kind, layout_label


def plan_kinds(scenario, nodes: list[str], *, gpus: int | None = None,
               objective: str = "goodput_per_gpu", overrides: list[str] | None = None,
               disagg: bool = False, **kwargs) -> PlanResult:
    """Search every node kind in ``nodes`` with at most ``gpus`` GPUs (default: the
    scenario's, :func:`budget`) and merge the results (parameters of
    :func:`~simulator.planner.plan.plan` pass through ``kwargs``). With ``disagg``, each
    kind's search also ranks prefill + decode pool layouts on its nodes
    (:mod:`simulator.planner.disagg`) and, with several kinds, those with the decode pool
    on another kind's nodes (:mod:`simulator.planner.hetero`). A scenario's ``[[pools]]``
    (of any presets) only size the default budget: ``nodes`` gives the kinds.

    Raises
    ------
    ScenarioError
        A kind is not a node preset or file, or no kind fits the model.
    """
    s = load_scenario(scenario, overrides=overrides)
    if not nodes:
        raise ScenarioError("--nodes: give at least one node preset (e.g. dgx-h100,hgx-h200)")
    if gpus is None:
        gpus = budget(s)
    if s.pools:  # the search lays out its own pools on the kinds of `nodes`
        scenario, overrides = replace(s, pools=()), None
    results, errors, unanswered = {}, [], 0
    kinds = list(dict.fromkeys(nodes))
    cross = CrossPairs(kinds) if disagg and len(kinds) > 1 else None
    for kind in kinds:
        node = load_node(kind, s.base_dir, key="--nodes")
        count = math.ceil(gpus / node.gpus_per_node)
        extra = [f"cluster.topology={kind}", f"cluster.nodes={count}"]
        try:
            results[kind] = plan(scenario, gpus=min(gpus, count * node.gpus_per_node),
                                 objective=objective, overrides=[*(overrides or []), *extra],
                                 disagg=disagg, cross=cross, **kwargs)
            if results[kind].interrupted:  # Ctrl-C: the kinds planned so far
                break
        except ScenarioError as exc:
            errors.append(f"{kind}: {exc.problems[0]}")
            unanswered += isinstance(exc, NoAnswer)
    if not results:  # exit 3 when every kind is a question without answer, else 2
        raise (NoAnswer if unanswered == len(errors) else ScenarioError)(
            "--nodes: no node kind fits: " + "; ".join(errors))
    mixed = None
    # replicas on two kinds behind one router (simulator.planner.mixdp)
    if len(kinds) > 1 and not any(r.interrupted for r in results.values()):
        t0, first = time.perf_counter(), next(iter(results.values()))
        # `scenario` has no [[pools]] here (replaced by () above), so its dict has none
        base = base_scenario(scenario, overrides, kwargs.get("requests"),
                             DEFAULT_REQUESTS)
        found = MixedDP(base, kinds).search(
            load_model(s.model.name, s.base_dir), gpus, first.stats, objective,
            kwargs.get("top", DEFAULT_TOP), kwargs.get("jobs"), first.quantile)
        mixed = (*found, time.perf_counter() - t0) if found is not None else None
    return merge(results, objective, errors, mixed)


def budget(s: Scenario) -> int:
    """GPUs of the scenario's nodes: ``[cluster]`` nodes, or with ``[[pools]]`` the nodes
    of the pools that bring their own (each of its preset)."""
    if not s.pools:
        return s.cluster.nodes * load_node(s.cluster.topology, s.base_dir).gpus_per_node
    return sum(p.nodes * load_node(p.topology or s.cluster.topology, s.base_dir).gpus_per_node
               for p in own_pools(s.pools))


def _tag(df: pd.DataFrame, kind: str) -> pd.DataFrame:
    """``df`` with a leading ``node`` column; with ``decode_node`` (cross-kind pairs
    searched), that of every same-kind disaggregated row is ``kind`` too, and the
    cross-kind rows' ``pools`` name both kinds."""
    df = df.assign(node=kind)[["node", *df.columns]]
    if "decode_node" in df:
        same = (df["kind"] == "disaggregated") & df["decode_node"].isna()
        df["decode_node"] = df["decode_node"].astype(object).where(~same, kind)
        if "pools" in df:
            df["pools"] = [layout_label(r) if cross_kind(r) else r["pools"]
                           for _, r in df.iterrows()]
    return df


def merge(results: dict[str, PlanResult], objective: str, errors: list[str],
          mixed: tuple | None = None) -> PlanResult:
    """One PlanResult from per-kind ones: tables concatenated (``node`` column), ranked
    again by the objective; the pick's kind gives the scenario (recommended.toml).
    ``mixed``: the candidates, simulated rows and seconds of the mixed-kind search
    (:meth:`simulator.planner.mixdp.MixedDP.search`), whose rows join both tables."""
    first = next(iter(results.values()))
    table = pd.concat([_tag(r.table, k) for k, r in results.items()], ignore_index=True)
    cands = pd.concat([_tag(r.candidates, k) for k, r in results.items()], ignore_index=True)
    wall = sim_s = 0.0
    if mixed is not None:
        m_cands, m_table, wall = mixed
        cands = pd.concat([cands, m_cands.reindex(columns=[*cands.columns, *MIX_COLUMNS])],
                          ignore_index=True).astype({"mix_dp": "Int64"})
        if not m_table.empty:
            sim_s = float(m_table["wall_time_s"].sum())
            table = pd.concat([table, m_table.reindex(columns=[*table.columns,
                                                               *MIX_COLUMNS])],
                              ignore_index=True).astype({"mix_dp": "Int64"})
    order = sorted(range(len(table)), key=lambda i: rank_key(objective)(table.iloc[i]))
    table = table.iloc[order].reset_index(drop=True)
    table["rank"] = range(1, len(table) + 1)
    met = table[table["slo_met"]]
    best = met.iloc[0] if not met.empty else None
    kind = best["node"] if best is not None else first.scenario.cluster.topology
    own = results.get(kind, first)
    slo, q = own.scenario.slo, own.quantile
    rules = table[table["note"].astype(str).str.contains(RULE)]
    rule_row = rules.iloc[0] if not rules.empty else None
    rule_kind = rule_row["node"] if rule_row is not None else kind
    why = (reason(best, table, cands, objective, slo, q, own.stats, own.cluster_gpus)
           if best is not None else "")
    comparison = compare(best, rule_row, results[rule_kind].rule, objective, slo, q)
    if best is not None:
        comparison += "; " + versus_kinds(best, table, objective)
        if table.apply(group_of, axis=1).nunique() > 1:  # disaggregated or speculative
            comparison += "; " + versus_groups(best, table, objective)
    if errors:
        comparison += "; out of the search: " + "; ".join(errors)
    error = None if best is not None else no_slo(table, slo, q, own.stats)
    return PlanResult(own.scenario, objective, q, own.gpus, own.cluster_gpus, own.stats,
                      cands, table, results[rule_kind].rule, results[rule_kind].rule_why,
                      best, why, comparison, error,
                      wall + sum(r.wall_time_s for r in results.values()),
                      sim_s + sum(r.simulated_s for r in results.values()),
                      rank_correlation(table, objective),
                      rank_correlations=group_correlations(table, objective),
                      margins=first.margins,
                      interrupted=any(r.interrupted for r in results.values()),
                      own_requests=first.own_requests)


def where(row) -> str:
    """The node kind of a row, ``prefill kind -> decode kind`` for a cross-kind pair,
    ``kind + kind`` for replicas on two kinds (simulator.planner.mixdp)."""
    dec, mix = cross_kind(row), row.get("mix_node")
    if isinstance(mix, str):
        return f"{row['node']} + {mix}"
    return f"{row['node']} -> {dec}" if dec else row["node"]


def versus_kinds(best: pd.Series, table: pd.DataFrame, objective: str) -> str:
    """By how much the pick beats the best SLO-meeting point of every other node kind
    (a cross-kind pair's kinds count as one: ``dgx-h100 -> hgx-h200``)."""
    parts = versus(best, table, table.apply(where, axis=1), where(best), objective,
                   lambda kind, other, gain, a, b, what:
                   f"{gain:+.0%} {what} over the best {kind} layout, {label(other)} "
                   f"({a:.3g} vs {b:.3g})")
    return "; ".join(parts) if parts else "one node kind searched"
