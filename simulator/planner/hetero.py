"""Cross-kind disaggregated pairs of a plan over several node kinds (``plan --disagg
--nodes dgx-h100,hgx-h200``): the prefill pool on whole nodes of one kind, the decode pool
on whole nodes of another (Splitwise: prefill where compute is, decode where memory
bandwidth or price is), both within the plan's GPU budget.

Each kind's pool options are those of a same-kind search on that kind's nodes
(:func:`simulator.planner.disagg.pool_options`: every replica shape, dp and decode
engine limit), the pairs are estimated by :func:`simulator.planner.disagg.pair_rows`, and
the KV transfer is priced by :class:`simulator.planner.disagg.KVPrice` on the graph the
simulator builds for these pools (:func:`simulator.cluster.pools.fabric_graph`: the
prefill pool's nodes, then the decode pool's, every NIC on one fabric switch, or with
``[cluster] fabric = "leaf_spine"`` on the leaf-spine of
:func:`simulator.topology.graph.leaf_spine_graph`), from the first prefill replica to
the first decode replica as the ``packed`` placement puts them: GPU, NIC, switch (or leaf,
and spines off the rail), NIC, GPU. The estimate's cost and power take each pool's own
node kind: the pair's dollars per hour are ``g_p x price_p + g_d x price_d`` and its
power the sum of each pool's nodes (:func:`simulator.planner.objectives.est_power_w`).

A cross-kind row carries ``decode_node`` (the decode pool's kind); the plan of the prefill
kind ranks it (:func:`simulator.planner.plan.plan` with ``cross``), in a simulation group of
its own (``disaggregated+cross``); its ``[[pools]]`` (:func:`cross_pools`) give each pool
its ``topology`` and whole nodes, on the scenario's fabric (the graph the estimate priced).
"""

from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd

from simulator.cluster.build import cluster_node
from simulator.cluster.pools import fabric_graph
from simulator.hardware.specs import load_node
from simulator.io.scenario import load_scenario
from simulator.io.schema import Scenario
from simulator.model.spec import ModelSpec
from simulator.planner.disagg import (
    KVPrice,
    PoolOptions,
    PoolSide,
    pair_rows,
    pool_options,
    pools_of,
)
from simulator.planner.nearmiss import objective_values
from simulator.planner.objectives import two_kind_value
from simulator.planner.space import WorkloadStats
from simulator.sweep import resolve_point


def pool_nodes(tp: int, pp: int, dp: int, per_node: int) -> int:
    """Whole nodes of ``per_node`` GPUs that hold ``dp`` replicas of ``pp`` stages of
    ``tp`` GPUs, each TP group inside one node (``packed``): ``ceil(dp pp / floor(per_node
    / tp))``; a TP group wider than a node spans ``ceil(tp dp pp / per_node)`` nodes."""
    if tp > per_node:
        return math.ceil(tp * pp * dp / per_node)
    return math.ceil(dp * pp / (per_node // tp))


class CrossPairs:
    """The cross-kind pairs of one multi-kind plan: pool options per kind (computed once
    and shared by the plans of every kind), priced pairs, their pools and objective values.

    Parameters
    ----------
    kinds : list of str
        The node kinds of the plan (presets or node files); pairs join every two of them.
    """

    def __init__(self, kinds: list[str]):
        self.kinds = list(dict.fromkeys(kinds))
        self._options: dict[tuple, tuple[Scenario, PoolOptions]] = {}
        self._prices: dict[tuple, KVPrice] = {}

    def _kind(self, base: dict, s: Scenario, kind: str, model: ModelSpec, gpus: int,
              stats: WorkloadStats, need: int) -> tuple[Scenario, PoolOptions]:
        """The scenario of ``kind`` on the nodes ``gpus`` need, and its pool options."""
        key = (kind, gpus)
        if key not in self._options:
            node = load_node(kind, s.base_dir, key="--nodes")
            data = resolve_point(base, {"cluster.topology": kind,
                                        "cluster.nodes": math.ceil(gpus / node.gpus_per_node)},
                                 s.seed)
            sk = load_scenario(data)
            self._options[key] = (sk, pool_options(data, sk, model, gpus, stats, need))
        return self._options[key]

    def _price(self, s_p: Scenario, plan_p, n_p: int, s_d: Scenario, n_d: int,
               model: ModelSpec) -> KVPrice:
        """The KV price on the pooled graph of ``n_p`` prefill and ``n_d`` decode nodes,
        joined by the scenario's fabric."""
        key = (s_p.cluster.topology, n_p, s_d.cluster.topology, n_d)
        if key not in self._prices:
            graph = fabric_graph(s_p, [cluster_node(s_p)] * n_p + [cluster_node(s_d)] * n_d)
            self._prices[key] = KVPrice(replace(plan_p, graph=graph), model,
                                        s_p.model.kv_dtype)
        return self._prices[key]

    def rows(self, base: dict, s: Scenario, model: ModelSpec, gpus: int,
             stats: WorkloadStats, need: int, ttft_slo_s: float, tpot_slo_s: float
             ) -> list[dict]:
        """Candidate rows of every pair with the prefill pool on the scenario's kind
        (``s.cluster.topology``) and the decode pool on another kind, of at most ``gpus``
        GPUs together; as :func:`simulator.planner.disagg.disagg_rows`, plus
        ``decode_node``."""
        s_p, opt_p = self._kind(base, s, s.cluster.topology, model, gpus, stats, need)
        per_p = cluster_node(s_p).gpus_per_node
        rows = []
        for kind in self.kinds:
            if kind == s.cluster.topology:
                continue
            s_d, opt_d = self._kind(base, s, kind, model, gpus, stats, need)
            per_d = cluster_node(s_d).gpus_per_node

            def kv_of(pr: PoolSide, de: PoolSide, s_d=s_d, per_d=per_d) -> tuple:
                n_p = pool_nodes(pr.lay.tp, pr.lay.pp, pr.dp, per_p)
                n_d = pool_nodes(de.lay.tp, de.lay.pp, de.dp, per_d)
                price = self._price(s_p, opt_p.plan, n_p, s_d, n_d, model)
                return price(pr.lay, de.lay, n_p * per_p)  # decode starts on its own nodes

            rows += [{**r, "decode_node": kind} for r in pair_rows(
                opt_p.pres, opt_d.decs, kv_of, gpus, stats, ttft_slo_s, tpot_slo_s)]
        return rows

    def values(self, df: pd.DataFrame, objective: str, s: Scenario, stats: WorkloadStats
               ) -> pd.Series:
        """``est_objective`` with the cross-kind rows valued at each pool's own GPU-hour
        price and power (the other rows as they are).

        Notes
        -----
        The rows valued at one price and on the prefill kind's nodes by
        :func:`simulator.planner.nearmiss.objective_values` are rescaled to each pool's
        GPUs, price and power by :func:`simulator.planner.objectives.two_kind_value`
        (``(g_p + g_d) / (g_p price_p + g_d price_d)``; ``P_p(g_p + g_d) / (P_p(g_p) +
        P_d(g_d))``, P at the pair's utilization).
        """
        out = df["est_objective"].copy()
        if "decode_node" not in df or objective not in ("goodput_per_usd",
                                                         "tokens_per_joule"):
            return out
        mine = df["node"] if "node" in df else s.cluster.topology
        cross = df[df["decode_node"].notna() & (df["decode_node"] != mine)
                   & (df["status"] == "feasible")]
        if cross.empty:
            return out
        node_p = cluster_node(s)
        base = objective_values(cross, objective, 1.0, node_p, stats.output_mean,
                                stats.rate_per_s)
        nodes = {k: load_node(k, s.base_dir, key="--nodes") for k in cross["decode_node"].unique()}
        g_p = (cross["prefill_tp"] * cross["prefill_pp"] * cross["prefill_dp"]).astype(int)
        g_d = (cross["tp"] * cross["pp"] * cross["dp"]).astype(int)
        for i, value, k, gp, gd, u in zip(cross.index, base, cross["decode_node"], g_p, g_d,
                                          cross["est_utilization"], strict=True):
            out[i] = two_kind_value(value, objective, node_p, gp, nodes[k], gd, u,
                                    s.cluster.gpu_hour_usd)
        return out


def cross_pools(row, s: Scenario) -> list[dict]:
    """The ``[[pools]]`` of a cross-kind row: the prefill pool on whole nodes of the
    scenario's kind, the decode pool on whole nodes of ``row["decode_node"]``, both
    ``packed``, with the engine limits of :func:`simulator.planner.disagg.pools_of`; a
    ``[cluster] gpu_hour_usd`` is each pool's price (pools price their own GPUs)."""
    from_nodes = pool_nodes(int(row["prefill_tp"]), int(row["prefill_pp"]),
                            int(row["prefill_dp"]), cluster_node(s).gpus_per_node)
    pre, dec = pools_of(row, from_nodes, s)
    kind = row["decode_node"]
    per_d = load_node(kind, s.base_dir, key="--nodes").gpus_per_node
    del dec["same_nodes_as"]
    pre["topology"] = s.cluster.topology
    dec.update(topology=kind, nodes=pool_nodes(int(row["tp"]), int(row["pp"]),
                                               int(row["dp"]), per_d))
    if s.cluster.gpu_hour_usd is not None:
        pre["gpu_hour_usd"] = dec["gpu_hour_usd"] = s.cluster.gpu_hour_usd
    return [pre, dec]
