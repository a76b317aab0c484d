"""The step time the analytic estimates price a replica by: one micro-batch stream's step
from the replica's stage costs (the simulator's own cost model), and the step aggregates
of a decode batch with a prefill chunk. The planner's estimate
(:mod:`simulator.planner.estimate`) and the ``sla`` autoscaling policy's capacity
(:mod:`simulator.cluster.sizing`) both price steps with it.
"""

from __future__ import annotations

import math

from simulator.cluster.plan import ClusterPlan
from simulator.model.moe_stage import MoEStageCost


class StepModel:
    """Time of one micro-batch stream step of a replica, from its stage costs.

    Parameters
    ----------
    plan : ClusterPlan
        A built plan; the slowest replica prices the step (replicas may be placed unlike).
    overhead_s : float
        CPU time per step (``engine.step_overhead_s``).
    streams : int
        Micro-batch streams per replica (pp unless the scenario sets it).
    snap : bool, optional
        Whether token counts snap to the grid of :func:`snap` (default: for MoE stages).
    """

    def __init__(self, plan: ClusterPlan, overhead_s: float, streams: int,
                 snap: bool | None = None):
        # replicas placed alike share their cost objects: each kind is priced once
        kinds = {id(rp.stages): rp for rp in plan.replicas}
        self.replicas = [(rp.stages, rp.sends) for rp in kinds.values()]
        self.overhead_s, self.streams = overhead_s, streams
        # MoE stages price a step from a routing table per token count (cached there):
        # token counts snap to a geometric grid so that the fixed-point iterations reuse
        # the tables (see :func:`snap`), unless ``snap`` says otherwise.
        self.snap = any(isinstance(c, MoEStageCost) for stages, _ in self.replicas
                        for c in stages) if snap is None else snap

    def cycle(self, tokens: float, pairs: float, ctx: float, decode_kv: float,
              sampled: float, seqs: float = 0.0) -> float:
        """Seconds between two steps of one stream (``seqs``: the prefill kernel's
        sequences where known, as in :meth:`simulator.model.cost.StageCost.step`).

        Notes
        -----
        latency = overhead + sum_i stage_i + sum_i send_i (one stream's step end to end).
        With M streams over P stages the streams are taken to advance in rounds, each round
        a GPipe fill and drain: ``cycle = overhead + sends + (M + P - 1) * max_i stage_i``
        (and at least the latency). The simulator overlaps rounds better (its bubble is
        below (P-1)/(M+P-1)), so this is pessimistic for PP; for P = M = 1 it is exact.
        """
        t = snap(tokens) if self.snap else max(1, round(tokens))
        worst = 0.0
        for stages, sends in self.replicas:
            times = [sum(c.step(t, pairs, ctx, round(decode_kv), max(0, round(sampled)),
                                max(0, round(seqs)))) for c in stages]
            fixed = self.overhead_s + sum(lat + t * per for lat, per in sends)
            rounds = fixed + (self.streams + len(stages) - 1) * max(times)
            worst = max(worst, fixed + sum(times), rounds)
        return worst


#: Relative step of the token grid of MoE estimates (:func:`snap`).
SNAP_STEP = 0.02


def snap(tokens: float) -> int:
    """``tokens`` rounded to the nearest point of the grid ``round((1 + SNAP_STEP)^k)``
    (exact below 50 tokens; at most 1% off above): the estimate ranks, it need not
    price every token count."""
    t = max(1.0, float(tokens))
    if t < 50:
        return max(1, round(t))
    k = round(math.log(t) / math.log1p(SNAP_STEP))
    return round(math.exp(k * math.log1p(SNAP_STEP)))


def step_mix(batch: float, prefill: float, prompt: float, output: float) -> tuple:
    """Step aggregates of ``batch`` decoding sequences at mean context ``prompt + output/2``
    plus ``prefill`` prompt tokens. Pairs: a chunk of x tokens of a P-token prompt, after
    (P - x)/2 cached ones on average, has x(P + 1)/2 causal pairs (also for x > P whole
    prompts)."""
    ctx = batch * (prompt + output / 2)
    pairs = prefill * (prompt + 1) / 2
    cached = max(0.0, prompt - prefill) / 2 if prefill else 0.0
    sampled = batch + (prefill / prompt if prefill else 0.0)
    return batch + prefill, pairs, cached, ctx, sampled
