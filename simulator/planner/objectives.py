"""The planner's objectives and the words for a plan.

The objectives beyond goodput per GPU: goodput per dollar and tokens per joule, for the
estimate (ranking every candidate) and for the simulation (ranking the proven ones), and
the rank agreement between the two (Spearman's rho on the simulated points).

- ``goodput_per_gpu``: goodput (requests/s within the SLOs) per GPU used.
- ``goodput_per_usd``: goodput requests per US dollar, ``goodput x 3600 / (GPUs x
  gpu_hour_usd)`` (prices: :mod:`simulator.hardware.prices`, or ``[cluster] gpu_hour_usd``).
- ``tokens_per_joule``: output tokens per joule of the powered nodes
  (:mod:`simulator.metrics.power`). The simulation measures it (``1 /
  energy_per_output_token_j`` of the run); the estimate prices power at an activity equal to
  the estimated utilization (offered / capacity, at most 1): a proxy to rank, not a figure.

The words: which targets a candidate misses, why the pick is the pick and what binds it,
how it compares with the rule of thumb, and the errors when nothing fits or nothing meets
the SLOs. Pure functions of the plan's tables.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from simulator.hardware.prices import gpu_hour_usd
from simulator.hardware.specs import NodeSpec
from simulator.io.schema import SloKeys
from simulator.metrics.power import NODE_OVERHEAD_W
from simulator.planner.space import Layout, WorkloadStats, layout_label, speculating

#: Objective -> the simulated column it maximizes (higher is better).
SIM_COLUMN = {"goodput_per_gpu": "goodput_req_per_s_per_gpu",
              "goodput_per_usd": "goodput_req_per_usd",
              "tokens_per_joule": "tokens_per_joule"}


def est_power_w(node: NodeSpec, gpus: int, utilization: float) -> float:
    """Estimated power (W) of the nodes holding ``gpus`` GPUs at ``utilization`` (the
    activity of the used GPUs; unused GPUs of those nodes idle)."""
    g = node.gpu
    if g.tdp_w is None or g.idle_w is None:
        return math.nan
    nodes = math.ceil(gpus / node.gpus_per_node)
    a = min(max(utilization, 0.0), 1.0) if math.isfinite(utilization) else 1.0
    return (gpus * (g.idle_w + (g.tdp_w - g.idle_w) * a)
            + (nodes * node.gpus_per_node - gpus) * g.idle_w + nodes * NODE_OVERHEAD_W)


def two_kind_value(value: float, objective: str, node_a: NodeSpec, g_a: int,
                   node_b: NodeSpec, g_b: int, utilization: float,
                   price: float | None = None) -> float:
    """An estimated ``value`` of ``objective`` taken at a GPU-hour price of 1 and on
    ``node_a``'s power (:func:`est_value`), rescaled to ``g_a`` GPUs of ``node_a`` plus
    ``g_b`` of ``node_b``, each at its own price (``price``, the ``[cluster]
    gpu_hour_usd``, overrides both) and power.

    Notes
    -----
    The value is linear in ``1 / (GPUs x price)`` (goodput per dollar) and in ``1 /
    power`` (tokens per joule), so it is scaled by ``(g_a + g_b) / (g_a price_a + g_b
    price_b)`` and by ``P_a(g_a + g_b) / (P_a(g_a) + P_b(g_b))``, P the estimated power
    of a kind's nodes at ``utilization`` (:func:`est_power_w`); other objectives are
    returned as they are.
    """
    if objective == "goodput_per_usd":
        usd = (g_a * gpu_hour_usd(node_a.gpu.name, price)
               + g_b * gpu_hour_usd(node_b.gpu.name, price))
        return value * (g_a + g_b) / usd
    if objective == "tokens_per_joule":
        return value * est_power_w(node_a, g_a + g_b, utilization) / (
            est_power_w(node_a, g_a, utilization) + est_power_w(node_b, g_b, utilization))
    return value


def est_value(r, objective: str, price: float, node: NodeSpec, output_mean: float) -> float:
    """The estimate's value of ``objective`` for candidate row ``r`` (higher is better):
    goodput when the estimate meets the SLOs, else the capacity (ranks the misses)."""
    good = r["est_goodput_req_per_s"]
    rate = good if good > 0 else r["est_capacity_req_per_s"]
    if objective == "goodput_per_usd":
        return rate * 3600.0 / (r["gpus"] * price)
    if objective == "tokens_per_joule":
        return rate * output_mean / est_power_w(node, int(r["gpus"]), r["est_utilization"])
    return rate / r["gpus"]


def sim_values(row: dict, summary: dict) -> dict:
    """Cost and energy columns of a simulated row from its run's summary."""
    price = summary.get("gpu_hour_usd", math.nan)
    e_tok = summary.get("energy_per_output_token_j", math.nan)
    return {"gpu_hour_usd": price,
            "cost_per_million_output_tokens_usd": summary.get(
                "cost_per_million_output_tokens_usd", math.nan),
            "goodput_req_per_usd": row["goodput_req_per_s"] * 3600.0 / (row["gpus"] * price)
            if price and price > 0 else math.nan,
            "power_mean_w": summary.get("power_mean_w", math.nan),
            "energy_per_output_token_j": e_tok,
            "tokens_per_joule": 1.0 / e_tok if e_tok and e_tok > 0 else math.nan}


def spearman(est: pd.Series, sim: pd.Series) -> float:
    """Spearman's rank correlation of two columns over the rows where both are finite
    (average ranks for ties); NaN with fewer than 3 such rows or a constant column."""
    a, b = est.to_numpy(float), sim.to_numpy(float)
    keep = np.isfinite(a) & np.isfinite(b)
    if keep.sum() < 3:
        return math.nan
    ra = pd.Series(a[keep]).rank().to_numpy()
    rb = pd.Series(b[keep]).rank().to_numpy()
    if ra.std() == 0 or rb.std() == 0:
        return math.nan
    return float(np.corrcoef(ra, rb)[0, 1])


def sig(x: float, digits: int = 3) -> float:
    """x rounded to ``digits`` significant digits (ranking treats closer values as ties)."""
    if not math.isfinite(x) or x == 0:
        return x
    return round(x, digits - 1 - int(math.floor(math.log10(abs(x)))))


def misses(r: pd.Series, slo: SloKeys, q: float) -> list[str]:
    """Which targets a simulated row misses, as ``"TTFT p99 2.41 s > 2 s"``."""
    if r["status"] != "ok":
        return [f"failed: {r['error']}"]
    p = f"p{q * 100:g}"
    out = []
    if not r["ttft_slo_q_s"] <= slo.ttft_s:
        out.append(f"TTFT {p} {r['ttft_slo_q_s']:.3g} s > {slo.ttft_s:g} s")
    if not r["tpot_slo_q_s"] <= slo.tpot_s:
        out.append(f"TPOT {p} {r['tpot_slo_q_s']:.3g} s > {slo.tpot_s:g} s")
    if r["keep_up_ratio"] < r["keep_up_least"]:
        out.append(f"falls behind the offered load (generates {r['keep_up_ratio']:.0%} of "
                   f"the offered tokens in the steady window)")
    return out


def label(r: pd.Series) -> str:
    """``TP4 PP1 DP2 (max_num_seqs 64, budget 2048)``."""
    chunk = r.get("chunk_size")
    lim = (f"chunk {int(chunk)}" if chunk is not None and not pd.isna(chunk)
           else f"budget {int(r['max_num_batched_tokens'])}")
    return (f"{layout_label(r)} "
            f"(max_num_seqs {int(r['max_num_seqs'])}, {lim})")


def no_fit(cands: pd.DataFrame, model: str, dtype: str, cap: int) -> str:
    """The message when no layout is feasible: the closest miss and by how much."""
    short = []
    for _, r in cands.iterrows():
        m = re.search(r"short by ([0-9.]+) GiB", str(r["reason"]))
        if m:
            short.append((float(m.group(1)), -r["gpus"], r["reason"]))
    if short:
        gib, _, why = min(short)
        why = why.removeprefix("model.name: ")
        return (f"model.name: no layout of at most {cap} GPUs fits {model} ({dtype}); the "
                f"closest is short by {gib:g} GiB per GPU: {why}")
    r = cands.iloc[-1]
    return (f"model.name: no layout of at most {cap} GPUs serves {model} ({dtype}); e.g. "
            f"{layout_label(r)}: {r['reason']}")


def no_slo(table: pd.DataFrame, slo: SloKeys, q: float, stats: WorkloadStats) -> str:
    """The message when no simulated candidate meets the SLOs: which bound, best achieved."""
    ok = table[table["status"] == "ok"]
    p = f"p{q * 100:g}"
    if ok.empty:
        return ("slo: no candidate could be simulated: "
                + "; ".join(str(e) for e in table["error"].head(3)))
    bits = []
    i = ok["ttft_slo_q_s"].astype(float).idxmin()
    j = ok["tpot_slo_q_s"].astype(float).idxmin()
    if ok.loc[i, "ttft_slo_q_s"] > slo.ttft_s:
        bits.append(f"TTFT {p} <= {slo.ttft_s:g} s (slo.ttft_s): best "
                    f"{ok.loc[i, 'ttft_slo_q_s']:.3g} s, {label(ok.loc[i])}")
    if ok.loc[j, "tpot_slo_q_s"] > slo.tpot_s:
        bits.append(f"TPOT {p} <= {slo.tpot_s:g} s (slo.tpot_s): best "
                    f"{ok.loc[j, 'tpot_slo_q_s']:.3g} s, {label(ok.loc[j])}")
    margin = (ok["keep_up_ratio"] - ok["keep_up_least"]).astype(float)
    k = margin.idxmax() if margin.notna().any() else None
    if k is not None and ok.loc[k, "keep_up_ratio"] < ok.loc[k, "keep_up_least"]:
        bits.append(f"keeping up with the offered {stats.rate_per_s:.3g} req/s: best generates "
                    f"{ok.loc[k, 'keep_up_ratio']:.0%} of the offered tokens, "
                    f"{label(ok.loc[k])}")
    if not bits:
        bits.append("TTFT and TPOT together: each is met by some layout, never both with "
                    "the load kept up")
    return "slo: no simulated layout meets the SLOs; what binds: " + "; ".join(bits)


def reason(best: pd.Series, table: pd.DataFrame, cands: pd.DataFrame, objective: str,
           slo: SloKeys, q: float, stats: WorkloadStats, total: int) -> str:
    """Why the pick: its margins, and the constraint that stops a better-scoring one."""
    p = f"p{q * 100:g}"
    load = (f"{stats.rate_per_s:.3g} req/s offered" if stats.rate_per_s is not None
            else f"{stats.concurrency} closed-loop clients")
    n = int(best["gpus"])
    head = (f"{label(best)} on {n} GPU{'s' if n > 1 else ''}: TTFT {p} "
            f"{best['ttft_slo_q_s']:.3g} s of {slo.ttft_s:g} s, TPOT {p} "
            f"{best['tpot_slo_q_s']:.3g} s of {slo.tpot_s:g} s at {load}; goodput "
            f"{best['goodput_req_per_s_per_gpu']:.3g} req/s per GPU")
    if best["gpus"] < total:
        head += f" (uses {int(best['gpus'])} of the {total} GPUs)"
    raw = {"goodput_per_gpu": lambda r: -r["offered_req_per_s"] / r["gpus"],
           "goodput_per_usd": lambda r: -r["offered_req_per_s"] / (r["gpus"]
                                                                   * r["gpu_hour_usd"]),
           "tokens_per_joule": lambda r: -r["tokens_per_joule"],
           "min_ttft": lambda r: r["ttft_slo_q_s"], "min_tpot": lambda r: r["tpot_slo_q_s"]}
    f = raw[objective]
    better = [r for _, r in table.iterrows()
              if r["status"] == "ok" and not r["slo_met"] and sig(f(r)) < sig(f(best))]
    if better:
        r = better[0]
        binds = f"what binds: {label(r)} would score higher but fails: " + "; ".join(
            misses(r, slo, q))
    else:
        fewer = cands[(cands["gpus"] < best["gpus"]) & ~cands["simulated"]]
        est = fewer[fewer["status"] == "feasible"]
        out = fewer[fewer["status"] == "excluded"]
        if objective == "goodput_per_gpu" and not est.empty:
            r = est.sort_values("gpus", ascending=False, kind="stable").iloc[0]
            ttft = (f"TTFT p99 {r['est_ttft_p99_s']:.3g} s" if r["est_utilization"] < 1
                    else "utilization >= 1 (queues grow)")
            binds = (f"what binds: the SLOs by estimate; the largest smaller candidate, "
                     f"{label(r)}, is estimated at {ttft}, TPOT {r['est_tpot_s']:.3g} s, "
                     f"capacity {r['est_capacity_req_per_s']:.3g} req/s")
        elif objective == "goodput_per_gpu" and not out.empty:
            r = out.sort_values("gpus", kind="stable").iloc[-1]
            binds = (f"what binds: memory or legality; no smaller layout serves it, e.g. "
                     f"{layout_label(r)}: {r['reason']}")
        else:
            binds = ("what binds: nothing simulated scores higher (the estimate ranked "
                     "the other candidates lower)")
    return f"{head}\n  {binds}"


#: Objective -> (plan.csv column, words) of the objectives compared as a ratio.
GAIN = {"goodput_per_gpu": ("goodput_req_per_s_per_gpu", "goodput per GPU"),
        "goodput_per_usd": ("goodput_req_per_usd", "goodput per dollar"),
        "tokens_per_joule": ("tokens_per_joule", "tokens per joule")}


def binds(r: pd.Series, slo: SloKeys, q: float) -> str:
    """What binds one simulated row: the targets it misses, else the SLO it is closest to
    (its quantile over the target) and KV memory when it preempted."""
    miss = misses(r, slo, q)
    if miss:
        return "; ".join(miss)
    t, p = r["ttft_slo_q_s"] / slo.ttft_s, r["tpot_slo_q_s"] / slo.tpot_s
    out = (f"TTFT (p{q * 100:g} at {t:.0%} of its target)" if t >= p
           else f"TPOT (p{q * 100:g} at {p:.0%} of its target)")
    if r.get("preemptions_total", 0) and r["preemptions_total"] > 0:
        out += f"; KV memory ({int(r['preemptions_total'])} preemptions)"
    return out


def compare(best: pd.Series | None, rule_row: pd.Series | None, rule: Layout | None,
            objective: str, slo: SloKeys, q: float) -> str:
    """How far the pick beats the rule-of-thumb layout (or that the rule wins)."""
    if rule is None:
        return "rule of thumb: no layout (see above)"
    if rule_row is None:
        return f"rule of thumb {rule}: not simulated (out of the search)"
    if rule_row["status"] != "ok":
        return f"rule of thumb {label(rule_row)}: {rule_row['error']}"
    if not rule_row["slo_met"]:
        return (f"rule of thumb {label(rule_row)} misses the SLOs: "
                + "; ".join(misses(rule_row, slo, q)))
    if best is None:
        return f"rule of thumb {label(rule_row)}"
    if int(rule_row["rank"]) == int(best["rank"]):
        return f"the rule of thumb wins: {label(rule_row)} is the pick"
    if objective in GAIN:
        col, what = GAIN[objective]
        a, b = best[col], rule_row[col]
        gain = a / b - 1 if b > 0 else math.inf
    else:
        col = "ttft_slo_q_s" if objective == "min_ttft" else "tpot_slo_q_s"
        a, b = best[col], rule_row[col]
        what = ("TTFT" if objective == "min_ttft" else "TPOT") + f" p{q * 100:g}"
        gain = b / a - 1 if a > 0 else math.inf
    if gain <= 0:
        return (f"the rule of thumb {label(rule_row)} ties the pick on {what} "
                f"(ranked {int(rule_row['rank'])} on the tie-breakers)")
    return (f"the pick beats the rule of thumb {label(rule_row)} by {gain:.0%} on {what} "
            f"({a:.3g} vs {b:.3g})")


def _group(r: pd.Series) -> str:
    kind = r.get("kind") if isinstance(r.get("kind"), str) else "colocated"
    kind += " on two node kinds" if isinstance(r.get("mix_node"), str) else ""
    return kind + (" with speculation" if speculating(r) else "")


def versus(best: pd.Series, table: pd.DataFrame, groups: pd.Series, mine: str,
           objective: str, say) -> list[str]:
    """One sentence per group other than ``mine`` (``groups``: a label per row of
    ``table``, in sorted order): ``say(group, other, gain, a, b, what)`` about the group's
    best SLO-meeting point ``other`` (objective ``a`` of the pick against ``b``, ``gain`` =
    a / b - 1), or that none of its layouts meets the SLOs."""
    col, what = GAIN.get(objective, ("goodput_req_per_s_per_gpu", "goodput per GPU"))
    parts = []
    for g in sorted(set(groups)):
        if g == mine:
            continue
        met = table[(groups == g) & table["slo_met"]]
        if met.empty:
            parts.append(f"no {g} layout meets the SLOs")
            continue
        other = met.iloc[0]
        a, b = best[col], other[col]
        parts.append(say(g, other, a / b - 1 if b > 0 else math.inf, a, b, what))
    return parts


def versus_groups(best: pd.Series, table: pd.DataFrame, objective: str) -> str:
    """By how much the pick beats the best SLO-meeting point of every other group
    (colocated, colocated with speculation, disaggregated), on the objective."""
    mine = _group(best)

    def say(g, other, gain, a, b, what):
        tie = " (a tie on the objective; the pick wins on TPOT, TTFT)" if sig(a) == sig(
            b) else ""
        return (f"the pick ({mine}) {gain:+.0%} {what} over the best {g}, "
                f"{label(other)} ({a:.3g} vs {b:.3g}){tie}")

    return "; ".join(versus(best, table, table.apply(_group, axis=1), mine, objective, say))


#: The simulated column of each latency objective (lower is better).
LATENCY_OBJECTIVE = {"min_ttft": "ttft_slo_q_s", "min_tpot": "tpot_slo_q_s"}


def side_by_side(table: pd.DataFrame, objective: str) -> str:
    """The best SLO-meeting colocated and disaggregated points and by how much one beats
    the other on the objective: ``best colocated X (v), best disaggregated Y (w):
    disaggregated +Z%`` (Z = w / v - 1 for a higher-better objective, v / w - 1 for a
    latency). Empty when neither kind was simulated."""
    disagg = table["kind"] == "disaggregated"
    if disagg.all() or not disagg.any():
        return ""
    col = SIM_COLUMN.get(objective) or LATENCY_OBJECTIVE[objective]
    lower = objective in LATENCY_OBJECTIVE
    best = {}
    for name, rows in (("colocated", table[~disagg]), ("disaggregated", table[disagg])):
        met = rows[rows["slo_met"]]  # the table is ranked: the first that meets is best
        best[name] = met.iloc[0] if not met.empty else None
    parts = [f"best {name} {label(r)} ({r[col]:.3g} {col})" if r is not None
             else f"no {name} layout simulated meets the SLOs" for name, r in best.items()]
    a, b = best["colocated"], best["disaggregated"]
    if a is not None and b is not None and a[col] > 0 and b[col] > 0:
        gain = a[col] / b[col] - 1 if lower else b[col] / a[col] - 1
        win, by = ("disaggregated", gain) if gain >= 0 else (
            "colocated", (b[col] / a[col] - 1) if lower else a[col] / b[col] - 1)
        parts.append(f"{win} ahead by {by:.0%}")
    return "; ".join(parts)
