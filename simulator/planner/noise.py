"""How sure a simulated point is: confidence intervals by sectioning, and the rule that
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
