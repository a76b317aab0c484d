"""Disaggregated candidates of a plan (``plan --disagg``): a prefill pool and a decode pool
on the plan's nodes, each with its own TP, PP, DP (and EP / attention DP for a MoE model),
priced by the fast estimate and ranked in one table with the colocated candidates.

Where the pools sit: the prefill pool is declared on the plan's nodes and the decode pool
shares them (``same_nodes_as``), both placed ``packed``: the prefill replicas take the first
GPUs, the decode replicas the next free ones, so the prefill:decode ratio is free at GPU
granularity (3 + 5 GPUs of one node, 12 + 4 of two), as the pools builder allows
(:mod:`simulator.cluster.pools`). A pool replica has the fewest pipeline stages with which
the model and a useful KV cache fit at its TP degree (pp > 1 only where the model needs it).

The estimate of a pair (prefill pool p, decode pool d), at offered rate lambda, mean prompt
P and output O (docs/planner.md, "Disaggregated layouts"):

- prefill pool, at each token budget and ``max_num_seqs`` searched
  (:data:`~simulator.planner.poolaxes.PREFILL_BUDGETS`,
  :data:`~simulator.planner.space.PREFILL_SEQS` and the scenario's): a full step
  of ``F = min(budget, max_num_seqs P)`` tokens holds ``F / P`` prompts in ``s(F)``, so the
  pool's capacity is ``X_p = dp_p M_p (F / P) / s(F)``; the step a prompt joins at the
  load holds its own ``c = min(P, budget)`` tokens and, when the stream is busy (fraction
  ``u = a s(x) / x``, ``a = lambda P / (dp_p M_p)``), those that arrived during the step
  in flight: ``x = min(F, c + u a s(x))`` (:func:`~simulator.planner.poolaxes.joined_step`);
  TTFT = ``ceil(P / budget) s(x)`` plus the M/D/1 wait ``rho_p / (2 (1 - rho_p)) s(x) P /
  x`` (the work a prompt brings to that step), ``rho_p = lambda / X_p``; the p99 takes the
  p99 prompt and 4.6 x the wait. A bigger budget raises ``X_p`` but lets ``s(x)`` grow
  with the load; options another beats on all three figures are dropped
  (:func:`~simulator.planner.poolaxes.pareto_limits`);
- decode pool: decode-only steps, ``cycle(B)`` for B sequences at context P + O/2; the batch
  at the load solves ``B = lambda / (dp_d M_d) O cycle(B)`` (capped by max_num_seqs and the
  KV cache), capacity ``X_d = dp_d M_d B_max / (O cycle(B_max))``, TPOT = ``cycle(B) +
  (t_kv + W) / (O - 1)`` (the transfer and the admission wait W, below, land between the
  first and second token); the SLO is judged on ``est_tpot_p99_s``, the same with the
  step at the p99 request's batch ``1 + B + 2.326 sqrt(B)``
  (:func:`~simulator.planner.estimate.batch_p99`: the batch fluctuates); with a
  ``[speculative]`` section also at each k searched, a step yielding ``g = 1 + E[A]``
  tokens: ``B = lambda / (dp_d M_d) (O / g) cycle(B)``, ``X_d`` times g, TPOT ``cycle(B) /
  g + (t_kv + W) / (O - 1)``;
- KV transfer: P tokens of KV from a prefill replica to a decode replica, priced as
  :mod:`simulator.cluster.transfer` prices it uncontended (the max-min fluid finish of the
  per-GPU-pair flows of :func:`~simulator.cluster.transfer.kv_flows` over the graph,
  ``T``, plus the path latency); transfers share the links of their ends, so those of
  the busiest end, ``lambda / min(dp_p, dp_d)`` per second, contend: processor sharing,
  ``t_kv = T / (1 - rho_kv) + latency`` with ``rho_kv = lambda T / min(dp_p, dp_d)``
  (:func:`~simulator.planner.poolaxes.kv_contended`);
- decode admission: a prefilled request waits for one of the decode pool's ``c = dp_d M_d
  B_max`` sequence slots, each held ``S = t_kv + (O / g) cycle(B)``: the M/G/c wait ``W``
  of :func:`~simulator.planner.poolaxes.decode_wait` (Allen-Cunneen), which delays the
  second token: TPOT gains ``W / (O - 1)``;
- the pair: capacity ``min(X_p, X_d, min(dp_p, dp_d) / T)``; meets the SLOs by estimate
  when both pools and the links keep up, the prefill pool's p99 TTFT and the TPOT are
  within the targets.

Pool figures are computed once per pool option; the pairs are combined with numpy.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from simulator.cluster.build import ClusterPlan
from simulator.cluster.pools import build_plan
from simulator.cluster.stepmodel import StepModel, step_mix
from simulator.errors import ScenarioError
from simulator.io.scenario import load_scenario
from simulator.io.schema import Scenario
from simulator.model.spec import ModelSpec
from simulator.planner.candidates import memory_plan, point_overrides, spec_options, without_spec
from simulator.planner.estimate import batch_p99, decode_cycle, little_batch, spec_gain
from simulator.planner.poolaxes import (
    KVPrice,
    decode_wait,
    joined_step,
    kv_contended,
    pareto_limits,
    prefill_engine,
    prefill_limits,
    spec_plan,
)
from simulator.planner.space import (
    MAX_NUM_SEQS,
    TOKEN_BUDGETS,
    Layout,
    Limits,
    WorkloadStats,
    layouts,
    speculating,
)
from simulator.sweep import resolve_point


@dataclass(frozen=True)
class PoolSide:
    """One pool option: its replica shape (``lay`` with dp = 1), replicas, engine limits,
    and the estimate's figures for it at the offered load."""

    lay: Layout
    dp: int
    limits: Limits
    kv_tokens: int
    capacity: float  # req/s of the pool
    ttft_s: float  # prefill: mean TTFT; decode: nan
    ttft_p99_s: float
    cycle_s: float  # decode step at the batch the pool carries (prefill: one prompt's step)
    batch: float
    gain: float = 1.0  # decode: output tokens per sequence and step (1 + E[A] speculating)
    spec_k: int = 0  # decode: speculative tokens per step (0: off)
    slots: float = math.nan  # decode: sequences the pool holds at once, dp M B_max
    tail_s: float = math.nan  # decode: s per output token at the p99 batch (batch_p99)

    @property
    def gpus(self) -> int:
        return self.lay.tp * self.lay.pp * self.dp


def shapes(base: dict, s: Scenario, model: ModelSpec, gpus: int, probe: Limits,
           need: int) -> list[tuple[Layout, ClusterPlan]]:
    """Per (tp, ep, attention_dp): the replica shape with the fewest pipeline stages that
    builds, fits and keeps at least ``need`` KV tokens per stream at ``probe`` limits."""
    out: dict[tuple, tuple[Layout, ClusterPlan]] = {}
    moe = model.moe is not None
    for lay in sorted((lay for lay in layouts(model, gpus) if lay.dp == 1),
                      key=lambda x: (x.tp, x.ep, x.attention_dp, x.pp)):
        key = (lay.tp, lay.ep, lay.attention_dp)
        if key in out:
            continue
        try:
            cp = build_plan(load_scenario(resolve_point(without_spec(base),
                                                        point_overrides(lay, probe, moe), s.seed)))
            mem = memory_plan(cp, probe)
        except ScenarioError:
            continue
        if mem.kv_tokens // cp.streams_per_replica >= need:
            out[key] = (lay, cp)
    return sorted(out.values(), key=lambda x: (x[0].gpus, x[0].tp, x[0].ep,
                                               x[0].attention_dp))


def step_model(cp: ClusterPlan) -> StepModel:
    eng = cp.scenario.engine
    return StepModel(cp, 0.0 if eng.cpu_overlap else eng.step_overhead_s,
                     cp.streams_per_replica)


def prefill_sides(lay: Layout, cp: ClusterPlan, stats: WorkloadStats, gpus: int,
                  limits: list[Limits]) -> list[PoolSide]:
    """The prefill pool of shape ``lay`` with every dp that leaves a GPU for decode, at
    every engine limit of ``limits`` (the first with the scenario's ``max_num_seqs``)
    whose full step fits the KV cache (module docstring: the step a prompt joins at the
    load, capacity, M/D/1 wait); an option that another of the same replicas beats on
    capacity and both TTFTs is dropped (:func:`pareto_limits`)."""
    m, streams = step_model(cp), cp.streams_per_replica
    p, o = max(stats.prompt_mean, 1.0), max(stats.output_mean, 1.0)
    p99 = max(stats.prompt_p99, p)
    rate = stats.rate_per_s or 0.0
    steps: dict[tuple[int, float], float] = {}

    def step(tokens: float, prompt: float) -> float:
        """A prefill-only step of ``tokens`` tokens of ``prompt``-token prompts."""
        key = (max(1, round(tokens)), prompt)
        if key not in steps:
            steps[key] = m.cycle(*step_mix(0.0, float(key[0]), prompt, o))
        return steps[key]

    out = []
    for lim in limits:
        budget = lim.budget
        try:
            mem = memory_plan(cp, lim)
        except ScenarioError:
            continue
        first = min(p, budget)  # a lone prompt's step (a chunk when P > budget)
        full = max(first, min(budget, lim.max_num_seqs * p))
        if mem.kv_tokens // streams < full:
            continue
        per_replica = streams * (full / p) / step(full, p)
        alone99 = step(min(p99, budget), p99)
        for dp in range(1, (gpus - 1) // lay.gpus + 1):
            cap = dp * per_replica
            rho = rate / cap
            tokens = joined_step(lambda x: step(x, p), first, full, rate / (dp * streams) * p)
            s_load = step(tokens, p)
            # M/D/1 wait on the work a prompt brings to the step it joins, s(x) P / x.
            wait = rho / (2 * (1 - rho)) * s_load * p / tokens if rho < 1 else math.inf
            pre = math.ceil(p / budget) * s_load
            out.append(PoolSide(lay, dp, lim, mem.kv_tokens, cap, pre + wait,
                                math.ceil(p99 / budget) * max(alone99, s_load) + 4.6 * wait,
                                pre, tokens / p))
    return pareto_limits(out, limits[0].max_num_seqs)


def decode_sides(lay: Layout, cp: ClusterPlan, stats: WorkloadStats, gpus: int,
                 limits: list[Limits], need: int, spec_cp: ClusterPlan | None = None
                 ) -> list[PoolSide]:
    """The decode pool of shape ``lay`` with every dp and engine limit that leaves a GPU
    for prefill (and keeps a useful KV cache); with ``spec_cp`` (the shape built with the
    scenario's ``[speculative]`` section) also with every speculative k searched, the
    drafter charged to memory (docs/planner.md, "Speculative decoding as an axis")."""
    m = step_model(cp)
    streams = cp.streams_per_replica
    p, o = max(stats.prompt_mean, 1.0), max(stats.output_mean, 1.0)
    specs = spec_options(spec_cp) if spec_cp is not None else []
    out = []
    for lim in limits:
        for spec in [None, *specs]:
            try:
                mem = memory_plan(spec_cp if spec else cp, lim, drafter=spec is not None)
            except ScenarioError:
                continue
            if mem.kv_tokens // streams < need:
                continue

            def gain(b: float, spec=spec, budget=lim.budget) -> float:
                return spec_gain(spec, b, budget)

            def cycle(b: float, spec=spec, budget=lim.budget) -> float:
                return decode_cycle(m, spec, b, 0.0, p, o, budget)  # decode-only steps

            b_max = max(1.0, min(lim.max_num_seqs, mem.kv_tokens / streams / (p + o / 2)))
            c_max = cycle(b_max)
            for dp in range(1, (gpus - 1) // lay.gpus + 1):
                lanes = dp * streams
                rate = stats.rate_per_s if stats.rate_per_s is not None else math.nan
                if stats.rate_per_s is None:  # closed loop: the clients fix the batch
                    batch = min(b_max, max(1.0, (stats.concurrency or 1) / lanes))
                else:  # Little's law: O / gain steps per request
                    batch = little_batch(rate, lanes, o, b_max, gain, cycle)
                b99 = batch_p99(batch, b_max) if stats.rate_per_s is not None else batch
                out.append(PoolSide(lay, dp, lim, mem.kv_tokens,
                                    lanes * b_max * gain(b_max) / (o * c_max), math.nan,
                                    math.nan, cycle(batch), batch, gain(batch),
                                    spec.k if spec else 0, lanes * b_max,
                                    cycle(b99) / gain(b99)))
    return out


def disagg_rows(base: dict, s: Scenario, model: ModelSpec, gpus: int, stats: WorkloadStats,
                need: int, ttft_slo_s: float, tpot_slo_s: float) -> list[dict]:
    """Candidate rows (candidates.csv) of every prefill + decode pool pair of at most
    ``gpus`` GPUs, estimated (module docstring); ``kind = "disaggregated"``, the decode
    pool in ``tp, pp, dp, ep, attention_dp``, the prefill pool in ``prefill_*``."""
    opts = pool_options(base, s, model, gpus, stats, need)
    return pair_rows(opts.pres, opts.decs,
                     lambda pr, de: opts.price(pr.lay, de.lay, pr.gpus), gpus, stats,
                     ttft_slo_s, tpot_slo_s)


@dataclass(frozen=True)
class PoolOptions:
    """Every prefill and decode pool option on one kind of node, the KV price between
    them on that kind's graph (:class:`KVPrice`) and one built plan of the kind."""

    pres: list[PoolSide]
    decs: list[PoolSide]
    price: KVPrice | None
    plan: ClusterPlan | None


def pool_options(base: dict, s: Scenario, model: ModelSpec, gpus: int, stats: WorkloadStats,
                 need: int) -> PoolOptions:
    """The prefill and decode pool options on the scenario's nodes, each leaving a GPU
    of ``gpus`` to the other pool (:func:`prefill_sides`, :func:`decode_sides` per
    replica shape of :func:`shapes`)."""
    e = s.engine
    budget = max(e.max_num_batched_tokens, *TOKEN_BUDGETS)
    pre_lims = prefill_limits(e)
    dec_lims = [Limits(n, max(n, e.max_num_batched_tokens))
                for n in sorted({*MAX_NUM_SEQS, e.max_num_seqs})]
    probe = Limits(max(lim.max_num_seqs for lim in dec_lims), budget)
    need_p = min(stats.longest, e.max_model_len or model.max_position_embeddings)
    pres, decs, price, plan = [], [], None, None
    for lay, cp in shapes(base, s, model, gpus - 1, probe, min(need, need_p)):
        price, plan = price or KVPrice(cp, model, s.model.kv_dtype), plan or cp
        pres += prefill_sides(lay, cp, stats, gpus, pre_lims)
        decs += decode_sides(lay, cp, stats, gpus, dec_lims, need,
                             spec_plan(base, s.seed, lay, probe, model.moe is not None))
    return PoolOptions(pres, decs, price, plan)


def pair_rows(pres: list[PoolSide], decs: list[PoolSide], kv_of, gpus: int,
              stats: WorkloadStats, ttft_slo_s: float, tpot_slo_s: float) -> list[dict]:
    """Candidate rows of every (prefill, decode) option pair of at most ``gpus`` GPUs,
    estimated (module docstring); ``kv_of(prefill, decode)`` gives the pair's KV transfer,
    ``(seconds_per_token, latency_s)`` (nan: the decode replica finds no room)."""
    if not pres or not decs:
        return []
    gp = np.array([x.gpus for x in pres])
    gd = np.array([x.gpus for x in decs])
    i, j = np.nonzero(gp[:, None] + gd[None, :] <= gpus)
    if len(i) == 0:
        return []
    o = max(stats.output_mean, 1.0)
    p = max(stats.prompt_mean, 1.0)
    kv = np.array([kv_of(pres[a], decs[b]) for a, b in zip(i, j, strict=True)])
    rate = stats.rate_per_s
    ends = np.minimum([pres[a].dp for a in i], [decs[b].dp for b in j])
    t_kv, x_kv = kv_contended(p * kv[:, 0], kv[:, 1], rate, ends)
    cap = np.minimum(np.minimum([pres[a].capacity for a in i],
                                [decs[b].capacity for b in j]), x_kv)
    rho = rate / cap if rate is not None else np.zeros(len(i))
    ttft_p99 = np.array([pres[a].ttft_p99_s for a in i])
    ttft = np.array([pres[a].ttft_s for a in i])
    step = np.array([decs[b].cycle_s / decs[b].gain for b in j])  # s per output token
    wait = decode_wait(rate, np.array([decs[b].slots for b in j]), t_kv + o * step,
                       stats.output_cv2)
    tpot = step + (t_kv + wait) / max(o - 1, 1.0)
    tail = np.array([decs[b].tail_s for b in j]) + (t_kv + wait) / max(o - 1, 1.0)
    ok = (rho < 1) & (ttft_p99 <= ttft_slo_s) & (tail <= tpot_slo_s) & np.isfinite(t_kv)
    served = np.minimum(rate, cap) if rate is not None else cap
    rows = []
    for n, (a, b) in enumerate(zip(i, j, strict=True)):
        pr, de = pres[a], decs[b]
        row = {"tp": de.lay.tp, "pp": de.lay.pp, "dp": de.dp, "ep": de.lay.ep,
               "attention_dp": de.lay.attention_dp,
               "max_num_seqs": de.limits.max_num_seqs,
               "max_num_batched_tokens": de.limits.max_num_batched_tokens,
               "chunk_size": None, "gpus": pr.gpus + de.gpus, "simulated": False,
               "kind": "disaggregated", "spec_k": de.spec_k,
               "prefill_tp": pr.lay.tp, "prefill_pp": pr.lay.pp, "prefill_dp": pr.dp,
               "prefill_ep": pr.lay.ep, "prefill_attention_dp": pr.lay.attention_dp,
               "kv_tokens_per_replica": de.kv_tokens,
               "prefill_max_num_seqs": pr.limits.max_num_seqs,
               "prefill_max_num_batched_tokens": pr.limits.max_num_batched_tokens}
        if not np.isfinite(kv[n, 0]):
            rows.append({**row, "status": "excluded", "reason": "the decode pool's TP group "
                         "finds no room after the prefill pool (packed placement)"})
            continue
        rows.append({**row, "status": "feasible", "reason": "",
                     "est_capacity_req_per_s": float(cap[n]),
                     "est_utilization": float(rho[n]), "est_batch": de.batch,
                     "est_cycle_s": de.cycle_s, "est_prefill_s": pr.cycle_s,
                     "est_ttft_s": float(ttft[n]), "est_ttft_p99_s": float(ttft_p99[n]),
                     "est_tpot_s": float(tpot[n]), "est_kv_transfer_s": float(t_kv[n]),
                     "est_tpot_p99_s": float(tail[n]),
                     "est_goodput_req_per_s": float(served[n]) if ok[n] else 0.0})
    return rows


def pool(name: str, role: str, tp, pp, dp, ep, adp, where: dict | None = None,
         **keys) -> dict:
    """One packed ``[[pools]]`` entry of a candidate row's replica shape: ``name``,
    ``role``, the ``where`` keys (topology, nodes), tp, pp, dp, ``placement = "packed"``,
    the other ``keys`` (engine, router), then ``ep`` when above 1 and ``attention_dp``
    when set (the row's values may be NaN or floats from a table)."""
    out = {"name": name, "role": role, **(where or {}), "tp": int(tp), "pp": int(pp),
           "dp": int(dp), "placement": "packed", **keys}
    if ep is not None and ep == ep and int(ep) > 1:
        out["ep"] = int(ep)
    if adp is True or adp == 1.0:
        out["attention_dp"] = True
    return out


def pools_of(row, nodes: int, s: Scenario) -> list[dict]:
    """The ``[[pools]]`` of a disaggregated candidate row: prefill on the plan's ``nodes``,
    decode sharing them, both packed, each with its engine limits; a row with ``spec_k >
    0`` gives the decode pool its ``[pools.speculative]`` (the scenario's section at that
    k), the speculation of the decode pool only."""
    e = s.engine
    pre = pool("prefill", "prefill", row["prefill_tp"], row["prefill_pp"], row["prefill_dp"],
               row.get("prefill_ep"), row.get("prefill_attention_dp"),
               engine=prefill_engine(row, e))
    pre["nodes"] = nodes
    dec = pool("decode", "decode", row["tp"], row["pp"], row["dp"], row.get("ep"),
               row.get("attention_dp"),
               engine={"max_num_seqs": int(row["max_num_seqs"]),
                       "max_num_batched_tokens": int(row["max_num_batched_tokens"])})
    dec["same_nodes_as"] = "prefill"
    if s.speculative is not None and speculating(row):
        dec["speculative"] = {**{f: v for f, v in asdict(s.speculative).items()
                                 if v is not None},
                              "num_speculative_tokens": int(row["spec_k"])}
    return [pre, dec]

