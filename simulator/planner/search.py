"""The planner's search: the candidates table, a typed candidate per kind, and the one loop
that simulates the best few.

The candidates table (``candidates.csv``): :func:`enumerate_candidates` builds every layout
and engine limit (fit, placement) and estimates it (the colocated layouts'
:func:`simulator.planner.candidates.layout_rows`, in worker processes for many layouts),
adds the disaggregated pairs (:mod:`simulator.planner.disagg`) and the cross-kind pairs
(:mod:`simulator.planner.hetero`); :func:`rerank` orders it by the objective at the
near-miss ratios of the simulated points (:mod:`simulator.planner.nearmiss`), between the
rounds of simulations.

A candidate is one of three frozen kinds, each with the fields the search needs (what to
build and run; the estimate's figures stay in the candidates table, which ranks them):

- :class:`Colocated`: one layout (TP x PP x DP, EP, attention DP), its engine limits and
  the speculative tokens per step searched (0: none);
- :class:`Disaggregated`: a prefill pool and a decode pool, each a layout with its engine
  limits, the decode pool's speculation, and the decode pool's node kind when it differs
  from the prefill pool's (:mod:`simulator.planner.hetero`);
- :class:`Mixed`: one replica shape whose replicas fill whole nodes of two kinds behind one
  router (:mod:`simulator.planner.mixdp`).

:func:`candidate` reads one from a table row (the only place that tells the kind from the
columns set). :func:`simulate_best` is the loop of :func:`simulator.planner.plan.plan` and
of the mixed-kind search: rank every candidate by the estimate, simulate the best few of
each group (at most ``per_key`` per layout), measure the estimate's error on them and rank
again, until a candidate meets the SLOs or the rounds are spent; then chase the unsimulated
candidates the estimate rates ahead of the best that met (:func:`ahead_of_met`), and stop.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import pandas as pd

from simulator.hardware.prices import gpu_hour_usd
from simulator.hardware.specs import load_node
from simulator.io.schema import Scenario, SloKeys
from simulator.model.spec import load_model
from simulator.planner.candidates import layout_rows
from simulator.planner.disagg import disagg_rows
from simulator.planner.hetero import CrossPairs
from simulator.planner.nearmiss import TIER, chance, est_slo, groups_of, margins, objective_values
from simulator.planner.nearmiss import order as est_order
from simulator.planner.ranking import PREFILL_COLUMNS, sim_frame, stable_key
from simulator.planner.simulate import Progress, collect, simulate_many
from simulator.planner.space import (
    Layout,
    Limits,
    WorkloadStats,
    engine_limits,
    layouts,
    useful_kv_tokens,
)


def _int(value, default: int = -1) -> int:
    return default if value is None or pd.isna(value) else int(value)


def _layout(row, prefix: str = "") -> Layout:
    """The layout in ``row``'s ``{prefix}tp`` ... columns (dense tables have no ep or
    attention_dp: 1 and False)."""
    ep, adp = row.get(f"{prefix}ep"), row.get(f"{prefix}attention_dp")
    return Layout(int(row[f"{prefix}tp"]), int(row[f"{prefix}pp"]), int(row[f"{prefix}dp"]),
                  _int(ep, 1), False if adp is None or pd.isna(adp) else bool(adp))


@dataclass(frozen=True)
class Colocated:
    """Replicas that prefill and decode: ``layout`` at ``limits``, ``spec_k`` speculative
    tokens per step (0: none)."""

    layout: Layout
    limits: Limits
    spec_k: int = 0

    @property
    def group(self) -> str:
        """The simulation group (:func:`simulator.planner.nearmiss.group_of`)."""
        return "colocated+spec" if self.spec_k > 0 else "colocated"

    def key(self) -> tuple:
        """What at most ``per_key`` simulated candidates share: the layout and group."""
        return (self.layout, self.group, None, self.spec_k)


@dataclass(frozen=True)
class Disaggregated:
    """A prefill pool and a decode pool: ``layout`` and ``limits`` are the decode pool's
    (as the table's ``tp`` ... columns), ``prefill`` and ``prefill_limits`` the prefill
    pool's (None: the scenario's engine limits), ``spec_k`` the decode pool's speculation;
    ``decode_node`` is the decode pool's node kind when it is not the plan's."""

    layout: Layout
    limits: Limits
    prefill: Layout
    prefill_limits: tuple[int, int] | None = None  # max_num_seqs, max_num_batched_tokens
    spec_k: int = 0
    decode_node: str | None = None

    @property
    def group(self) -> str:
        return ("disaggregated" + ("+cross" if self.decode_node else "")
                + ("+spec" if self.spec_k > 0 else ""))

    def key(self) -> tuple:
        return (self.layout, self.group, self.prefill, self.spec_k)

    def row(self) -> dict:
        """The pools' columns of a table row (for :func:`simulator.planner.disagg.pools_of`
        and :func:`simulator.planner.hetero.cross_pools`)."""
        lay, pre = self.layout, self.prefill
        seqs, budget = self.prefill_limits or (None, None)
        return {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "ep": lay.ep,
                "attention_dp": lay.attention_dp, "prefill_tp": pre.tp, "prefill_pp": pre.pp,
                "prefill_dp": pre.dp, "prefill_ep": pre.ep,
                "prefill_attention_dp": pre.attention_dp, "prefill_max_num_seqs": seqs,
                "prefill_max_num_batched_tokens": budget,
                "max_num_seqs": self.limits.max_num_seqs,
                "max_num_batched_tokens": self.limits.max_num_batched_tokens,
                "spec_k": self.spec_k, "decode_node": self.decode_node}


@dataclass(frozen=True)
class Mixed:
    """Replicas of one shape on whole nodes of two kinds: ``layout.dp`` replicas in all,
    ``mix_dp`` of them on ``mix_node``'s nodes, the rest on ``node``'s."""

    layout: Layout
    limits: Limits
    node: str
    mix_node: str
    mix_dp: int

    group = "colocated+mix"

    def key(self) -> tuple:
        lay = self.layout
        return (self.node, self.mix_node, lay.dp, self.mix_dp, lay.tp, lay.pp)


Candidate = Colocated | Disaggregated | Mixed


def candidate(row) -> Candidate:
    """The candidate of a candidates-table row: :class:`Mixed` when it has ``mix_node``,
    :class:`Disaggregated` when its ``kind`` says so, else :class:`Colocated`."""
    lay, lim, k = _layout(row), Limits.of_row(row), _int(row.get("spec_k"), 0)
    mix = row.get("mix_node")
    if isinstance(mix, str):
        return Mixed(lay, lim, row["node"], mix, int(row["mix_dp"]))
    if row.get("kind") != "disaggregated":
        return Colocated(lay, lim, k)
    seqs, budget = row.get("prefill_max_num_seqs"), row.get("prefill_max_num_batched_tokens")
    pre_lim = None if _int(seqs) < 0 or _int(budget) < 0 else (int(seqs), int(budget))
    dec = row.get("decode_node")
    cross = dec if isinstance(dec, str) and dec != row.get("node") else None
    return Disaggregated(lay, lim, _layout(row, "prefill_"), pre_lim, k, cross)


def candidates_of(df: pd.DataFrame) -> dict:
    """:func:`candidate` of every row of ``df``, by its index."""
    return dict(zip(df.index, map(candidate, df.to_dict("records")), strict=True))


def meets(sim: dict, slo: SloKeys) -> bool:
    """Whether a simulation row meets the SLOs (as ``slo_met`` in plan.csv)."""
    return (sim["status"] == "ok" and sim["ttft_q_s"] <= slo.ttft_s
            and sim["tpot_q_s"] <= slo.tpot_s
            and not sim["keep_up_ratio"] < sim["keep_up_least"])


#: Estimated SLO labels of the candidates a further round may chase (nearmiss.est_slo):
#: those ranked at or before the ones that may miss (``meets``, ``may meet``, ``may miss``).
CHASED = tuple(label for label, tier in TIER.items() if tier <= TIER["may miss"])


def ahead_of_met(ranked: pd.DataFrame, picked: list[int], met: list[int],
                 objective: str) -> list[int]:
    """Unsimulated feasible candidates that the estimate says meet the SLOs (``meets``,
    ``may meet`` or ``may miss``) with an estimated objective better than the best
    estimated objective among the simulated candidates ``met`` (those that met in
    simulation), best estimated objective first (ties in ranking order).

    ``ranked`` is :func:`~simulator.planner.search.rerank`'s table at the current
    margins, ``met`` non-empty; the objective is higher-better except ``min_ttft`` and
    ``min_tpot``. Empty when no candidate is ahead: the plan stops.

    Only objectives valued at the load served compare: a ``may miss`` candidate whose
    estimate misses a target (``est_goodput_req_per_s`` 0, near it and flattered on the
    other) is valued at its capacity, which can exceed the offered load
    (:func:`~simulator.planner.objectives.est_value`), so it is neither chased nor sets
    the bar (the bar falls back to all of ``met`` when none of them compares).
    """
    sign = 1.0 if objective in ("min_ttft", "min_tpot") else -1.0
    key = sign * ranked["est_objective"].astype(float)
    served = (ranked["est_goodput_req_per_s"] > 0) | (ranked["est_slo"] == "may meet")
    bar = key.loc[met][served.loc[met]].min() if served.loc[met].any() else key.loc[met].min()
    left = ranked[(ranked["status"] == "feasible") & ranked["est_slo"].isin(CHASED)
                  & served & ~ranked.index.isin(picked) & (key < bar)]
    return list(key.loc[left.index].sort_values(kind="stable").index)


@dataclass
class Found:
    """What :func:`simulate_best` simulated: the candidates in the order they were picked,
    their simulation rows, the near-miss ratios measured on them, and whether Ctrl-C
    stopped it."""

    picked: list[int]
    sims: dict[int, dict]
    margins: dict
    interrupted: bool = False


@dataclass(frozen=True)
class Rounds:
    """How :func:`simulate_best` spends its simulations: at most ``per_group`` candidates
    of each group a round and ``per_key`` sharing a :meth:`key`; ``rounds`` rounds while
    none but ``first`` meets the SLOs, then ``chase`` rounds for the candidates ahead of
    the best that met; ``first`` (the rule of thumb) joins the first round."""

    per_group: int
    per_key: int
    rounds: int = 1
    chase: int = 0
    first: int | None = None


def simulate_best(cands: pd.DataFrame, typed: dict, rank: Callable[[dict], pd.DataFrame],
                  scenario: Callable[[int], dict], objective: str, slo: SloKeys,
                  how: Rounds, quantile: float, jobs: int | None, bar: Progress | None = None,
                  backend: str = "local", address: str | None = None) -> Found:
    """Simulate the best candidates by the estimate, round by round.

    Parameters
    ----------
    cands : DataFrame
        The candidates table (status and the estimate's figures), indexed by candidate.
    typed : dict
        :func:`candidates_of` ``cands``.
    rank : callable
        ``rank(margins)``: ``cands`` in ranking order at the near-miss ratios ``margins``
        (:func:`simulator.planner.nearmiss.margins`), index kept.
    scenario : callable
        ``scenario(i)``: the scenario dict that simulates candidate ``i``.
    how : Rounds
        The rounds and the caps per group and per key.

    Notes
    -----
    Each round takes, in ranking order, the feasible unsimulated candidates while their
    group has had fewer than ``per_group`` this round and their :meth:`key` fewer than
    ``per_key`` in all. Between rounds the near-miss ratios are measured on the simulated
    points and the rest ranked again (simulator.planner.nearmiss). Once a candidate other
    than ``first`` meets the SLOs, ``chase`` more rounds run, each only while some
    unsimulated candidate the estimate says meets (or may meet, or may miss) has a better
    estimated objective than the best of those that met (:func:`ahead_of_met`), those
    first: a pick the estimate flatters within its optimism is then proven or refuted by
    simulation, not dropped on its label.
    """
    bar = bar if bar is not None else Progress(objective, False)
    picked: list[int] = []
    per: dict[tuple, int] = {}
    sims: dict[int, dict] = {}
    m = margins(None)
    chased, interrupted = 0, False
    groups = {typed[i].group for i in cands.index}
    for round_ in range(how.rounds + how.chase):
        met = [i for i in picked if meets(sims[i], slo)]
        chase = any(i != how.first for i in met)
        if (chase and chased == how.chase) or (not chase and round_ == how.rounds):
            break  # checked before ranking again: the caller ranks after the loop
        batch, taken = [], dict.fromkeys(groups, 0)
        ranked = rank(m)
        if chase:
            chased += 1
            ranked = ranked.loc[ahead_of_met(ranked, picked, met, objective)]
        feasible = ranked.index[ranked["status"] == "feasible"]
        for i in feasible:
            c = typed[i]
            key = c.key()
            if i not in picked and taken[c.group] < how.per_group \
                    and per.get(key, 0) < how.per_key:
                per[key] = per.get(key, 0) + 1
                taken[c.group] += 1
                batch.append(i)
        if round_ == 0 and how.first is not None and how.first not in batch:
            batch.append(how.first)
        if not batch:
            break
        todo = {i: scenario(i) for i in batch if i not in sims}
        interrupted = simulate(todo, sims, slo, quantile, jobs, bar, backend, address)
        picked += [i for i in batch if i not in picked and i in sims]
        if interrupted:
            break
        m = margins(sim_frame(cands, picked, sims))
    return Found(picked, sims, m, interrupted)


def simulate(todo: dict, sims: dict, slo: SloKeys, quantile: float, jobs: int | None,
             bar: Progress, backend: str = "local", address: str | None = None) -> bool:
    """Simulate the scenarios ``todo`` (by candidate) into ``sims``, telling ``bar``;
    True when Ctrl-C stopped them (``sims`` holds those that finished)."""
    bar.planned(len(todo))
    return collect(simulate_many(todo, quantile, jobs, backend, address), sims, bar,
                   lambda row: meets(row, slo))


def group_series(typed: dict) -> pd.Series:
    """The simulation group of each candidate of ``typed`` (:func:`candidates_of`), by
    index (as :func:`simulator.planner.nearmiss.groups_of` reads them from the rows)."""
    return pd.Series([c.group for c in typed.values()], index=list(typed), dtype=object)


def per_group(top: int, typed: dict, feasible) -> int:
    """Candidates a round simulates per group: ``top`` shared among the groups of the
    ``feasible`` candidates, at least 2."""
    return max(2, math.ceil(top / len({typed[i].group for i in feasible})))


#: Layouts from which the estimate runs in worker processes (fewer: start-up dominates).
PARALLEL_LAYOUTS = 8
CANDIDATE_COLUMNS = [
    "tp", "pp", "dp", "max_num_seqs", "max_num_batched_tokens", "chunk_size", "gpus",
    "status", "reason", "kv_tokens_per_replica", "est_capacity_req_per_s", "est_utilization",
    "est_batch", "est_cycle_s", "est_prefill_s", "est_ttft_s", "est_ttft_p99_s", "est_tpot_s",
    "est_goodput_req_per_s", "est_rank", "simulated", "est_objective", "kind", "spec_k",
    "est_slo", "est_tpot_p99_s"]


def with_columns(columns: list[str], model, disagg: bool = False, cross: bool = False
             ) -> list[str]:
    """``columns`` with ``ep`` and ``attention_dp`` after ``dp`` for a MoE model, and the
    prefill pool's columns after ``kind`` with disaggregated candidates (after the decode
    pool's ``decode_node`` with cross-kind pairs)."""
    if disagg:
        i = columns.index("kind") + 1
        pre = [c for c in PREFILL_COLUMNS if model.moe is not None or "_ep" not in c
               and "attention" not in c]
        pre = ["decode_node", *pre] if cross else pre
        columns = [*columns[:i], *pre, *columns[i:]]
    if model.moe is None:
        return columns
    i = columns.index("dp") + 1
    return [*columns[:i], "ep", "attention_dp", *columns[i:]]


def enumerate_candidates(base: dict, s: Scenario, gpus: int, stats: WorkloadStats,
                         objective: str, jobs: int | None = 1, disagg: bool = False,
                         cross: CrossPairs | None = None) -> pd.DataFrame:
    """Every layout of at most ``gpus`` GPUs x every engine limit: built (placement, fit),
    checked for a useful KV cache and estimated; ``status`` is ``feasible`` or
    ``excluded`` with the ``reason``. Sorted by the estimate (``est_rank``). Layouts are
    estimated in ``jobs`` processes (None: the CPUs); the table does not depend on it.
    With ``disagg``, every prefill + decode pool pair joins them
    (:func:`simulator.planner.disagg.disagg_rows`); with a ``[speculative]`` section,
    every layout with and without speculation (``spec_k``); with ``cross``, the pairs with
    the decode pool on another node kind (:mod:`simulator.planner.hetero`)."""
    model = load_model(s.model.name, s.base_dir)
    limits = engine_limits(s)
    probe = min(limits, key=lambda lim: (lim.budget, lim.max_num_seqs))
    positions = s.engine.max_model_len or model.max_position_embeddings
    need = useful_kv_tokens(stats, positions)
    work = [(base, s.seed, lay, limits, probe, need, stats, s.slo.ttft_s, s.slo.tpot_s,
             model.moe is not None) for lay in layouts(model, gpus)]
    workers = max(1, min(jobs or os.cpu_count() or 1, len(work)))
    if workers == 1 or len(work) < PARALLEL_LAYOUTS:
        rows = [row for job in work for row in layout_rows(job)]
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            rows = [row for part in pool.map(layout_rows, work, chunksize=4) for row in part]
    if disagg:
        rows += disagg_rows(base, s, model, gpus, stats, need, s.slo.ttft_s, s.slo.tpot_s)
    if disagg and cross is not None:
        rows += cross.rows(base, s, model, gpus, stats, need, s.slo.ttft_s, s.slo.tpot_s)
    df = pd.DataFrame(rows)
    columns = with_columns(CANDIDATE_COLUMNS, model, disagg, cross is not None)
    for c in columns:
        if c not in df:
            df[c] = math.nan
    df["chunk_size"] = df["chunk_size"].astype("Int64")
    df = rerank(df, s, stats, objective, margins(None), cross).reset_index(drop=True)
    feasible = df["status"] == "feasible"
    df["est_rank"] = pd.Series(range(1, len(df) + 1)).where(feasible).astype("Int64")
    return df[columns]


def rerank(df: pd.DataFrame, s: Scenario, stats: WorkloadStats, objective: str,
           m: dict[str, float], cross: CrossPairs | None = None,
           groups: pd.Series | None = None) -> pd.DataFrame:
    """``df`` with ``est_slo`` and ``est_objective`` at the near-miss ratios ``m``
    (:mod:`simulator.planner.nearmiss`; cross-kind pairs at each pool's own price and
    power), sorted in ranking order (index kept); ``groups``: the candidates' simulation
    groups when the caller has them (:func:`group_series`)."""
    node = load_node(s.cluster.topology, s.base_dir)
    price = gpu_hour_usd(node.gpu.name, s.cluster.gpu_hour_usd)
    df = df.copy()
    if m.get("groups"):  # once for both
        groups = groups if groups is not None else groups_of(df)
    else:
        groups = None
    df["est_slo"] = est_slo(df, s.slo, m, groups)
    p = chance(df, s.slo, m, groups)  # measured error: the likely ones first (nearmiss.order)
    if p is not None:
        df["est_chance"] = p
    df["est_objective"] = objective_values(df, objective, price, node, stats.output_mean,
                                           stats.rate_per_s)
    if cross is not None:
        df["est_objective"] = cross.values(df, objective, s, stats)
    return df.loc[est_order(df, objective, stable_key)]
