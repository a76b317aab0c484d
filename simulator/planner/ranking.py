"""How the plan orders candidates and simulated points: the stable tie-break key, the
per-layout key of the simulation rounds, the ranking of simulated rows by the objective,
and the estimate's rank agreement with the simulation (overall and per group).
"""

from __future__ import annotations

import math

import pandas as pd

from simulator.planner.explain import sig
from simulator.planner.nearmiss import correlations, group_of
from simulator.planner.objectives import SIM_COLUMN, spearman
from simulator.planner.space import Layout

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


def layout_key(row) -> tuple:
    return (Layout(int(row["tp"]), int(row["pp"]), int(row["dp"]), *_moe_of(row)),
            *_extra_of(row))

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


def group_correlations(table: pd.DataFrame, objective: str) -> dict[str, float]:
    """:func:`rank_correlation` per simulation group (simulator.planner.nearmiss)."""
    sim = {"min_ttft": "ttft_slo_q_s", "min_tpot": "tpot_slo_q_s", **SIM_COLUMN}[objective]
    return correlations(table, "est_objective", sim)


def rank_correlation(table: pd.DataFrame, objective: str) -> float:
    """Spearman's rho of the estimate's objective against the simulated one over the
    simulated rows (for min_ttft / min_tpot: the estimated p99 TTFT / TPOT against the
    simulated quantile)."""
    sim = {"min_ttft": "ttft_slo_q_s", "min_tpot": "tpot_slo_q_s", **SIM_COLUMN}[objective]
    ok = table[table["status"] == "ok"]
    return spearman(ok["est_objective"], ok[sim])
