"""Colocated against disaggregated serving for one GPU budget (``plan --disagg``).

Enumerates, on the scenario's nodes (``[cluster] topology`` and ``nodes``): colocated
layouts (one mixed pool, TP x DP, pp = 1) and disaggregated ones (xPyD: x whole nodes of
prefill and the rest decode, or, on one node, a split of its GPUs), each pool with every TP
degree that divides its GPUs and the heads, DP filling the pool. Candidates the model does
not fit are listed with the build's reason; the others are simulated
(:func:`simulator.planner.simulate.simulate`: SLO quantiles, steady-state goodput) and the
best of each kind is reported side by side, with why the winner wins.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pandas as pd

from simulator.cluster.build import cluster_node
from simulator.cluster.pools import build_pools
from simulator.errors import ScenarioError
from simulator.io.scenario import load_scenario
from simulator.io.schema import Scenario
from simulator.model.spec import load_model
from simulator.planner.simulate import base_scenario, simulate
from simulator.planner.space import legal_tps

COLUMNS = ["kind", "config", "gpus", "status", "reason", "goodput_req_per_s",
           "goodput_req_per_s_per_gpu", "slo_attainment", "ttft_slo_q_s", "tpot_slo_q_s",
           "ttft_p99_s", "tpot_p99_s", "throughput_tok_per_s", "slo_met"]


@dataclass
class PoolPlanResult:
    """What :func:`plan_pools` found: every candidate, the best of each kind (None when
    none meets the SLOs) and the sentence saying which wins and why."""

    scenario: Scenario
    table: pd.DataFrame
    best_colocated: pd.Series | None
    best_disaggregated: pd.Series | None
    reason: str


def _pool(name: str, role: str, tp: int, gpus: int, nodes: int | None = None,
          share: str | None = None) -> dict:
    p = {"name": name, "role": role, "tp": tp, "dp": gpus // tp}
    if share is not None:
        p["same_nodes_as"] = share
    else:
        p["nodes"] = nodes
    return p


def candidates(s: Scenario) -> list[tuple[str, str, list[dict]]]:
    """``(kind, label, pools)`` of every layout considered, in a stable order."""
    model = load_model(s.model.name, s.base_dir)
    per = cluster_node(s).gpus_per_node
    n = s.cluster.nodes
    tps = [t for t in legal_tps(model, per) if per % t == 0]
    out = []
    for tp in tps:
        out.append(("colocated", f"TP{tp} x DP{n * per // tp}",
                    [_pool("mixed", "mixed", tp, n * per, nodes=n)]))
    if n >= 2:
        splits = [(x, x * per, (n - x) * per) for x in range(1, n)]
    else:
        splits = [(0, g, per - g) for g in tps if g < per]
    for x, gp, gd in splits:
        for tp_p in [t for t in tps if gp % t == 0]:
            for tp_d in [t for t in tps if gd % t == 0]:
                if x:
                    pools = [_pool("prefill", "prefill", tp_p, gp, nodes=x),
                             _pool("decode", "decode", tp_d, gd, nodes=n - x)]
                    label = f"{x}P{n - x}D nodes"
                else:
                    pools = [_pool("prefill", "prefill", tp_p, gp, nodes=1),
                             _pool("decode", "decode", tp_d, gd, share="prefill")]
                    label = f"{gp}+{gd} GPUs"
                label += (f": prefill TP{tp_p} x DP{gp // tp_p}, "
                          f"decode TP{tp_d} x DP{gd // tp_d}")
                out.append(("disaggregated", label, pools))
    return out


def without_pools(base: dict) -> dict:
    """A scenario dict without its ``[[pools]]``: the search's budget is the nodes of its
    pools (those not sharing another's) as ``[cluster]`` topology and nodes.

    Raises
    ------
    ScenarioError
        The pools use several node presets (the search takes one).
    """
    pools = base.pop("pools", None)
    if pools:
        tops = {p.get("topology", base["cluster"]["topology"]) for p in pools}
        if len(tops) > 1:
            raise ScenarioError(f"plan: the pools use several node presets "
                                f"({', '.join(sorted(tops))}); the search takes one "
                                f"(set [cluster] topology and nodes, without pools)")
        base["cluster"] = {**base["cluster"], "topology": tops.pop(),
                           "nodes": sum(p.get("nodes", 1) for p in pools
                                        if "same_nodes_as" not in p)}
    return base


def plan_pools(scenario: str | dict | Scenario, *, requests: int | None = 300,
               slo_quantile: float = 0.99, overrides: list[str] | None = None
               ) -> PoolPlanResult:
    """Search colocated and disaggregated layouts on the scenario's nodes.

    Parameters
    ----------
    scenario : path, dict or Scenario
        ``[cluster]`` gives the nodes, or, when it has ``[[pools]]`` (of one node preset),
        the pools' nodes; their layouts and ``[parallel]`` are ignored.
    requests : int, optional
        Cap on requests simulated per candidate.
    slo_quantile : float
        A candidate meets the SLOs when TTFT and TPOT at this quantile do.
    """
    base = without_pools(base_scenario(scenario, overrides, requests))
    s = load_scenario(base)
    rows = []
    for kind, label, pools in candidates(s):
        data = copy.deepcopy(base)
        data["pools"] = pools
        row = {"kind": kind, "config": label,
               "gpus": sum(p["tp"] * p["dp"] for p in pools)}
        try:
            build_pools(load_scenario(data))
        except ScenarioError as exc:
            rows.append({**row, "status": "out", "reason": exc.problems[0]})
            continue
        sim = simulate(data, slo_quantile)
        if sim["status"] != "ok":
            rows.append({**row, "status": "error", "reason": sim["error"]})
            continue
        met = sim["ttft_q_s"] <= s.slo.ttft_s and sim["tpot_q_s"] <= s.slo.tpot_s
        rows.append({**row, "status": "ok", "reason": "",
                     **{k: sim[k] for k in ("goodput_req_per_s", "goodput_req_per_s_per_gpu",
                                            "slo_attainment", "ttft_p99_s", "tpot_p99_s",
                                            "throughput_tok_per_s")},
                     "ttft_slo_q_s": sim["ttft_q_s"], "tpot_slo_q_s": sim["tpot_q_s"],
                     "slo_met": met})
    table = pd.DataFrame(rows).reindex(columns=COLUMNS)
    table = table.sort_values(["kind", "goodput_req_per_s_per_gpu", "config"],
                              ascending=[True, False, True], kind="stable",
                              na_position="last", ignore_index=True)
    best = {}
    for kind in ("colocated", "disaggregated"):
        ok = table[(table["kind"] == kind) & (table["status"] == "ok")]
        met = ok[ok["slo_met"] == True]  # noqa: E712
        best[kind] = met.iloc[0] if len(met) else ok.iloc[0] if len(ok) else None
    text = why(best["colocated"], best["disaggregated"], s, slo_quantile)
    return PoolPlanResult(s, table, best["colocated"], best["disaggregated"], text)


def why(col: pd.Series | None, dis: pd.Series | None, s: Scenario, q: float) -> str:
    """Which kind wins and why: the one that meets the SLOs, else the one with more
    goodput per GPU under them, with the latencies that separate the two."""
    pct = f"p{q * 100:g}"
    slo = f"TTFT {pct} <= {s.slo.ttft_s:g} s and TPOT {pct} <= {s.slo.tpot_s * 1e3:g} ms"
    if col is None or dis is None:
        return "nothing to compare: " + ("no disaggregated" if dis is None
                                         else "no colocated") + " layout could be simulated"

    def lat(r: pd.Series) -> str:
        return (f"TTFT {pct} {r['ttft_slo_q_s']:.3g} s, TPOT {pct} "
                f"{r['tpot_slo_q_s'] * 1e3:.3g} ms")

    if bool(col["slo_met"]) != bool(dis["slo_met"]):
        a, b = (col, dis) if col["slo_met"] else (dis, col)
        return (f"{a['kind']} wins: {a['config']} meets {slo} ({lat(a)}) with "
                f"{a['goodput_req_per_s_per_gpu']:.3g} req/s per GPU; no {b['kind']} "
                f"layout does (its best, {b['config']}: {lat(b)})")
    prefix = "" if col["slo_met"] else f"no layout meets {slo}; by goodput per GPU, "
    a, b = (dis, col) if dis["goodput_req_per_s_per_gpu"] > col[
        "goodput_req_per_s_per_gpu"] else (col, dis)
    gain = a["goodput_req_per_s_per_gpu"] / max(b["goodput_req_per_s_per_gpu"], 1e-300) - 1
    if gain < 0.01:
        fast = min((col, dis), key=lambda r: r["tpot_slo_q_s"])
        return (f"{prefix}a tie: both serve {a['goodput_req_per_s_per_gpu']:.3g} req/s per "
                f"GPU within the SLOs (the offered load); {fast['kind']} has the lower TPOT "
                f"(colocated {lat(col)}; disaggregated {lat(dis)}); raise the rate to "
                f"separate them")
    return (f"{prefix}{a['kind']} wins: {a['config']} gives "
            f"{a['goodput_req_per_s_per_gpu']:.3g} req/s per GPU within the SLOs, "
            f"{gain:.0%} more than {b['config']} ({b['goodput_req_per_s_per_gpu']:.3g}); "
            f"{lat(a)} vs {lat(b)}")


def format_pools_plan(r: PoolPlanResult) -> str:
    """The best of each kind side by side, then the reason."""
    lines = [f"plan {r.scenario.name}: colocated vs disaggregated on "
             f"{r.scenario.cluster.nodes} x {r.scenario.cluster.topology}"]
    for kind, best in (("colocated", r.best_colocated),
                       ("disaggregated", r.best_disaggregated)):
        if best is None:
            lines.append(f"  best {kind:<14} none could be simulated")
        else:
            met = "" if best["slo_met"] else " (misses the SLOs)"
            lines.append(f"  best {kind:<14} {best['config']}{met}: "
                         f"{best['goodput_req_per_s_per_gpu']:.3g} req/s per GPU, TTFT q "
                         f"{best['ttft_slo_q_s']:.3g} s, TPOT q "
                         f"{best['tpot_slo_q_s'] * 1e3:.3g} ms")
    lines.append(f"  {r.reason}")
    return "\n".join(lines)
