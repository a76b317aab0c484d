"""How far the plan trusts its figures: the estimate's error (near misses) and the
simulation's noise (intervals).

Ranking the estimated candidates, with the estimate's own error in both directions:
candidates whose estimate misses an SLO by less than the estimate's measured pessimism
"may meet" it and rank with the ones that meet it, so that the simulation, not the
estimate, turns them down; candidates whose estimate meets an SLO by less than its measured
optimism "may miss" it and rank after them, so that a round of simulations is not spent on
points the simulation has already shown the estimate flatters.

The error of a target (TTFT p99, TPOT) is the ratio estimate / simulation over the
simulated points of the plan so far (1.1: the estimate was 10% over what the simulation
measured). Its **margin** is the ``MARGIN_QUANTILE`` quantile of the ratios (at least 1),
its **optimism** the ``1 - MARGIN_QUANTILE`` quantile (at most 1), each measured per
simulation group (:func:`group_of`) once the group has ``MIN_POINTS`` simulated points, else
over all the simulated points once there are ``MIN_POINTS``, else the priors:
``PRIOR_MARGIN``, measured the same way over the points simulated for docs/planner.md (see
"Near misses" there), and ``PRIOR_OPTIMISM`` (1: an estimate is taken at its word until a
simulation shows it flatters). The simulation figure is then plausibly within ``[estimate
/ margin, estimate / optimism]``: a candidate **meets** the SLOs when the estimate meets
them even divided by the optimism, **may miss** when the estimate meets them but not so,
**may meet** when the estimate misses them but its utilization is below 1 and each
estimated figure is at most ``target x margin``, else it **misses**. The TPOT estimate is
the p99 one where a candidate has it (``est_tpot_p99_s``, disaggregated pairs), else the
mean step (``est_tpot_s``).

Once measured, the ratios also give each candidate the chance that its simulation meets
both SLOs (:func:`chance`: the share of the measured ratios at which the estimate's
figures meet the targets); the next round takes first the candidates with a chance above
1/2 (their estimate corrected by the median ratio meets the targets), so that it does not
go back to the shapes that just failed while the estimate still rates them.

The groups a plan simulates separately (:func:`group_of`): colocated without speculation,
colocated with it, disaggregated; the rank correlation is reported per group too.

How sure a simulated point is: confidence intervals by sectioning, and the rule that
flags a pick within noise of an SLO target or of the runner-up.

One simulation of n requests gives one draw of the p99 TTFT (and TPOT, and the SLO
attainment). Requests in a queue are correlated, so the binomial interval of an i.i.d.
sample is too narrow; sectioning (Asmussen and Glynn, *Stochastic Simulation*, 2007, ch.
IV.5; the batch-means idea applied to a quantile) splits the run, in arrival order, into
``B = SECTIONS`` contiguous sections, computes the statistic on each, and takes the spread
of those as the spread of the whole-run estimate:

    CI = estimate +- t(0.975, B - 1) * s_B / sqrt(B)

with ``s_B`` the standard deviation of the B section values. A section must hold enough
requests for its quantile to be more than its maximum: at least ``1 / (1 - q)`` (100 at
p99); with fewer, the interval is NaN (too short to say).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from simulator.io.schema import SloKeys
from simulator.planner.objectives import est_value, sig, spearman
from simulator.planner.space import cross_kind, speculating

#: Quantile of the estimate / simulation ratios that sets the margin.
MARGIN_QUANTILE = 0.9
#: Simulated points needed before the plan's own ratios replace the prior.
MIN_POINTS = 4
#: Prior ratios (estimate / simulation) before the plan has simulated MIN_POINTS points:
#: 90th percentiles over the simulated points of docs/planner.md's examples (engine profile
#: vllm-v1; "Near misses" there gives the distribution); a plan replaces them by its own
#: measurement once it has MIN_POINTS points.
PRIOR_MARGIN = {"ttft": 4.4, "tpot": 1.3}
#: Prior optimism (estimate / simulation, at most 1) before the plan has measured it: none,
#: so that a plan's first round is the estimate's own ranking.
PRIOR_OPTIMISM = {"ttft": 1.0, "tpot": 1.0}
#: Columns compared: (estimate, simulated quantile) per target; the TPOT estimate is
#: ``est_tpot_p99_s`` where the candidate has one (disaggregated pairs, whose SLO it
#: judges), else ``est_tpot_s`` (:func:`estimated`).
PAIRS = {"ttft": ("est_ttft_p99_s", "ttft_slo_q_s"), "tpot": ("est_tpot_s", "tpot_slo_q_s")}
#: The estimated p99 TPOT of a disaggregated pair (simulator.planner.estimate.batch_p99).
TPOT_P99 = "est_tpot_p99_s"


def estimated(table: pd.DataFrame, target: str) -> np.ndarray:
    """The estimate of ``target`` per row: ``PAIRS[target][0]``, for TPOT the p99
    estimate where the row has one."""
    est = table[PAIRS[target][0]].astype(float).to_numpy()
    if target == "tpot" and TPOT_P99 in table:
        p99 = table[TPOT_P99].astype(float).to_numpy()
        est = np.where(np.isfinite(p99), p99, est)
    return est


def ratios(table: pd.DataFrame, target: str, group: str | None = None) -> np.ndarray:
    """Estimate / simulation of ``target`` (``"ttft"`` or ``"tpot"``) over the simulated
    rows where both are finite and positive (those of ``group`` only, when given, from
    the table's ``group`` column)."""
    if table is None or table.empty or "status" not in table:
        return np.array([])
    sim = PAIRS[target][1]
    ok = table[table["status"] == "ok"]
    if group is not None:
        ok = ok[ok["group"] == group] if "group" in ok else ok.iloc[:0]
    a, b = estimated(ok, target), ok[sim].to_numpy(float)
    keep = np.isfinite(a) & np.isfinite(b) & (a > 0) & (b > 0)
    return a[keep] / b[keep]


def _bounds(r: np.ndarray) -> dict[str, float]:
    """Margin and optimism of one target's ratios ``r`` (at least MIN_POINTS of them)."""
    return {"margin": max(1.0, float(np.quantile(r, MARGIN_QUANTILE))),
            "optimism": min(1.0, float(np.quantile(r, 1 - MARGIN_QUANTILE)))}


def margins(table: pd.DataFrame | None) -> dict:
    """The estimate's measured error: per target the margin (``m["ttft"]``,
    ``m["tpot"]``: the ``MARGIN_QUANTILE`` quantile of :func:`ratios`, at least 1, as an
    optimistic estimate needs none), the optimism (``m["ttft_optimism"]``,
    ``m["tpot_optimism"]``: the ``1 - MARGIN_QUANTILE`` quantile, at most 1) and the
    ratios themselves (``m["ttft_ratios"]``, sorted), over all the simulated rows, or the
    priors (and no ratios) with fewer than MIN_POINTS; and ``m["groups"]``, the same per
    simulation group (the table's ``group`` column) that has MIN_POINTS rows of its own."""
    out, groups = {}, {}
    names = (sorted(set(table.loc[table["status"] == "ok", "group"]))
             if table is not None and "group" in table and "status" in table else [])
    for target, prior in PRIOR_MARGIN.items():
        r = ratios(table, target)
        b = (_bounds(r) if len(r) >= MIN_POINTS
             else {"margin": prior, "optimism": PRIOR_OPTIMISM[target]})
        out[target], out[f"{target}_optimism"] = b["margin"], b["optimism"]
        if len(r) >= MIN_POINTS:
            out[f"{target}_ratios"] = tuple(sorted(map(float, r)))
        for g in names:
            r = ratios(table, target, g)
            if len(r) >= MIN_POINTS:
                b = _bounds(r)
                groups.setdefault(g, {}).update({target: b["margin"],
                                                 f"{target}_optimism": b["optimism"],
                                                 f"{target}_ratios": tuple(sorted(map(float, r)))})
    out["groups"] = {g: {**out, **v} for g, v in groups.items()}
    return out


def groups_of(cands: pd.DataFrame) -> pd.Series:
    """:func:`group_of` per candidate (index kept)."""
    return pd.Series([group_of(r) for _, r in cands.iterrows()], index=cands.index,
                     dtype=object)


def _measured_groups(cands: pd.DataFrame, m: dict, groups: pd.Series | None
                     ) -> pd.Series | None:
    """``groups`` (:func:`groups_of`), computed when not given and ``m`` has per-group
    figures; None when it has none (every candidate takes the plan's)."""
    if not m.get("groups"):
        return None
    return groups if groups is not None else groups_of(cands)


def _of_group(cands: pd.DataFrame, m: dict, key: str, groups: pd.Series | None) -> list:
    """``m[key]`` per candidate: its group's (``m["groups"]``, the candidates' groups
    ``groups`` from :func:`_measured_groups`) where measured, else the plan's (None where
    neither has it)."""
    default = m.get(key)
    if groups is None:
        return [default] * len(cands)
    return [m["groups"].get(g, {}).get(key, default) for g in groups]


def _per_row(cands: pd.DataFrame, m: dict, key: str, groups: pd.Series | None
             ) -> np.ndarray:
    """:func:`_of_group` as floats (the margins and optimism)."""
    return np.array(_of_group(cands, m, key, groups), float)


def chance(cands: pd.DataFrame, slo: SloKeys, m: dict, groups: pd.Series | None = None
           ) -> np.ndarray | None:
    """Per candidate, the chance that the simulation meets both SLOs given the measured
    ratios (None before the plan has measured them, ``margins(None)``); above 1/2 the
    median-corrected estimate meets them, and :func:`order` takes those first.
    ``groups``: the candidates' :func:`groups_of`, when the caller has it.

    Notes
    -----
    The simulation's figure is ``estimate / r`` for a ratio ``r`` drawn from those
    measured (the candidate's group's, else the plan's), so a target ``t`` holds with the
    chance ``P(r >= estimate / t)``: the share of the measured ratios at least that. The
    two targets are taken as independent, ``p = p_ttft p_tpot``. At ``p >= 0.9`` on both
    the estimate ``meets`` them (``estimate <= t x optimism``), below 0.1 on one it
    ``misses`` (``estimate > t x margin``), up to the interpolation of the quantiles.
    """
    if "ttft_ratios" not in m or "tpot_ratios" not in m:
        return None
    p = np.ones(len(cands))
    groups = _measured_groups(cands, m, groups)
    for target, t in (("ttft", slo.ttft_s), ("tpot", slo.tpot_s)):
        need = estimated(cands, target) / t
        have = _of_group(cands, m, f"{target}_ratios", groups)
        p *= np.array([np.mean(np.asarray(r) >= x) if np.isfinite(x) else 0.0
                       for r, x in zip(have, need, strict=True)])
    return p


def est_slo(cands: pd.DataFrame, slo: SloKeys, m: dict, groups: pd.Series | None = None
            ) -> pd.Series:
    """Per candidate: ``meets`` (the estimate meets both SLOs, even divided by its
    optimism), ``may meet`` (it misses by less than the margins, utilization < 1), ``may
    miss`` (it meets or may meet, but meets a target by less than its optimism: the
    corrected estimate misses it), ``misses``, or ``""`` when excluded; at the margins and
    optimism of the candidate's group (:func:`margins`; ``groups``: the candidates'
    :func:`groups_of`, when the caller has it)."""
    groups = _measured_groups(cands, m, groups)
    feasible = cands["status"] == "feasible"
    meets = feasible & (cands["est_goodput_req_per_s"] > 0)
    util = cands["est_utilization"].astype(float)
    ttft = cands["est_ttft_p99_s"].astype(float).to_numpy()
    tpot = estimated(cands, "tpot")
    def per_row(key: str) -> np.ndarray:
        return _per_row(cands, m, key, groups)

    near = (feasible & ~meets & (util < 1)
            & (ttft <= slo.ttft_s * per_row("ttft"))
            & (tpot <= slo.tpot_s * per_row("tpot")))
    flattered = (meets | near) & (
        ((ttft > slo.ttft_s * per_row("ttft_optimism")) & (ttft <= slo.ttft_s))
        | ((tpot > slo.tpot_s * per_row("tpot_optimism")) & (tpot <= slo.tpot_s)))
    out = pd.Series("misses", index=cands.index)
    out[meets] = "meets"
    out[near] = "may meet"
    out[flattered] = "may miss"
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


#: Ranking tier of each est_slo: those that meet or may meet the SLOs, then those that may
#: miss them, then those that miss them, then the excluded.
TIER = {"meets": 0, "may meet": 0, "may miss": 1, "misses": 2}


def order(cands: pd.DataFrame, objective: str, stable) -> list:
    """Index of the candidates in ranking order: those that meet or may meet the SLOs by
    the estimate first, by the objective (3 significant digits; at equal value the ones
    that meet before the ones that may), then those that may miss them, then the rest, by
    the objective, then the excluded; ties by ``stable(row)``. Once the plan has measured
    the estimate's error (a column ``est_chance``, :func:`chance`), the candidates whose
    simulation is more likely to meet both SLOs than not (``est_chance > 1/2``) come
    first, each half in that order."""
    def key(i) -> tuple:
        r = cands.loc[i]
        if r["status"] != "feasible":
            return (3, 0.0, 0, stable(r))
        obj = r["est_objective"] if objective in ("min_ttft", "min_tpot") \
            else -r["est_objective"]
        tier = (TIER[r["est_slo"]], sig(obj), 0 if r["est_slo"] == "meets" else 1,
                stable(r))
        return (0 if r["est_chance"] > 0.5 else 1, *tier) if "est_chance" in r else tier
    return sorted(cands.index, key=key)


def group_of(row) -> str:
    """The simulation group of a candidate: ``colocated``, ``colocated+spec``,
    ``disaggregated``, ``disaggregated+cross`` (pools on two node kinds) or
    ``colocated+mix`` (replicas on two node kinds behind one router)."""
    kind = row.get("kind")
    kind = kind if isinstance(kind, str) else "colocated"
    kind += "+cross" if cross_kind(row) else ""  # pools on two node kinds (hetero.py)
    kind += "+mix" if isinstance(row.get("mix_node"), str) else ""  # DP on two (mixdp.py)
    return kind + ("+spec" if speculating(row) else "")


def correlations(table: pd.DataFrame, est: str, sim: str) -> dict[str, float]:
    """Spearman's rho of ``est`` against ``sim`` per group over the simulated rows."""
    ok = table[table["status"] == "ok"]
    groups = ok.apply(group_of, axis=1) if len(ok) else pd.Series(dtype=str)
    return {g: spearman(ok.loc[groups == g, est], ok.loc[groups == g, sim])
            for g in sorted(set(groups))}


#: Sections of a run (B); t(0.975, 4) = 2.776.
SECTIONS = 5
T_975 = {4: 2.776}
#: Doublings of the sample the plan spends on a pick within noise (500 -> 2000 requests).
MAX_DOUBLINGS = 2
#: Largest sample a noise round asks for.
MAX_REQUESTS = 8000


def section_ci(values: np.ndarray, statistic, least: int = 1) -> tuple[float, float]:
    """``(estimate - h, estimate + h)`` of ``statistic`` over ``values`` (in arrival
    order) by sectioning; NaN when a section has fewer than ``least`` values, inf when a
    section's statistic is infinite (requests that never finished)."""
    n = len(values)
    if n < SECTIONS * max(least, 2):
        return math.nan, math.nan
    full = statistic(values)
    parts = np.array([statistic(p) for p in np.array_split(values, SECTIONS)])
    if not np.isfinite(parts).all() or not math.isfinite(full):
        return (full if math.isfinite(full) else math.inf), math.inf
    h = T_975[SECTIONS - 1] * float(parts.std(ddof=1)) / math.sqrt(SECTIONS)
    return full - h, full + h


def quantile_ci(values: np.ndarray, q: float) -> tuple[float, float]:
    """95% interval of the q-quantile (method ``higher``, inf entries count as misses)."""
    least = math.ceil(1.0 / (1.0 - q)) if q < 1 else len(values) + 1

    def stat(v):
        return float(np.quantile(v, q, method="higher"))

    return section_ci(values, stat, least)


def attainment_half(meets: np.ndarray) -> float:
    """Half-width of the 95% interval of the fraction of requests meeting the SLOs."""
    lo, hi = section_ci(meets.astype(float), lambda v: float(v.mean()))
    return (hi - lo) / 2 if math.isfinite(hi) else math.nan


def flags(table: pd.DataFrame, ttft_s: float, tpot_s: float, q: float,
          column: str | None) -> tuple[list[str], list[int]]:
    """What is within noise about the pick (rank 1 that meets): its TTFT or TPOT interval
    reaching past its target, or its objective ``column`` overlapping the runner-up's
    (``a - b <= h_a + h_b > 0``, both met, ``<column>_ci_half`` their half-widths). Returns
    the sentences and the table positions a further round should simulate with more
    requests (the pick, and the runner-up when they overlap)."""
    met = table[table["slo_met"]]
    if met.empty:
        return [], []
    i = met.index[0]
    r, p = table.loc[i], f"p{q * 100:g}"
    says, again = [], []
    if "ttft_slo_q_hi_s" in r and r["ttft_slo_q_hi_s"] != r["ttft_slo_q_hi_s"]:
        least = SECTIONS * math.ceil(1.0 / (1.0 - q)) if q < 1 else math.inf
        says.append(f"no interval for the pick: {p} needs sections of "
                    f"{least // SECTIONS:g} requests ({least:g} in all; raise --requests)")
    for name, target in (("ttft", ttft_s), ("tpot", tpot_s)):
        hi = r.get(f"{name}_slo_q_hi_s", math.nan)
        if hi == hi and hi > target:
            lo = r[f"{name}_slo_q_lo_s"]
            says.append(f"{name.upper()} {p} {r[f'{name}_slo_q_s']:.3g} s is within noise of "
                        f"the {target:g} s target (95% CI {lo:.3g} to {hi:.3g} s)")
            again = [i]
    half = f"{column}_ci_half" if column else None
    if half and half in table and len(met) > 1:
        j = met.index[1]
        a, b = r[column], table.loc[j, column]
        ha, hb = r[half], table.loc[j, half]
        # equal values with no spread: both serve all they are offered, an exact tie the
        # latency tie-break decides (not noise)
        if ha == ha and hb == hb and ha + hb > 0 and a - b <= ha + hb:
            says.append(f"{column} {a:.3g} +- {ha:.2g} is within noise of the runner-up "
                        f"(rank {int(table.loc[j, 'rank'])}, {b:.3g} +- {hb:.2g})")
            again = [i, j]
    return says, again
