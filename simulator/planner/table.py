"""plan.csv's table: the simulated candidates' rows (their candidate's layout, limits and
estimate beside the simulation's figures), ranked by the objective, with the notes and
what binds each one."""

from __future__ import annotations

import math

import pandas as pd

from simulator.planner.explain import binds, misses
from simulator.planner.ranking import PREFILL_COLUMNS, rank_key
from simulator.planner.space import layout_label

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

