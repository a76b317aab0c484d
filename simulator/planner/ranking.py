"""How the plan orders candidates and simulated points: the stable tie-break key, the
ranking of simulated rows by the objective, plan.csv's table (the simulated candidates'
rows, their candidate's layout, limits and estimate beside the simulation's figures, ranked,
with the notes and what binds each one), and the estimate's rank agreement with the
simulation (overall and per group): Spearman's rho of the two rankings, each by SLO tier
then objective, as the planner ranks candidates and simulated points.
"""

from __future__ import annotations

import math

import pandas as pd

from simulator.planner.nearmiss import TIER, correlations, group_of
from simulator.planner.objectives import SIM_COLUMN, binds, misses, sig, spearman
from simulator.planner.space import layout_label

#: Columns of a plan with disaggregated candidates (the prefill pool; the decode pool is
#: in tp, pp, dp, ep, attention_dp), after ``kind``.
PREFILL_COLUMNS = ["prefill_tp", "prefill_pp", "prefill_dp", "prefill_ep",
                   "prefill_attention_dp", "est_kv_transfer_s", "prefill_max_num_seqs",
                   "prefill_max_num_batched_tokens"]


def stable_key(row) -> tuple:
    chunk = row["chunk_size"]
    return (row["gpus"], row["tp"], row["pp"], row["dp"], row["max_num_seqs"],
            row["max_num_batched_tokens"], -1 if pd.isna(chunk) else chunk,
            *_moe_of(row), *_extra_of(row),
            -1 if pd.isna(row.get("prefill_max_num_batched_tokens")) else
            int(row["prefill_max_num_batched_tokens"]))


def _extra_of(row) -> tuple:
    """(group, prefill pool, spec k) of a row: the keys beyond a colocated layout."""
    pre = tuple(-1 if pd.isna(row.get(c)) else int(row[c]) for c in PREFILL_COLUMNS[:5])
    k = row.get("spec_k")
    return (group_of(row), pre, 0 if k is None or pd.isna(k) else int(k))


def _moe_of(row) -> tuple[int, bool]:
    """(ep, attention_dp) of a candidate row (dense models have no such columns)."""
    ep = row["ep"] if "ep" in row else 1
    adp = row["attention_dp"] if "attention_dp" in row else False
    return int(ep), bool(adp)


def rank_key(objective: str):
    def key(r) -> tuple:
        if r["status"] != "ok":
            return (2, 0.0, 0.0, 0.0, stable_key(r))
        if objective in SIM_COLUMN:
            return (0 if r["slo_met"] else 1, -sig(r[SIM_COLUMN[objective]]),
                    r["tpot_slo_q_s"], r["ttft_slo_q_s"], stable_key(r))
        primary = {"goodput_per_gpu": (-sig(r["goodput_req_per_s_per_gpu"]),
                                       r["tpot_slo_q_s"], r["ttft_slo_q_s"]),
                   "min_ttft": (sig(r["ttft_slo_q_s"]), -r["goodput_req_per_s_per_gpu"],
                                r["tpot_slo_q_s"]),
                   "min_tpot": (sig(r["tpot_slo_q_s"]), -r["goodput_req_per_s_per_gpu"],
                                r["ttft_slo_q_s"])}[objective]
        return (0 if r["slo_met"] else 1, *primary, stable_key(r))
    return key


def sim_frame(cands: pd.DataFrame, picked: list[int], sims: dict) -> pd.DataFrame:
    """The estimate and the simulated quantiles of the simulated candidates (for the
    near-miss ratios, per simulation group)."""
    return pd.DataFrame([{"status": sims[i]["status"], "group": group_of(cands.loc[i]),
                          "est_ttft_p99_s": cands.loc[i, "est_ttft_p99_s"],
                          "est_tpot_s": cands.loc[i, "est_tpot_s"],
                          "est_tpot_p99_s": cands.loc[i].get("est_tpot_p99_s", math.nan),
                          "ttft_slo_q_s": sims[i].get("ttft_q_s", math.nan),
                          "tpot_slo_q_s": sims[i].get("tpot_q_s", math.nan)}
                         for i in picked])


def agreement_ranks(table: pd.DataFrame, objective: str) -> pd.DataFrame:
    """Per simulated row (``status == "ok"``), its place in the estimate's ranking
    (``est``) and in the simulation's (``sim``), each as the planner ranks: SLO tier
    first, then the objective to 3 significant digits; equal keys share a place.

    Notes
    -----
    The estimate's key is the candidate order's (:func:`simulator.planner.nearmiss.order`):
    ``(TIER[est_slo], -sig(est_objective))`` (``meets`` and ``may meet`` first, then ``may
    miss``, then ``misses``); the simulation's is the plan's (:func:`rank_key`): ``(0 if
    slo_met else 1, -sig(objective))``. For ``min_ttft`` / ``min_tpot`` the objective is
    the estimated p99 TTFT / TPOT against the simulated quantile, lower first.
    """
    sim = {"min_ttft": "ttft_slo_q_s", "min_tpot": "tpot_slo_q_s", **SIM_COLUMN}[objective]
    sign = 1.0 if objective in ("min_ttft", "min_tpot") else -1.0
    ok = table[table["status"] == "ok"]

    def value(x) -> float:
        x = float(x)
        return sign * sig(x) if math.isfinite(x) else math.inf

    est = [(TIER.get(t, len(TIER)), value(v))
           for t, v in zip(ok["est_slo"], ok["est_objective"], strict=True)]
    got = [(0 if m else 1, value(v)) for m, v in zip(ok["slo_met"], ok[sim], strict=True)]
    return pd.DataFrame({"est": _places(est), "sim": _places(got)}, index=ok.index)


def _places(keys: list[tuple]) -> list[int]:
    """The place of each key among the distinct keys, in ascending order."""
    where = {k: i for i, k in enumerate(sorted(set(keys)))}
    return [where[k] for k in keys]


def group_correlations(table: pd.DataFrame, objective: str) -> dict[str, float]:
    """:func:`rank_correlation` per simulation group (simulator.planner.nearmiss)."""
    places = agreement_ranks(table, objective)
    ok = table.loc[places.index].assign(_est=places["est"], _sim=places["sim"])
    return correlations(ok.assign(status="ok"), "_est", "_sim")


def rank_correlation(table: pd.DataFrame, objective: str) -> float:
    """Spearman's rho of the estimate's ranking against the simulation's over the
    simulated rows, both ranked as the planner ranks (:func:`agreement_ranks`; ties take
    average ranks); NaN with fewer than 3 rows or a ranking that ties them all."""
    places = agreement_ranks(table, objective)
    return spearman(places["est"], places["sim"])


#: The note of the rule of thumb's row.
RULE = "rule of thumb"


def plan_table(cands, picked, sims, rule_idx, s, slo_quantile, objective, columns,
           total) -> tuple[pd.DataFrame, pd.DataFrame, float]:
    """plan.csv's rows of the simulated candidates, ranked (with ``_rule`` and
    ``_cand``, the candidate index), the rule of thumb's row, and the simulations' wall
    time."""
    rows, wall = [], 0.0
    for i in picked:
        c = cands.loc[i]
        sim = sims[i]
        row = {k: c[k] for k in ("tp", "pp", "dp", *(("ep", "attention_dp") if "ep" in c
                                                     else ()),
                                 "kind", "spec_k", "est_slo",
                                 *(x for x in ["decode_node", *PREFILL_COLUMNS] if x in c),
                                 "max_num_seqs", "max_num_batched_tokens",
                                 "chunk_size", "gpus", "est_capacity_req_per_s",
                                 "est_ttft_p99_s", "est_tpot_s", "kv_tokens_per_replica",
                                 "est_objective")}
        row.update({k: v for k, v in sim.items()
                    if k not in ("wall_time_s", "ttft_q_s", "tpot_q_s")})
        row["ttft_slo_q_s"] = sim.get("ttft_q_s", math.nan)
        row["tpot_slo_q_s"] = sim.get("tpot_q_s", math.nan)
        wall += sim.get("wall_time_s", 0.0)
        row["_rule"], row["_cand"] = i == rule_idx, i
        rows.append(row)
    table = pd.DataFrame(rows)
    table["pools"] = [layout_label(r) if r["kind"] == "disaggregated" else ""
                      for _, r in table.iterrows()]
    for c in [*columns, "status", "error"]:
        if c not in table:
            table[c] = math.nan
    slo = s.slo
    table["slo_met"] = [r["status"] == "ok" and not misses(r, slo, slo_quantile)
                        for _, r in table.iterrows()]
    order = sorted(range(len(table)), key=lambda i: rank_key(objective)(table.iloc[i]))
    table = table.iloc[order].reset_index(drop=True)
    table["rank"] = range(1, len(table) + 1)
    notes = []
    for _, r in table.iterrows():
        parts = []
        if r["_rule"]:
            parts.append(RULE)
        if r["gpus"] < total:
            parts.append(f"uses {int(r['gpus'])} of {total} GPUs")
        parts += misses(r, slo, slo_quantile)
        notes.append("; ".join(parts))
    table["note"] = notes
    table["binds"] = [binds(r, slo, slo_quantile) for _, r in table.iterrows()]
    return table, table[table["_rule"]], wall

