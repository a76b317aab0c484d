"""Ranking the estimated candidates, with the estimate's own error: candidates whose
estimate misses an SLO by less than the estimate's measured error "may meet" it and rank
with the ones that meet it, so that the simulation, not the estimate, turns them down.

The margin of a target (TTFT p99, TPOT) is the ``MARGIN_QUANTILE`` quantile of the ratio
estimate / simulation over the simulated points of the plan so far (the estimate's
pessimism: a ratio of 1.1 means the estimate was 10% over what the simulation measured),
once at least ``MIN_POINTS`` points measure it; before that, the prior ``PRIOR_MARGIN``,
measured the same way over the points simulated for docs/planner.md (see "Near misses"
there). A candidate may meet the SLOs when its estimated utilization is below 1 and each
estimated figure is at most ``target x ratio``.

The groups a plan simulates separately (:func:`group_of`): colocated without speculation,
colocated with it, disaggregated; the rank correlation is reported per group too.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from simulator.io.schema import SloKeys
from simulator.planner.explain import sig
from simulator.planner.objectives import est_value, spearman
from simulator.planner.space import cross_kind

#: Quantile of the estimate / simulation ratios that sets the margin.
MARGIN_QUANTILE = 0.9
#: Simulated points needed before the plan's own ratios replace the prior.
MIN_POINTS = 4
#: Prior ratios (estimate / simulation) before the plan has simulated MIN_POINTS points:
#: the 90th percentiles over the 63 simulated points of docs/planner.md's examples
#: (engine profile vllm-v1; "Near misses" there gives the distribution).
PRIOR_MARGIN = {"ttft": 4.4, "tpot": 1.3}
#: Columns compared: (estimate, simulated quantile) per target.
PAIRS = {"ttft": ("est_ttft_p99_s", "ttft_slo_q_s"), "tpot": ("est_tpot_s", "tpot_slo_q_s")}


def ratios(table: pd.DataFrame, target: str) -> np.ndarray:
    """Estimate / simulation of ``target`` (``"ttft"`` or ``"tpot"``) over the simulated
    rows where both are finite and positive."""
    if table is None or table.empty or "status" not in table:
        return np.array([])
    est, sim = PAIRS[target]
    ok = table[table["status"] == "ok"]
    a, b = ok[est].to_numpy(float), ok[sim].to_numpy(float)
    keep = np.isfinite(a) & np.isfinite(b) & (a > 0) & (b > 0)
    return a[keep] / b[keep]


def margins(table: pd.DataFrame | None) -> dict[str, float]:
    """The ratio per target: the ``MARGIN_QUANTILE`` quantile of :func:`ratios`, at least 1
    (an optimistic estimate needs no margin), or the prior with too few points."""
    out = {}
    for target, prior in PRIOR_MARGIN.items():
        r = ratios(table, target)
        out[target] = (max(1.0, float(np.quantile(r, MARGIN_QUANTILE)))
                       if len(r) >= MIN_POINTS else prior)
    return out


def est_slo(cands: pd.DataFrame, slo: SloKeys, m: dict[str, float]) -> pd.Series:
    """Per candidate: ``meets`` (the estimate meets both SLOs), ``may meet`` (it misses by
    less than the margins, utilization < 1), ``misses``, or ``""`` when excluded."""
    feasible = cands["status"] == "feasible"
    meets = feasible & (cands["est_goodput_req_per_s"] > 0)
    util = cands["est_utilization"].astype(float)
    near = (feasible & ~meets & (util < 1)
            & (cands["est_ttft_p99_s"].astype(float) <= slo.ttft_s * m["ttft"])
            & (cands["est_tpot_s"].astype(float) <= slo.tpot_s * m["tpot"]))
    out = pd.Series("misses", index=cands.index)
    out[meets] = "meets"
    out[near] = "may meet"
    out[~feasible] = ""
    return out


def objective_values(cands: pd.DataFrame, objective: str, price: float, node,
                     output_mean: float, rate: float | None) -> list[float]:
    """The estimate's objective per candidate (``est_objective``); a candidate that may
    meet the SLOs is valued as if it met them (it would serve min(offered, capacity))."""
    out = []
    for _, r in cands.iterrows():
        if r["status"] != "feasible":
            out.append(math.nan)
            continue
        if objective in ("min_ttft", "min_tpot"):
            out.append(r["est_ttft_p99_s"] if objective == "min_ttft" else r["est_tpot_s"])
            continue
        if r["est_slo"] == "may meet":
            r = r.copy()
            cap = r["est_capacity_req_per_s"]
            r["est_goodput_req_per_s"] = min(rate, cap) if rate is not None else cap
        out.append(est_value(r, objective, price, node, output_mean))
    return out


def order(cands: pd.DataFrame, objective: str, stable) -> list:
    """Index of the candidates in ranking order: those that meet or may meet the SLOs by
    the estimate first, by the objective (3 significant digits; at equal value the ones
    that meet before the ones that may), then the rest by the objective, then the
    excluded; ties by ``stable(row)``."""
    def key(i) -> tuple:
        r = cands.loc[i]
        if r["status"] != "feasible":
            return (2, 0.0, 0, stable(r))
        obj = r["est_objective"] if objective in ("min_ttft", "min_tpot") \
            else -r["est_objective"]
        return (0 if r["est_slo"] in ("meets", "may meet") else 1, sig(obj),
                0 if r["est_slo"] == "meets" else 1, stable(r))
    return sorted(cands.index, key=key)


def group_of(row) -> str:
    """The simulation group of a candidate: ``colocated``, ``colocated+spec``,
    ``disaggregated``, ``disaggregated+cross`` (pools on two node kinds) or
    ``colocated+mix`` (replicas on two node kinds behind one router)."""
    kind = row.get("kind")
    kind = kind if isinstance(kind, str) else "colocated"
    kind += "+cross" if cross_kind(row) else ""  # pools on two node kinds (hetero.py)
    kind += "+mix" if isinstance(row.get("mix_node"), str) else ""  # DP on two (mixdp.py)
    k = row.get("spec_k")
    return kind + ("+spec" if k is not None and k == k and int(k) > 0 else "")


def correlations(table: pd.DataFrame, est: str, sim: str) -> dict[str, float]:
    """Spearman's rho of ``est`` against ``sim`` per group over the simulated rows."""
    ok = table[table["status"] == "ok"]
    groups = ok.apply(group_of, axis=1) if len(ok) else pd.Series(dtype=str)
    return {g: spearman(ok.loc[groups == g, est], ok.loc[groups == g, sim])
            for g in sorted(set(groups))}
