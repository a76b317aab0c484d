"""Colocated DP over two node kinds behind one router (``plan --nodes dgx-h100,hgx-h200``):
replicas of one shape (tp, pp, MoE keys) filling whole nodes of each kind, ``n_a`` nodes of
kind a and ``n_b`` of kind b within the GPU budget, estimated per kind, ranked, and the best
few simulated as two ``mixed`` ``[[pools]]`` (docs/disaggregation.md, heterogeneous DP).

The split. Both pools sit behind one ``least_outstanding`` router (the first pool's
``router``, which the front router takes): a request goes to the replica with the fewest
requests in flight, so a replica that finishes sooner receives more. The estimate models
the split by capacity: with ``C_k`` kind k's capacity (req/s of its ``dp_k`` replicas,
:func:`simulator.planner.estimate.estimate`), kind k receives ``lambda_k = lambda C_k /
(C_a + C_b)``, so both run at one utilization ``rho = lambda / (C_a + C_b)``; each is then
estimated at its own share (batch, cycle, TTFT, TPOT), and the mix is

- capacity ``C_a + C_b``, utilization ``rho``, GPUs ``g_a + g_b``;
- TTFT mean, batch, cycle and prefill: means weighted by the shares ``C_k / (C_a + C_b)``;
- TTFT p99 and TPOT: the larger of the two kinds (the slower kind serves a share well
  above 1%, so it sets the tail);
- goodput ``min(lambda, C_a + C_b)`` when rho < 1 and both meet the SLOs, else 0.

Cost and power per kind: goodput per dollar divides by ``g_a price_a + g_b price_b``, tokens
per joule by the estimated power of both kinds' nodes at ``rho``. Bounded: pairs of kinds,
``n_a, n_b >= 1`` whole nodes with ``n_a G_a + n_b G_b <= gpus``, replica shapes of one
replica per node or fewer GPUs that divide both kinds' nodes, the scenario's engine limits
searched as for one kind, without speculation. Rows carry ``node`` (kind a), ``mix_node``
(kind b) and ``mix_dp`` (replicas on kind b; ``dp`` counts both).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pandas as pd

from simulator.hardware.specs import NodeSpec, load_node
from simulator.io.scenario import load_scenario
from simulator.io.schema import Scenario
from simulator.model.spec import ModelSpec
from simulator.planner.candidates import layout_plan, layout_rows, without_spec
from simulator.planner.disagg import pool
from simulator.planner.estimate import estimate
from simulator.planner.hetero import pool_nodes
from simulator.planner.nearmiss import est_slo, margins, objective_values
from simulator.planner.nearmiss import order as est_order
from simulator.planner.objectives import binds, misses, two_kind_value
from simulator.planner.ranking import stable_key
from simulator.planner.search import Rounds, candidates_of, simulate_best
from simulator.planner.space import (
    Layout,
    Limits,
    WorkloadStats,
    engine_limits,
    layout_label,
    layouts,
    useful_kv_tokens,
)
from simulator.sweep import resolve_point

#: The router the mixed pools run behind (the estimate's split assumes it).
ROUTER = "least_outstanding"
#: Columns a mixed row adds to a plan's tables.
MIX_COLUMNS = ["mix_node", "mix_dp"]
#: Mixed candidates simulated at most (fewer with a smaller ``--top``), and per mix and
#: replica shape.
MIX_TOP, PER_MIX = 4, 2
#: Candidate columns a simulated row keeps (with the ``est_*`` ones).
TABLE_KEYS = ("node", *MIX_COLUMNS, "tp", "pp", "dp", "ep", "attention_dp", "kind", "spec_k",
              "max_num_seqs", "max_num_batched_tokens", "chunk_size",
              "kv_tokens_per_replica")


@dataclass(frozen=True)
class Mix:
    """``n_a`` nodes of kind ``a`` and ``n_b`` of kind ``b``, each filled with replicas
    of ``shape`` (dp 1)."""

    a: str
    n_a: int
    b: str
    n_b: int
    shape: Layout

    def dp(self, per_node: int, n: int) -> int:
        return n * per_node // (self.shape.tp * self.shape.pp)


def mixes(nodes: dict[str, NodeSpec], model: ModelSpec, gpus: int) -> list[Mix]:
    """Every mix of two kinds of ``nodes`` (in their order) on whole nodes within ``gpus``
    GPUs, with each replica shape whose GPUs divide both kinds' nodes."""
    kinds, out = list(nodes), []
    for i, a in enumerate(kinds):
        for b in kinds[i + 1:]:
            ga, gb = nodes[a].gpus_per_node, nodes[b].gpus_per_node
            shapes = [lay for lay in layouts(model, math.gcd(ga, gb))
                      if lay.dp == 1 and ga % lay.gpus == 0 and gb % lay.gpus == 0]
            out += [Mix(a, n_a, b, n_b, lay)
                    for n_a in range(1, (gpus - gb) // ga + 1)
                    for n_b in range(1, (gpus - n_a * ga) // gb + 1) for lay in shapes]
    return out


def split_stats(stats: WorkloadStats, share: float) -> WorkloadStats:
    """The workload one kind sees at ``share`` of the load (rate, or closed-loop clients)."""
    if stats.rate_per_s is None:
        return replace(stats, concurrency=(stats.concurrency or 1) * share)
    return replace(stats, rate_per_s=stats.rate_per_s * share)


class MixedDP:
    """The mixed candidates of one multi-kind plan: per kind and node count the built
    layouts (cached), the rows, their objective values and scenarios.

    Parameters
    ----------
    base : dict
        The plan's base scenario (no pools), :func:`simulator.planner.simulate.base_scenario`.
    kinds : list of str
        The node kinds (presets or node files).
    """

    def __init__(self, base: dict, kinds: list[str]):
        self.base, self.s = base, load_scenario(base)
        self.nodes = {k: load_node(k, self.s.base_dir, key="--nodes")
                      for k in dict.fromkeys(kinds)}
        self._built: dict[tuple, tuple] = {}

    def _part(self, kind: str, n: int, lay: Layout, job: tuple) -> tuple:
        """(rows by engine limits, built plan or None) of ``lay`` on ``n`` nodes of
        ``kind``: the rows as a one-kind search estimates them at the whole load (status,
        reason, capacity); ``job`` is :func:`layout_rows`' job after the layout."""
        key = (kind, n, lay)
        if key not in self._built:
            seed = self.s.seed
            base = without_spec(resolve_point(  # mixes do not speculate
                self.base, {"cluster.topology": kind, "cluster.nodes": n}, seed))
            probe, moe = job[1], job[-1]
            built = layout_plan(base, seed, lay, probe, moe)
            rows = layout_rows((base, seed, lay, *job), built)
            cp = built[0] if any(r["status"] == "feasible" for r in rows) else None
            self._built[key] = ({(r["max_num_seqs"], r["max_num_batched_tokens"],
                                  r["chunk_size"]): r for r in rows}, cp)
        return self._built[key]

    def rows(self, model: ModelSpec, gpus: int, stats: WorkloadStats, limits: list[Limits],
             probe: Limits, need: int) -> list[dict]:
        """Candidate rows (candidates.csv columns plus ``node``, ``mix_node``,
        ``mix_dp``) of every mix x engine limit, estimated as the module docstring says."""
        s = self.s
        job = (limits, probe, need, stats, s.slo.ttft_s, s.slo.tpot_s, model.moe is not None)
        out = []
        for mix in mixes(self.nodes, model, gpus):
            sides = [(kind, n, self.nodes[kind].gpus_per_node)
                     for kind, n in ((mix.a, mix.n_a), (mix.b, mix.n_b))]
            # A shape one node of a kind cannot run is out on any number of its nodes (a
            # replica's memory and KV do not depend on dp): the one-node rows say why.
            ones = [self._part(kind, 1, replace(mix.shape, dp=mix.dp(per, 1)), job)
                    for kind, _, per in sides]
            fits = all(cp is not None for _, cp in ones)
            parts = []
            for (kind, n, per), (rows, _) in zip(sides, ones, strict=True):
                lay = replace(mix.shape, dp=mix.dp(per, n))
                parts.append((lay, *self._part(kind, n, lay, job)) if fits
                             else (lay, rows, None))
            for lim in limits:
                key = (lim.max_num_seqs, lim.max_num_batched_tokens, lim.chunk_size)
                out.append(self._row(mix, lim, [(lay, rows[key], cp)
                                                for lay, rows, cp in parts], stats))
        return out

    def _row(self, mix: Mix, lim: Limits, parts: list, stats: WorkloadStats) -> dict:
        (lay_a, ra, cp_a), (lay_b, rb, cp_b) = parts
        s = self.s
        row = {**ra, "node": mix.a, "mix_node": mix.b, "mix_dp": lay_b.dp,
               "dp": lay_a.dp + lay_b.dp, "gpus": lay_a.gpus + lay_b.gpus,
               "kv_tokens_per_replica": min(ra["kv_tokens_per_replica"],
                                            rb["kv_tokens_per_replica"])}
        if ra["status"] != "feasible" or rb["status"] != "feasible":
            why = [f"{k}: {r['reason']}" for k, r in ((mix.a, ra), (mix.b, rb))
                   if r["status"] != "feasible"]
            return {**row, "status": "excluded", "reason": "; ".join(why)}
        cap = ra["est_capacity_req_per_s"] + rb["est_capacity_req_per_s"]
        ests = []
        for r, cp in ((ra, cp_a), (rb, cp_b)):
            share = r["est_capacity_req_per_s"] / cap
            kv = r["kv_tokens_per_replica"]  # layout_rows' memory_plan(cp, lim).kv_tokens
            ests.append((share, estimate(cp, lim, kv, split_stats(stats, share),
                                         s.slo.ttft_s, s.slo.tpot_s)))
        rate = stats.rate_per_s
        rho = rate / cap if rate is not None else sum(w * e.utilization for w, e in ests)
        est = {f"est_{k}": sum(w * getattr(e, k) for w, e in ests)
               for k in ("batch", "cycle_s", "prefill_s", "ttft_s")}
        est.update(est_capacity_req_per_s=cap, est_utilization=rho,
                   est_ttft_p99_s=max(e.ttft_p99_s for _, e in ests),
                   est_tpot_s=max(e.tpot_s for _, e in ests))
        ok = all(e.goodput_req_per_s > 0 for _, e in ests)
        served = min(rate, cap) if rate is not None else sum(
            e.capacity_req_per_s * e.utilization for _, e in ests)
        est["est_goodput_req_per_s"] = served if ok else 0.0
        return {**row, **est}

    def values(self, df: pd.DataFrame, objective: str, stats: WorkloadStats) -> list[float]:
        """``est_objective`` of mixed rows: each kind's GPUs at its own price and power
        (as :meth:`simulator.planner.hetero.CrossPairs.values` for pairs)."""
        a = self.nodes[df["node"].iloc[0]] if len(df) else None
        base = objective_values(df, objective, 1.0, a, stats.output_mean, stats.rate_per_s)
        if objective not in ("goodput_per_usd", "tokens_per_joule"):
            return base
        out = []
        for value, (_, r) in zip(base, df.iterrows(), strict=True):
            na, nb = self.nodes[r["node"]], self.nodes[r["mix_node"]]
            g_b = int(r["mix_dp"]) * int(r["tp"]) * int(r["pp"])
            g_a = int(r["gpus"]) - g_b
            out.append(two_kind_value(value, objective, na, g_a, nb, g_b,
                                      r["est_utilization"], self.s.cluster.gpu_hour_usd))
        return out

    def rank(self, df: pd.DataFrame, objective: str, stats: WorkloadStats,
             m: dict[str, float]) -> pd.DataFrame:
        """``df`` with ``est_slo`` and ``est_objective`` at the near-miss ratios ``m``."""
        df = df.copy()
        df["est_slo"] = est_slo(df, self.s.slo, m)
        df["est_objective"] = self.values(df, objective, stats)
        return df

    def point(self, row) -> dict:
        """The scenario of a mixed row: the base at the row's engine limits, without
        ``[speculative]``, with the pools of :func:`mix_pools`."""
        lim = Limits.of_row(row)
        data = without_spec(resolve_point(self.base, lim.overrides(), self.s.seed))
        data["pools"] = mix_pools(row, self.s)
        return data

    def point_of(self, cands: pd.DataFrame):
        """``scenario(i)`` of :func:`~simulator.planner.search.simulate_best`: the
        :meth:`point` of row ``i`` of ``cands``."""
        return lambda i: self.point(cands.loc[i])

    def search(self, model: ModelSpec, gpus: int, stats: WorkloadStats, objective: str,
               top: int, jobs: int | None, quantile: float
               ) -> tuple[pd.DataFrame, pd.DataFrame] | None:
        """Estimate every mix, simulate the best ``min(top, MIX_TOP)`` feasible ones by the
        estimate (at most ``PER_MIX`` per mix and shape; one round of
        :func:`~simulator.planner.search.simulate_best`) and return ``(candidates,
        simulated rows)`` in plan.csv's columns (unranked), or None without any mix."""
        s = self.s
        limits = engine_limits(s)
        probe = min(limits, key=lambda lim: (lim.budget, lim.max_num_seqs))
        need = useful_kv_tokens(stats, s.engine.max_model_len or model.max_position_embeddings)
        rows = self.rows(model, gpus, stats, limits, probe, need)
        if not rows:
            return None
        cands = self.rank(pd.DataFrame(rows), objective, stats, margins(None))
        cands["simulated"] = False
        typed = candidates_of(cands)
        ranked = cands.loc[est_order(cands, objective, stable_key)]
        found = simulate_best(cands, typed, lambda m: ranked, self.point_of(cands), objective,
                              s.slo, Rounds(min(top, MIX_TOP), PER_MIX), quantile, jobs)
        if found.interrupted:  # Ctrl-C: the multi-kind plan stops
            raise KeyboardInterrupt
        picked, sims = found.picked, found.sims
        cands.loc[picked, "simulated"] = True
        table = pd.DataFrame([
            {**cands.loc[i, [c for c in cands if c.startswith("est_") or c in TABLE_KEYS]],
             **{k: v for k, v in sims[i].items() if k not in ("ttft_q_s", "tpot_q_s")},
             "ttft_slo_q_s": sims[i].get("ttft_q_s", math.nan),
             "tpot_slo_q_s": sims[i].get("tpot_q_s", math.nan)} for i in picked])
        if table.empty:
            return cands, table
        table["gpus"] = cands.loc[picked, "gpus"].to_numpy()
        table["slo_met"] = [r["status"] == "ok" and not misses(r, s.slo, quantile)
                            for _, r in table.iterrows()]
        table["note"] = ["; ".join(misses(r, s.slo, quantile)) for _, r in table.iterrows()]
        table["binds"] = [binds(r, s.slo, quantile) for _, r in table.iterrows()]
        table["pools"] = [layout_label(r) for _, r in table.iterrows()]
        return cands, table


def mix_kind(row) -> str | None:
    """The second node kind of a mixed row (``mix_node``), else None."""
    mix = row.get("mix_node")
    return mix if isinstance(mix, str) else None


def mix_pools(row, s: Scenario) -> list[dict]:
    """The ``[[pools]]`` of a mixed row: two ``mixed`` pools on whole nodes of each kind,
    ``packed``, behind one ``least_outstanding`` router (:data:`ROUTER`, set on the first
    pool, whose router the front takes); a ``[cluster] gpu_hour_usd`` prices both."""
    tp, pp, dp_b = int(row["tp"]), int(row["pp"]), int(row["mix_dp"])
    pools = []
    for i, (kind, dp) in enumerate(((row["node"], int(row["dp"]) - dp_b),
                                    (row["mix_node"], dp_b))):
        per = load_node(kind, s.base_dir, key="--nodes").gpus_per_node
        one = pool(f"mixed{i}", "mixed", tp, pp, dp, row.get("ep"), row.get("attention_dp"),
                   where={"topology": kind, "nodes": pool_nodes(tp, pp, dp, per)},
                   router=ROUTER)
        if s.cluster.gpu_hour_usd is not None:
            one["gpu_hour_usd"] = s.cluster.gpu_hour_usd
        pools.append(one)
    return pools
