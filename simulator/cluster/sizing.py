"""What one replica serves within the SLOs, from the step cost model: the capacity the
``sla`` autoscaling policy sizes a deployment with when ``replica_capacity_per_s`` is not
set (docs/autoscaling.md).

It is the planner's analytic estimate (docs/planner.md, "The estimate") for one replica,
solved the other way round: instead of the latencies at an offered rate, the highest rate
whose estimated latencies meet the SLOs. Computed once per run, before the first request,
from the run's own requests (their mean prompt and output lengths).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simulator.cluster.build import ClusterPlan
from simulator.cluster.stepmodel import StepModel, step_mix

#: Fixed-point iterations for the steady batch, and bisection steps for the rate.
ITERATIONS = 60
BISECTIONS = 40
#: The TTFT percentile the policy corrects by is the p90: the M/D/1 wait's p90 is about
#: ln(10) times its mean (exponential tail).
LN10 = math.log(10.0)


@dataclass(frozen=True)
class Sizing:
    """One replica's estimated capacity (requests/s): the throughput bound, and the highest
    rate within both SLOs (``slo_met`` False: not even a light load meets them, and
    ``capacity_per_s`` is then the throughput bound)."""

    bound_per_s: float
    capacity_per_s: float
    slo_met: bool


def replica_sizing(plan: ClusterPlan, prompt_mean: float, output_mean: float,
                   ttft_slo_s: float, tpot_slo_s: float) -> Sizing:
    """One replica's capacity within the SLOs, from the step cost model.

    Parameters
    ----------
    plan : ClusterPlan
        The run's plan: the replica's stage costs, the engine's limits and KV cache.
    prompt_mean, output_mean : float
        Mean prompt and output tokens of the workload.
    ttft_slo_s, tpot_slo_s : float
        The SLOs: the TTFT p90 and the TPOT the rate must keep.

    Notes
    -----
    Per stream (M streams per replica), mean prompt P and output O, token budget T: a
    stream holding B decoding sequences also prefills ``x = min(B P / O, T - B)`` tokens
    per step on average in chunks of ``c = min(max(P, x), T - B)``, so a step takes
    ``cycle(B) = t(B, 0) + x / c (t(B, c) - t(B, 0))``. With ``B_max = min(max_num_seqs,
    KV tokens / M / (P + O/2))`` the throughput bound is ``X = M min(B_max / O, (T - B_max)
    / P) / cycle(B_max)``. At a rate lambda the batch solves Little's law
    ``B = lambda / M O cycle(B)``; then TPOT = cycle(B) and TTFT p90 = prefill(P) + cycle(B)
    + ln(10) W, the M/D/1 wait ``W = rho / (2 (1 - rho)) prefill(P)``, rho = lambda / X.
    Both grow with lambda, so the capacity within the SLOs is found by bisection on
    (0, X). Speculative decoding and prefix-cache hits are not counted: set
    ``replica_capacity_per_s`` for those.
    """
    eng = plan.scenario.engine
    # With cpu_overlap the CPU time is a floor inside stage 0 (cluster/build.py).
    model = StepModel(plan, 0.0 if eng.cpu_overlap else eng.step_overhead_s,
                      plan.streams_per_replica, snap=False)
    m = model.streams
    p, o = max(float(prompt_mean), 1.0), max(float(output_mean), 1.0)
    budget = float(eng.max_num_batched_tokens)

    def cycle(batch: float, chunk: float) -> float:
        return model.cycle(*step_mix(batch, chunk, p, o))

    def steady(batch: float) -> float:
        room = max(budget - batch, 1.0)
        prefill = min(batch * p / o, room)
        chunk = min(max(p, prefill), room)
        base = cycle(batch, 0.0)
        return base + prefill / chunk * (cycle(batch, chunk) - base)

    b_max = max(1.0, min(eng.max_num_seqs, plan.memory.kv_tokens / m / (p + o / 2)))
    bound = m * min(b_max / o, max(budget - b_max, 0.0) / p) / steady(b_max)

    def meets(rate: float) -> bool:
        batch = 1.0
        for _ in range(ITERATIONS):
            new = min(b_max, max(1.0, rate / m * o * steady(batch)))
            if abs(new - batch) < 1e-3:
                break
            batch = 0.5 * (batch + new)
        c = steady(batch)
        room = max(budget - batch, 1.0)
        prefill = math.ceil(p / room) * cycle(batch, min(p, room))
        rho = rate / bound
        wait = rho / (2 * (1 - rho)) * prefill if rho < 1 else math.inf
        return c <= tpot_slo_s and prefill + c + LN10 * wait <= ttft_slo_s

    if not bound > 0 or not meets(bound * 1e-6):
        return Sizing(bound, bound, False)
    lo, hi = bound * 1e-6, bound
    for _ in range(BISECTIONS):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if meets(mid) else (lo, mid)
    return Sizing(bound, lo, True)


def sizing_of_requests(plan: ClusterPlan, requests, ttft_slo_s: float,
                       tpot_slo_s: float) -> Sizing:
    """:func:`replica_sizing` at the mean lengths of ``requests`` (a table with
    ``prompt_tokens`` and ``output_tokens``)."""
    prompt = float(np.mean(requests["prompt_tokens"])) if len(requests) else 1.0
    output = float(np.mean(requests["output_tokens"])) if len(requests) else 1.0
    return replica_sizing(plan, prompt, output, ttft_slo_s, tpot_slo_s)
