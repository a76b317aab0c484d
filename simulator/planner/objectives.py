"""The planner's objectives beyond goodput per GPU: goodput per dollar and tokens per joule,
for the estimate (ranking every candidate) and for the simulation (ranking the proven ones),
and the rank agreement between the two (Spearman's rho on the simulated points).

- ``goodput_per_gpu``: goodput (requests/s within the SLOs) per GPU used.
- ``goodput_per_usd``: goodput requests per US dollar, ``goodput x 3600 / (GPUs x
  gpu_hour_usd)`` (prices: :mod:`simulator.hardware.prices`, or ``[cluster] gpu_hour_usd``).
- ``tokens_per_joule``: output tokens per joule of the powered nodes
  (:mod:`simulator.metrics.power`). The simulation measures it (``1 /
  energy_per_output_token_j`` of the run); the estimate prices power at an activity equal to
  the estimated utilization (offered / capacity, at most 1): a proxy to rank, not a figure.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from simulator.hardware.prices import gpu_hour_usd
from simulator.hardware.specs import NodeSpec
from simulator.metrics.power import NODE_OVERHEAD_W

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
