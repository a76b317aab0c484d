"""Fast analytic estimate of a candidate (layout + engine limits) from the step cost model:
the throughput bound, the steady-state batch at the offered load, TTFT and TPOT.

It only ranks candidates before the simulation; the simulation decides. What it models and
what it does not is listed in docs/planner.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from simulator.cluster.build import ClusterPlan
from simulator.cluster.stepmodel import StepModel, step_mix
from simulator.planner.space import Limits, WorkloadStats

#: Fixed-point iterations for the steady-state batch.
ITERATIONS = 60


@dataclass(frozen=True)
class Estimate:
    """Estimated figures of one candidate (columns ``est_*`` of candidates.csv)."""

    capacity_req_per_s: float  # throughput bound of all replicas
    utilization: float  # offered rate / capacity (>= 1: queues grow)
    batch: float  # running sequences per stream at the offered load
    cycle_s: float  # one stream step at that batch: one output token per sequence
    prefill_s: float  # a mean prompt's prefill steps
    ttft_s: float
    ttft_p99_s: float
    tpot_s: float
    goodput_req_per_s: float  # min(offered, capacity) when both SLOs hold, else 0

    def as_row(self) -> dict:
        return {f"est_{k}": v for k, v in self.__dict__.items()}


#: Standard normal quantile of the p99, for the decode batch's tail (:func:`batch_p99`).
Z_P99 = 2.326


def batch_p99(batch: float, b_max: float) -> float:
    """Sequences in the decode steps of the p99 request at a mean batch ``batch`` per
    stream (Little's law), at most ``b_max``.

    Notes
    -----
    Requests arrive as a Poisson stream and each holds a slot for its O / g steps, so the
    sequences of a stream are the occupancy of an M/G/inf queue: Poisson with mean
    ``batch``. A request shares each step with itself and the others it finds (PASTA), so
    the p99 request's steps hold ``1 + batch + Z_P99 sqrt(batch)`` sequences (normal
    approximation of the Poisson quantile). That is the spread at an instant, which short
    replies (those that set the p99 TPOT) see; a reply as long as the others averages
    over its life, variance ``2 batch / 3`` for equal lives (overlap ``T - |u|`` of two
    lives ``T`` apart by ``u``: ``lambda int (T - |u|)^2 du / T^2``).
    """
    return min(b_max, 1.0 + batch + Z_P99 * math.sqrt(max(batch, 0.0)))


def estimate(plan: ClusterPlan, limits: Limits, kv_tokens: int, stats: WorkloadStats,
             ttft_slo_s: float, tpot_slo_s: float, spec: SpecStep | None = None
             ) -> Estimate:
    """Estimate one candidate at the workload's offered load.

    Parameters
    ----------
    plan : ClusterPlan
        The built layout (stage costs, sends, replicas).
    limits : Limits
        Engine limits of the candidate.
    kv_tokens : int
        KV cache tokens per replica at these limits.
    stats : WorkloadStats
        Offered rate (or closed-loop concurrency) and mean lengths.
    ttft_slo_s, tpot_slo_s : float
        SLO targets (an estimate that misses them has no goodput).
    spec : SpecStep, optional
        Speculative decoding: every decode step drafts and verifies ``k + 1`` tokens per
        sequence and yields ``1 + a`` tokens (:class:`SpecStep`).

    Notes
    -----
    Per stream (M = streams per replica, R = dp replicas), with mean prompt P and output O:
    a stream holds B decoding sequences; steps also prefill ``x = min(B P / O, budget - B)``
    tokens on average to replace finished ones, in chunks of ``c = min(max(P, x), budget -
    B)`` tokens, so ``cycle(B) = t(B, 0) + x / c * (t(B, c) - t(B, 0))`` with t(B, c) the
    step of B decodes and a c-token chunk (:meth:`StepModel.cycle`). The cap
    ``B_max = min(max_num_seqs, kv_tokens / M / (P + O/2))`` gives the capacity
    ``X = R M min(B_max / O, (budget - B_max) / P) / cycle(B_max)``. At offered rate lambda
    the batch solves Little's law ``B = lambda / (R M) * O * cycle(B)`` (fixed point).
    TPOT = cycle(B). TTFT = prefill(P) + cycle/2 + W with the M/D/1 wait
    ``W = rho / (2 (1 - rho)) * prefill(P)``, rho = lambda / X; the p99 uses the p99
    prompt and ``4.6 W`` (exponential tail, ln 100). rho >= 1 gives infinite TTFT.
    """
    eng = plan.scenario.engine
    streams = plan.streams_per_replica
    lanes = plan.scenario.parallel.dp * streams
    # With cpu_overlap the CPU time is a floor inside stage 0 (cluster/build.py), not added.
    model = StepModel(plan, 0.0 if eng.cpu_overlap else eng.step_overhead_s, streams)
    p, o = max(stats.prompt_mean, 1.0), max(stats.output_mean, 1.0)
    budget = limits.budget

    def gain(batch: float) -> float:
        return spec_gain(spec, batch, budget)

    def cycle(batch: float, prefill: float) -> float:
        return decode_cycle(model, spec, batch, prefill, p, o, budget)

    def steady(batch: float) -> tuple[float, float]:
        """Mean prefill tokens per step and mean cycle: prefill comes in chunks (a prompt,
        up to the room left in the budget), so a fraction x / chunk of the steps carry
        one and the rest decode only."""
        room = max(budget - batch * (drafts_per_step(spec, batch, budget) + 1), 1.0)
        prefill = min(batch * p * gain(batch) / o, room)
        chunk = min(max(p, prefill), room)
        base = cycle(batch, 0.0)
        return prefill, base + prefill / chunk * (cycle(batch, chunk) - base)

    b_max = max(1.0, min(limits.max_num_seqs, kv_tokens / streams / (p + o / 2)))
    _, c_max = steady(b_max)
    per_step = min(b_max * gain(b_max) / o,
                   max(budget - b_max * (drafts_per_step(spec, b_max, budget) + 1), 0.0) / p)
    capacity = lanes * per_step / c_max

    if stats.rate_per_s is None:  # closed loop: the clients fix the batch
        batch = min(b_max, max(1.0, (stats.concurrency or 1) / lanes))
        _, c = steady(batch)
        rate = lanes * batch * gain(batch) / (o * c)
    else:
        rate = stats.rate_per_s
        batch = little_batch(rate, lanes, o, b_max, gain, lambda b: steady(b)[1])
    _, c = steady(batch)
    rho = rate / capacity if capacity > 0 else math.inf

    def prefill_time(prompt: float) -> float:
        room = max(budget - batch * (drafts_per_step(spec, batch, budget) + 1), 1.0)
        chunk = min(prompt, room)
        return math.ceil(prompt / room) * model.cycle(*step_mix(batch, chunk, prompt, o))

    pre, pre_p99 = prefill_time(p), prefill_time(max(stats.prompt_p99, p))
    if rho < 1 and stats.rate_per_s is not None:
        wait = rho / (2 * (1 - rho)) * pre
        slot, slot_p99 = slot_wait(rate / plan.scenario.parallel.dp,
                                   int(streams * b_max), pre + o / gain(batch) * c)
    else:
        wait = 0.0 if stats.rate_per_s is None else math.inf
        slot = slot_p99 = 0.0
    ttft = pre + c / 2 + wait + slot
    ttft_p99 = pre_p99 + c + 4.6 * wait + slot_p99
    tpot = c / gain(batch)
    ok = rho < 1 and ttft_p99 <= ttft_slo_s and tpot <= tpot_slo_s
    if stats.rate_per_s is None:
        ok = ttft_p99 <= ttft_slo_s and tpot <= tpot_slo_s
    goodput = min(rate, capacity) if ok else 0.0
    return Estimate(capacity, rho, batch, c, pre, ttft, ttft_p99, tpot, goodput)


#: Spare sequence slots, in standard deviations of the busy ones, past which the wait for
#: a slot is taken as none (Halfin-Whitt: the chance of waiting is then below 1e-3).
SLOT_SPARE_SD = 4.0


def slot_wait(rate: float, slots: int, service_s: float) -> tuple[float, float]:
    """Mean and p99 wait (s) of a request for one of a replica's ``slots`` running
    sequences, requests arriving at ``rate`` (req/s) and each holding a slot for
    ``service_s`` (its prefill and decode steps).

    Notes
    -----
    An M/M/c queue, c = ``slots`` (the batch cap, max_num_seqs or what the KV cache holds):
    with ``a = rate x service_s`` busy slots on average, the chance of waiting is Erlang's
    C formula, ``C = c B / (c - a (1 - B))`` with B the Erlang B loss from the recursion
    ``B_k = a B_(k-1) / (k + a B_(k-1))``; the wait is exponential given that it waits,
    at rate ``c / service_s - rate``, so the mean is ``C / (c / service_s - rate)`` and the
    p99 ``ln(C / 0.01) / (c / service_s - rate)`` (0 when C <= 0.01). ``a >= c``: infinite.
    Beyond ``SLOT_SPARE_SD`` standard deviations of spare slots it is taken as 0.
    """
    a = rate * service_s
    if slots < 1 or a >= slots:
        return math.inf, math.inf
    if a <= 0 or (slots - a) > SLOT_SPARE_SD * math.sqrt(a):
        return 0.0, 0.0
    b = 1.0
    for k in range(1, slots + 1):
        b = a * b / (k + a * b)
    c = slots * b / (slots - a * (1 - b))
    drain = slots / service_s - rate
    return c / drain, (math.log(c / 0.01) / drain if c > 0.01 else 0.0)


@dataclass(frozen=True)
class SpecStep:
    """What the estimate needs of speculative decoding: ``k`` drafts per sequence and step,
    ``accepted`` the mean drafts accepted (E[A] of the acceptance model), ``draft(n,
    sum_kv, k)`` the drafting seconds (:class:`simulator.model.speculative.DraftCost`) and
    the batch from which the engine stops speculating."""

    k: int
    accepted: float
    draft: Callable[[int, int, int], float]
    disable_by_batch_size: int | None = None


def spec_step(model: StepModel, spec: SpecStep, batch: float, prefill: float,
              prompt: float, output: float) -> float:
    """Seconds of one speculative stream step: drafting, then one forward verifying ``k + 1``
    positions of each of ``batch`` sequences (a prefill-like shape after their KV) plus
    ``prefill`` prompt tokens, as :class:`simulator.engine.speculative.SpeculativeDecodeSet`
    builds it.

    Notes
    -----
    With ``kv = batch (P + O/2)`` the decoders' KV: tokens ``batch (k + 1) + x``, causal
    pairs ``pairs(x) + (k + 1) kv + batch (k + 1)(k + 2) / 2``, cached ``cached(x) + kv``,
    sampled ``batch (k + 1) + x / P`` by ``batch + x / P`` sequences; draft time ``draft(batch,
    kv, k)``.
    """
    k = spec.k
    tokens, pairs, cached, kv, sampled = step_mix(batch, prefill, prompt, output)
    tokens += batch * k
    pairs += (k + 1) * kv + batch * (k + 1) * (k + 2) / 2
    n = max(1, round(batch))
    return (model.cycle(tokens, pairs, cached + kv, 0.0, sampled + batch * k, sampled)
            + spec.draft(n, round(kv), k))


def drafts_per_step(spec: SpecStep | None, batch: float, budget: int) -> int:
    """Drafts per sequence of a step of ``batch`` decoders: 0 without speculation and where
    the engine decodes plainly (``disable_by_batch_size``, or ``batch (k + 1)`` over the
    token budget ``budget``), else ``k``."""
    if spec is None or batch * (spec.k + 1) > budget or (
            spec.disable_by_batch_size is not None and batch >= spec.disable_by_batch_size):
        return 0
    return spec.k


def spec_gain(spec: SpecStep | None, batch: float, budget: int) -> float:
    """Output tokens per sequence of a step of ``batch`` decoders: ``1 + E[A]`` (the mean
    drafts accepted) while speculating (:func:`drafts_per_step`), else 1."""
    return 1.0 + spec.accepted if drafts_per_step(spec, batch, budget) else 1.0


def decode_cycle(model: StepModel, spec: SpecStep | None, batch: float, prefill: float,
                 prompt: float, output: float, budget: int) -> float:
    """Seconds of one stream step of ``batch`` decoders plus ``prefill`` prompt tokens:
    :func:`spec_step` while speculating (:func:`drafts_per_step`), else the plain step
    (:meth:`StepModel.cycle` of :func:`step_mix`)."""
    if drafts_per_step(spec, batch, budget):
        return spec_step(model, spec, batch, prefill, prompt, output)
    return model.cycle(*step_mix(batch, prefill, prompt, output))


def little_batch(rate: float, lanes: int, output: float, b_max: float,
                 gain: Callable[[float], float], cycle: Callable[[float], float]) -> float:
    """Sequences per stream at the offered ``rate`` (req/s) over ``lanes`` streams: the
    fixed point of Little's law ``B = rate / lanes * (output / gain(B)) * cycle(B)``
    (``output / gain`` steps per request of ``cycle(B)`` seconds each), in [1, ``b_max``],
    by damped iteration (at most ITERATIONS, to within 1e-3)."""
    batch = 1.0
    for _ in range(ITERATIONS):
        new = min(b_max, max(1.0, rate / lanes * output / gain(batch) * cycle(batch)))
        if abs(new - batch) < 1e-3:
            break
        batch = 0.5 * (batch + new)
    return batch
