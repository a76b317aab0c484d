"""The disaggregated pools' search axes (docs/planner.md, "Disaggregated layouts"): the
prefill pool's token budgets and ``max_num_seqs``, the step a prompt joins at the load and
the Pareto filter over them, the decode pool's speculation, the KV transfers' contention
on the links; used by :mod:`simulator.planner.disagg`.

And the price of a prompt's KV transfer between a prefill and a decode pool replica on a
plan's graph, alone on the links (:class:`KVPrice`); the disaggregated search
(:mod:`simulator.planner.disagg`, :mod:`simulator.planner.hetero`) adds the contention
(:func:`simulator.planner.poolaxes.kv_contended`).
"""

from __future__ import annotations

import math

import numpy as np

from simulator.cluster.build import ClusterPlan
from simulator.cluster.pools import build_plan
from simulator.cluster.stepmodel import SNAP_STEP
from simulator.cluster.transfer import kv_flows
from simulator.engine.schedulers import SCHEDULERS
from simulator.errors import ScenarioError
from simulator.io.scenario import load_scenario
from simulator.model.spec import BYTES_PER_DTYPE, ModelSpec
from simulator.parallel.collective import BANDWIDTH_EFFICIENCY, Links
from simulator.planner.candidates import point_overrides
from simulator.planner.estimate import ITERATIONS
from simulator.planner.space import PREFILL_SEQS, TOKEN_BUDGETS, Layout, Limits
from simulator.sweep import resolve_point
from simulator.topology.flows import Flow, finish_times
from simulator.topology.graph import Paths, gpu_name

#: Token budget of prefill-pool steps (the largest colocated one: prefill-only steps batch
#: whole prompts) where the budget is not searched (``sarathi``, rows without one).
PREFILL_BUDGET = max(TOKEN_BUDGETS)
#: Token budgets of the prefill pool searched (the scenario's own joins them).
PREFILL_BUDGETS = (1024, 2048, 4096, 8192, 16384)
#: Relative margin by which another ``max_num_seqs`` must beat the scenario's options
#: (:func:`pareto_limits`): the estimate's token grid.
SEQS_MARGIN = SNAP_STEP


def joined_step(step, first: float, full: float, arriving: float) -> float:
    """Mean tokens of the prefill step a prompt joins at the load (a fixed point).

    Parameters
    ----------
    step : callable
        ``step(x)``: seconds of a prefill-only step of x tokens.
    first : float
        The prompt's own tokens in its first step, ``min(P, budget)``.
    full : float
        Tokens of a full step, ``min(budget, max_num_seqs P)``.
    arriving : float
        Prompt tokens offered per second to one stream, ``lambda / (dp M) P``.

    Notes
    -----
    Prefill-only steps batch every waiting prompt up to the budget. A prompt that finds the
    stream busy (probability ``u = arriving s(x) / x``, the busy fraction of steps of x
    tokens) joins the next step with those that arrived while the step in flight ran
    (``arriving s(x)`` tokens, Poisson); one that finds it idle runs alone. So
    ``x = min(full, first + u arriving s(x))``, solved by damped iteration from ``first``.
    A bigger budget lets the step grow with the load; a smaller one caps it (more, shorter
    steps: less capacity, higher utilization).
    """
    x = first
    for _ in range(ITERATIONS):
        t = step(x)
        busy = min(1.0, arriving * t / x)
        new = min(full, first + busy * arriving * t)
        if abs(new - x) < 0.5:
            return new
        x = 0.5 * (x + new)
    return x


def pareto_budgets(sides: list) -> list:
    """``sides`` (:class:`simulator.planner.disagg.PoolSide`) without the options that
    another token budget of the same replicas (shape and dp) matches or beats on capacity,
    mean and p99 TTFT and strictly beats on one (of equal options the first stays). These
    three are all the pair takes from its prefill side, so a dropped option never ranks
    above the one that beats it."""
    groups: dict[tuple, list[tuple]] = {}
    for n, a in enumerate(sides):
        groups.setdefault((a.lay, a.dp), []).append((n, (a.capacity, -a.ttft_s,
                                                         -a.ttft_p99_s)))
    keep = []
    for n, a in enumerate(sides):
        fa = (a.capacity, -a.ttft_s, -a.ttft_p99_s)
        if not any((fb != fa or m < n) and all(x >= y for x, y in zip(fb, fa, strict=True))
                   for m, fb in groups[(a.lay, a.dp)] if m != n):
            keep.append(a)
    return keep


def pareto_limits(sides: list, seqs: int) -> list:
    """``sides`` (:class:`simulator.planner.disagg.PoolSide`, in search order) filtered
    over both prefill axes: those of the scenario's ``max_num_seqs`` ``seqs`` by
    :func:`pareto_budgets` among themselves (as before the ``max_num_seqs`` axis), then
    the options of another ``max_num_seqs`` on the Pareto front of all that beat every
    kept option of the same replicas by more than ``SEQS_MARGIN`` on capacity, mean or p99
    TTFT.

    Notes
    -----
    In the estimate a prefill step holds ``F = min(budget, max_num_seqs P)`` tokens, so a
    smaller ``max_num_seqs`` mostly repeats a smaller budget's cap (Limits(4, 16384) and
    Limits(64, 1024) both cap 256-token prompts at 1024 tokens); it differs where ``n P``
    falls between two budgets (one 1000-token prompt against a 1024-token budget: 1.3%
    less TTFT, 0.7% less capacity). Differences under the estimate's token grid
    (:data:`~simulator.planner.estimate.SNAP_STEP`, 2%) are not resolved by it, and such a
    twin would only take a simulation slot from a distinct option, so it is dropped.
    """
    own = pareto_budgets([a for a in sides if a.limits.max_num_seqs == seqs])
    m = SEQS_MARGIN

    def near(a, b) -> bool:
        """b is within the margin of a, or better, on all three figures."""
        return ((b.lay, b.dp) == (a.lay, a.dp) and b.capacity >= a.capacity * (1 - m)
                and b.ttft_s <= a.ttft_s * (1 + m) and b.ttft_p99_s <= a.ttft_p99_s * (1 + m))

    new = [a for a in pareto_budgets(sides) if a.limits.max_num_seqs != seqs
           and not any(near(a, b) for b in own)]
    keep = {id(a) for a in own + new}
    return [a for a in sides if id(a) in keep]


def prefill_limits(e) -> list[Limits]:
    """The prefill pool's engine limits searched: every budget of ``PREFILL_BUDGETS`` and
    the scenario's own with the scenario's ``max_num_seqs``, then with each other of
    ``PREFILL_SEQS`` (in this order: the first of equal options stays, and ties in the
    ranking keep it, :func:`pareto_budgets`);
    a scheduler that does not split prompts keeps budgets >= the scenario's, and
    ``sarathi`` (whose chunk size is its budget) keeps the one budget ``max(PREFILL_BUDGET,
    max_num_batched_tokens)``."""
    seqs = [e.max_num_seqs, *(n for n in PREFILL_SEQS if n != e.max_num_seqs)]
    if e.scheduler == "sarathi":
        return [Limits(n, max(PREFILL_BUDGET, e.max_num_batched_tokens)) for n in seqs]
    budgets = sorted({*PREFILL_BUDGETS, e.max_num_batched_tokens})
    if not SCHEDULERS[e.scheduler].CHUNKED:
        budgets = [b for b in budgets if b >= e.max_num_batched_tokens]
    return [Limits(n, b) for n in seqs for b in budgets]


def prefill_engine(row, e) -> dict:
    """The prefill pool's engine limits of a candidate row (``prefill_max_num_*``; a row
    without them: the scenario's ``max_num_seqs`` and ``max(PREFILL_BUDGET, budget)``)."""
    seqs, budget = row.get("prefill_max_num_seqs"), row.get("prefill_max_num_batched_tokens")
    if seqs is None or seqs != seqs or budget is None or budget != budget:
        return {"max_num_seqs": e.max_num_seqs,
                "max_num_batched_tokens": max(PREFILL_BUDGET, e.max_num_batched_tokens)}
    return {"max_num_seqs": int(seqs), "max_num_batched_tokens": int(budget)}


def spec_plan(base: dict, seed: int, lay: Layout, probe: Limits, moe: bool
              ) -> ClusterPlan | None:
    """A decode pool's replica shape ``lay`` built with the scenario's ``[speculative]``
    section (the drafter charged as the pools builder charges it), or None: no such
    section, or the shape does not build with the drafter."""
    if "speculative" not in base:
        return None
    try:
        point = resolve_point(base, point_overrides(lay, probe, moe), seed)
        return build_plan(load_scenario(point))
    except ScenarioError:
        return None


def kv_contended(alone_s: np.ndarray, latency_s: np.ndarray, rate: float | None,
                 ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Seconds of a KV transfer among the others in flight, and the transfers per second
    the links carry (both per pair).

    Parameters
    ----------
    alone_s : array
        Seconds the transfer's flows take alone on the links (latency excluded).
    latency_s : array
        The path latency (s).
    rate : float or None
        Offered requests per second (None, a closed loop: priced alone).
    ends : array
        ``min(dp_p, dp_d)``: the routers spread transfers over this many links (the ports
        of the busiest side's replicas).

    Notes
    -----
    A transfer's flows cross its prefill replica's egress and its decode replica's
    ingress (NVLink ports, NICs), which every transfer out of or into that replica shares:
    at the busiest end ``lambda / ends`` per second, each holding the links for ``T =
    alone_s``, utilization ``rho = lambda T / ends``. The links share their bandwidth
    max-min fairly among the flows in flight (:mod:`simulator.topology.flows`), i.e.
    processor sharing, whose mean response time is ``T / (1 - rho)`` (M/G/1-PS, Kleinrock
    1976, vol. 2, ch. 4): ``t_kv = T / (1 - rho) + latency``; ``rho >= 1``: the links
    cannot keep up (inf). The links' capacity is ``ends / T`` transfers per second.
    """
    alone = np.asarray(alone_s, dtype=float)
    rho = (rate or 0.0) * alone / ends
    keeps_up = rho < 1  # False also for NaN (no room for the decode replica)
    t = np.where(keeps_up, alone / (1 - np.where(keeps_up, rho, 0.0)), np.inf)
    with np.errstate(divide="ignore"):
        return t + latency_s, ends / alone


def decode_wait(rate: float | None, slots: np.ndarray, service_s: np.ndarray,
                service_cv2: float) -> np.ndarray:
    """Mean seconds a request whose prompt is prefilled waits for a decode slot (per pair).

    Parameters
    ----------
    rate : float or None
        Offered requests per second (None, a closed loop: no wait, the clients fix the
        batch).
    slots : array
        Sequences the decode pool holds at once, ``c = dp_d M_d B_max`` (``max_num_seqs``
        or the KV cache per stream, whichever binds).
    service_s : array
        Seconds a request holds its slot: its KV transfer plus its decode residence, ``S =
        t_kv + (O / g) cycle(B)`` at the batch B the pool carries.
    service_cv2 : float
        Squared coefficient of variation of S (that of the output lengths).

    Notes
    -----
    A prefilled request waits first come first served for a decode replica with a free
    sequence slot and the KV blocks of its prompt (:mod:`simulator.cluster.disagg`); the
    slot is claimed before the KV moves and freed when the request finishes. So the decode
    pool is c servers with Poisson arrivals and service S: M/G/c. Its mean wait by the
    Allen-Cunneen approximation (Allen, Probability, Statistics and Queueing Theory, 2nd
    ed., 1990, sec. 6.4): the M/M/c (Erlang C) wait times ``(1 + Cs^2) / 2``, ``W = C(c, a)
    S / (c - a) (1 + Cs^2) / 2`` with ``a = lambda S`` erlangs; ``C(c, a)`` from the Erlang
    B recursion ``B_k = a B_(k-1) / (k + a B_(k-1))``, ``C = c B_c / (c - a (1 - B_c))``.
    ``a >= c``: the slots cannot keep up (inf). The wait delays the second token, so it
    joins the TPOT as ``W / (O - 1)``; below the knee it vanishes (C falls
    exponentially in ``c - a``).
    """
    service = np.asarray(service_s, dtype=float)
    if rate is None:
        return np.zeros_like(service)
    c = np.maximum(1, np.floor(np.asarray(slots, dtype=float) + 1e-9)).astype(int)
    a = rate * service
    b = np.ones_like(a)
    for k in range(1, int(c.max()) + 1 if len(c) else 1):
        b = np.where(k <= c, a * b / (k + a * b), b)
    with np.errstate(divide="ignore", invalid="ignore"):
        erlang_c = c * b / (c - a * (1 - b))
        w = erlang_c * service / (c - a) * (1 + service_cv2) / 2
    return np.where(a < c, w, np.inf)


class KVPrice:
    """Uncontended seconds per token (and the latency) of a prompt's KV from prefill
    replica 0 to decode replica 0 as the packed placement puts them, over the plan's
    graph (cached per shape pair and decode offset)."""

    def __init__(self, cp: ClusterPlan, model: ModelSpec, kv_dtype: str):
        self.g, self.model = cp.graph, model
        self.per_node = cp.node.gpus_per_node
        self.total = sum(1 for _, d in self.g.nodes(data=True) if d.get("kind") == "gpu")
        self.paths = Paths(self.g)
        self.links = Links(self.paths)
        self.capacity = {(a, b): d["bandwidth_Bps"] * BANDWIDTH_EFFICIENCY
                         for a, b, d in self.g.edges(data=True)}
        self.kv_bytes = BYTES_PER_DTYPE[kv_dtype]
        self._cache: dict[tuple, tuple[float, float]] = {}

    def __call__(self, pre: Layout, dec: Layout, first: int) -> tuple[float, float]:
        """``(seconds_per_token, latency_s)``; nan when the decode replica has no room."""
        start = first
        if dec.tp <= self.per_node and start % self.per_node + dec.tp > self.per_node:
            start = -(-start // self.per_node) * self.per_node  # a TP group stays in a node
        key = (pre.tp, pre.pp, pre.attention_dp, dec.tp, dec.pp, dec.attention_dp, start)
        if key not in self._cache:
            if start + dec.tp * dec.pp > self.total:
                self._cache[key] = (math.nan, math.nan)
            else:
                src = [[gpu_name(j * pre.tp + i) for i in range(pre.tp)]
                       for j in range(pre.pp)]
                dst = [[gpu_name(start + j * dec.tp + i) for i in range(dec.tp)]
                       for j in range(dec.pp)]
                flows = kv_flows(self.model, self.kv_bytes, src, dst,
                                 0 if pre.attention_dp else None,
                                 0 if dec.attention_dp else None)
                alone = finish_times([Flow(self.links(a, b), x) for a, b, x in flows],
                                     self.capacity)
                self._cache[key] = (float(np.max(alone)),
                                    max(self.paths.latency(a, b) for a, b, _ in flows))
        return self._cache[key]
