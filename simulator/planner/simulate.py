"""Simulate candidates (resolved scenario dicts) in a process pool and reduce each run to the
row the planner ranks: latency quantiles, throughput per GPU, whether the SLOs hold and
whether the layout keeps up with the offered load; and the scenario dict every candidate
starts from (:func:`base_scenario`; :func:`without_pools` turns a scenario's ``[[pools]]``
into the nodes the search lays its own layouts on).

A run that the cluster build refuses (a ScenarioError) becomes a row with ``status =
"error"`` and the message; any other exception is a bug and propagates.

What a plan shows while it runs, and how it stops on Ctrl-C: :class:`Progress` is one
line on the terminal's stderr (tqdm; nothing when stderr is not a terminal, nor when
``show`` is false): candidates estimated, simulations done / planned,
best so far. :func:`collect` gathers simulation rows as they finish and turns Ctrl-C into a
flag, so that the plan ends with what it knows; the workers are stopped by closing the
stream (:func:`simulator.sweep.run_many`).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator

import numpy as np
import pandas as pd
from tqdm import tqdm

from simulator.cluster.build import ClusterPlan
from simulator.cluster.running import run
from simulator.errors import ScenarioError
from simulator.io.scenario import load_scenario, to_dict
from simulator.planner.nearmiss import attainment_half, quantile_ci
from simulator.planner.objectives import SIM_COLUMN, sim_values
from simulator.sweep import run_many

#: A layout keeps up when it generates at least this fraction of the output tokens offered
#: in the steady window (less when the run is too short to tell, see :func:`keep_up`).
KEEP_UP = 0.95
#: Fewer arrivals than this in the steady window: too few to judge keeping up.
KEEP_UP_MIN_ARRIVALS = 20
#: Share of the arrival span skipped as warm-up before the steady window.
WARMUP = 0.5


def base_scenario(scenario, overrides: list[str] | None = None,
                  requests: int | None = None, cap: int | None = None) -> dict:
    """The scenario as a dict for :func:`simulator.sweep.resolve_point`: overrides applied,
    ``workload.num_requests`` set to ``requests`` (the sample simulated, above the
    scenario's own count too) or, without it, the scenario's count capped at ``cap``; no
    per-step records (not needed)."""
    s = load_scenario(scenario, overrides=overrides)
    data = to_dict(s)
    data["_base_dir"], data["_source"] = s.base_dir, s.source
    if requests is not None:
        if requests < 1:
            raise ScenarioError(f"--requests: must be >= 1, got {requests}")
        data["workload"]["num_requests"] = requests
    elif cap is not None:
        n = data["workload"].get("num_requests")
        data["workload"]["num_requests"] = min(n, cap) if n else cap
    data["output"] = {**data.get("output", {}), "steps": False, "trace": False}
    return data


def own_pools(pools) -> list:
    """The pools that bring their own nodes, those not sharing another's: a scenario dict's
    pools without a ``same_nodes_as`` key, or pool specs whose ``same_nodes_as`` is None.
    A pool that shares another's nodes is on that pool's preset (the pools builder refuses
    any other), so only these name presets and count nodes."""
    return [p for p in pools
            if ("same_nodes_as" not in p if isinstance(p, dict) else p.same_nodes_as is None)]


def without_pools(base: dict) -> dict:
    """A scenario dict without its ``[[pools]]``: the search's budget is the nodes of its
    pools (those not sharing another's) as ``[cluster]`` topology and nodes.

    Raises
    ------
    ScenarioError
        The pools use several node presets (the search takes one).
    """
    pools = base.pop("pools", None)
    if pools:
        own = own_pools(pools)
        tops = {p.get("topology", base["cluster"]["topology"]) for p in own}
        if len(tops) > 1:
            raise ScenarioError(f"plan: the pools use several node presets "
                                f"({', '.join(sorted(tops))}); the search takes one "
                                f"(set [cluster] topology and nodes, without pools)")
        base["cluster"] = {**base["cluster"], "topology": tops.pop(),
                           "nodes": sum(p.get("nodes", 1) for p in own)}
    return base


def placement_text(plan: ClusterPlan) -> str:
    """Where each replica runs: ``r0 n0:0-3>n1:8-11; r1 ...`` (node: GPU indices per
    stage, ``>`` between pipeline stages)."""
    g = plan.graph
    parts = []
    for rp in plan.replicas:
        stages = []
        for group in rp.placement.stages:
            idx = sorted(g.nodes[x]["index"] for x in group)
            nodes = sorted({g.nodes[x]["node"] for x in group})
            if len(idx) == 1:
                span = str(idx[0])
            elif idx == list(range(idx[0], idx[-1] + 1)):
                span = f"{idx[0]}-{idx[-1]}"
            else:
                span = ",".join(map(str, idx))
            stages.append(f"n{'+n'.join(map(str, nodes))}:{span}")
        parts.append(f"r{rp.placement.replica} " + ">".join(stages))
    return "; ".join(parts)


def quantile_or_inf(values: np.ndarray, q: float) -> float:
    """The q-quantile, where inf entries (requests that never got there) count as misses."""
    if len(values) == 0:
        return math.inf
    return float(np.quantile(values, q, method="higher"))


def keep_up(requests: pd.DataFrame) -> tuple[float, float, float]:
    """Whether the run kept up with its arrivals: ``(ratio, least, tok_per_s)``, the output
    tokens generated in the steady window over the output tokens of the requests that
    arrived in it, the least ratio that counts as keeping up, and the tokens generated per
    second in the window (the steady throughput); nan when fewer than
    ``KEEP_UP_MIN_ARRIVALS`` arrive in the window.

    Notes
    -----
    The window is ``[t0 + WARMUP * (t1 - t0), t1]``, t0 and t1 the first and last arrival,
    so the drain after the last arrival does not count. The run must be long enough for
    the warm-up to hold the median end-to-end latency of the requests that arrive in it
    (a system starting empty generates below its steady rate for about that long); else
    nan: too short to judge. A request generates its first
    token at first_token_s and the other ``output - 1`` evenly until finish_s; its share
    inside the window counts. A stable layout generates tokens as fast as they are
    offered (ratio near 1); past capacity it generates at its service rate, ratio about
    mu / lambda, and queues grow without bound. Tokens rather than requests: a request
    count lags by the end-to-end latency and its long tail, tokens flow as generated.
    The offered tokens of a finite window scatter (a compound Poisson sum, relative
    deviation ``sqrt(sum o_i^2) / sum o_i``), so the least ratio is
    ``1 - max(1 - KEEP_UP, 2 sqrt(sum o_i^2) / sum o_i)``.
    """
    t = requests["arrival_s"].to_numpy(dtype=float)
    if len(t) == 0:
        return math.nan, math.nan, math.nan
    t0, t1 = t.min(), t.max()
    lo = t0 + WARMUP * (t1 - t0)
    inside = (t >= lo) & (t <= t1)
    if int(inside.sum()) < KEEP_UP_MIN_ARRIVALS or t1 <= lo:
        return math.nan, math.nan, math.nan
    done = (requests["status"] == "completed").to_numpy()
    out = requests["output_tokens"].to_numpy(dtype=float)
    first = requests["first_token_s"].to_numpy(dtype=float)[done]
    finish = requests["finish_s"].to_numpy(dtype=float)[done]
    early = t[done] < lo
    if not early.any() or np.median(finish[early] - t[done][early]) > lo - t0:
        return math.nan, math.nan, math.nan  # still filling up when the window opens
    span = np.maximum(finish - first, 1e-12)
    overlap = np.clip(np.minimum(finish, t1) - np.maximum(first, lo), 0.0, None)
    generated = float(((out[done] - 1) * overlap / span).sum()
                      + ((first >= lo) & (first <= t1)).sum())
    offered = out[inside]
    least = 1.0 - max(1.0 - KEEP_UP, 2.0 * math.sqrt(float((offered**2).sum()))
                      / float(offered.sum()))
    return generated / float(offered.sum()), least, generated / (t1 - lo)


def simulate(resolved: dict, quantile: float = 0.99) -> dict:
    """Run one candidate and reduce it to a planner row (never writes files).

    Notes
    -----
    TTFT at the quantile counts requests that did not complete as infinitely late; TPOT
    counts one-token replies as met (as goodput does). Throughput and goodput are steady
    state, so that the drain after the last arrival (the longest request's latency, which
    dominates a short run's span) does not rank layouts: ``throughput_tok_per_s`` = output
    tokens generated per second in the steady window (:func:`keep_up`), and
    ``goodput_req_per_s = offered * slo_attainment * k``, k = 1 when the run keeps up
    and the keep-up ratio when it falls behind (:func:`keep_up`), offered =
    ``(n - 1) / (last arrival - first arrival)``. A run too short for the window falls back
    to ``offered * slo_attainment`` and the run summary's token rate (over first arrival
    to last completion).
    """
    try:
        # Step records only when the plan asks for energy (tokens_per_joule).
        wants = bool(resolved.get("output", {}).get("steps", False))
        sc = load_scenario(resolved)
        result = run(sc, keep_steps=wants, energy=wants)
    except ScenarioError as exc:
        return {"status": "error", "error": exc.render().replace("\n", "; ")}
    s, req = result.summary, result.requests
    done = req["status"] == "completed"
    ttft = np.where(done, req["ttft_s"].to_numpy(dtype=float), math.inf)
    tpot = np.where(done, req["tpot_s"].fillna(0.0).to_numpy(dtype=float), math.inf)
    gpus = s["gpus"]
    ratio, least, tok_s = keep_up(req)
    t = req["arrival_s"].to_numpy(dtype=float)
    offered = (len(t) - 1) / (t.max() - t.min()) if len(t) > 1 and t.max() > t.min() \
        else math.nan
    if math.isfinite(ratio):
        goodput = offered * s["slo_attainment"] * (1.0 if ratio >= least else ratio)
    else:  # too short to judge: taken as keeping up
        goodput, tok_s = offered * s["slo_attainment"], s["throughput_tok_per_s"]
    tpot50 = s["tpot_p50_s"]
    row = {"status": "ok", "error": "", "gpus": gpus,
           "ttft_p50_s": s["ttft_p50_s"], "ttft_p99_s": s["ttft_p99_s"],
           "tpot_p50_s": tpot50, "tpot_p99_s": s["tpot_p99_s"],
           "ttft_q_s": quantile_or_inf(ttft, quantile),
           "tpot_q_s": quantile_or_inf(tpot, quantile),
           "throughput_tok_per_s": tok_s, "throughput_tok_per_s_per_gpu": tok_s / gpus,
           "tok_per_s_per_user": 1.0 / tpot50 if tpot50 and tpot50 > 0 else math.nan,
           "offered_req_per_s": offered,
           "throughput_req_per_s": s["throughput_req_per_s"],
           "goodput_req_per_s": goodput, "goodput_req_per_s_per_gpu": goodput / gpus,
           "slo_attainment": s["slo_attainment"],
           "keep_up_ratio": ratio, "keep_up_least": least,
           "requests_completed": s["requests_completed"], "requests_total": s["requests_total"],
           "queue_p99_s": s["queue_p99_s"], "preemptions_total": s["preemptions_total"],
           "kv_tokens_per_replica": s["kv_tokens_per_replica"],
           "pp_bubble_fraction": s["pp_bubble_fraction"],
           "placement": placement_text(result.plan),
           "wall_time_s": s["wall_time_s"]}
    row.update(sim_values(row, s))
    row.update(intervals(req, ttft, tpot, quantile, sc.slo.ttft_s, sc.slo.tpot_s,
                         row["goodput_req_per_s_per_gpu"], s["slo_attainment"]))
    return row


def intervals(req: pd.DataFrame, ttft: np.ndarray, tpot: np.ndarray, q: float,
              ttft_s: float, tpot_s: float, goodput_per_gpu: float,
              attainment: float) -> dict:
    """95% intervals of a run's TTFT and TPOT q-quantiles and the half-width of its
    goodput per GPU and per dollar (the attainment's, scaled), by sectioning in arrival
    order (:mod:`simulator.planner.nearmiss`)."""
    order = np.argsort(req["arrival_s"].to_numpy(dtype=float), kind="stable")
    out = {}
    for name, v in (("ttft", ttft), ("tpot", tpot)):
        out[f"{name}_slo_q_lo_s"], out[f"{name}_slo_q_hi_s"] = quantile_ci(v[order], q)
    meets = (ttft <= ttft_s) & (tpot <= tpot_s)
    half = attainment_half(meets[order])
    scale = goodput_per_gpu / attainment if attainment > 0 else math.nan
    out["goodput_req_per_s_per_gpu_ci_half"] = half * scale
    return out


def _one(job: tuple[dict, float]) -> dict:
    resolved, quantile = job
    return simulate(resolved, quantile)


def simulate_many(jobs: dict, quantile: float = 0.99, workers: int | None = None,
                  backend: str = "local", address: str | None = None) -> Iterator[tuple]:
    """Simulate ``{key: resolved scenario}`` on a sweep backend
    (:func:`simulator.sweep.run_many`: ``local`` with ``workers`` processes, default the
    CPUs, 1 in this process; or ``ray``); yields ``(key, row)`` as runs finish. A row
    depends only on its scenario, so the backend and the order do not change it."""
    items = [(k, (v, quantile)) for k, v in jobs.items()]
    if not items:
        return iter(())
    workers = max(1, min(workers or os.cpu_count() or 1, len(items)))
    return run_many(_one, items, backend, workers, address)


#: The simulation column shown as "best" for the latency objectives.
LATENCY_COLUMN = {"min_ttft": "ttft_q_s", "min_tpot": "tpot_q_s"}


class Progress:
    """The plan's progress line; ``show`` false (or stderr not a terminal): silent."""

    def __init__(self, objective: str, show: bool = True) -> None:
        self.objective = objective
        self.column = SIM_COLUMN.get(objective) or LATENCY_COLUMN.get(objective,
                                                                      "goodput_req_per_s_per_gpu")
        self.lower = objective in LATENCY_COLUMN  # lower is better
        self.best = math.nan
        # disable=None: tqdm's own test, off when the stream is not a terminal
        self.bar = tqdm(total=0, unit="sim", desc="plan: estimating", file=sys.stderr,
                        disable=None if show else True, leave=False, dynamic_ncols=True)

    def estimated(self, candidates: int, feasible: int) -> None:
        self.bar.set_description_str(f"plan: {candidates} candidates estimated "
                                     f"({feasible} feasible), simulated")

    def planned(self, n: int) -> None:
        self.bar.total += n
        self.bar.refresh()

    def done(self, row: dict, met: bool) -> None:
        value = row.get(self.column, math.nan)
        if met and value == value and (self.best != self.best or (
                value < self.best if self.lower else value > self.best)):
            self.best = float(value)
        self.bar.update(1)
        if self.best == self.best:
            self.bar.set_postfix_str(f"best {self.column} {self.best:.4g}")

    def close(self) -> None:
        self.bar.close()


def collect(stream: Iterator[tuple], sims: dict, progress: Progress, meets) -> bool:
    """Put each ``(key, row)`` of ``stream`` into ``sims`` as it finishes, telling
    ``progress`` (``meets(row)``: whether it met the SLOs). Returns True when Ctrl-C
    stopped it: the stream is closed (its workers stopped) and ``sims`` holds the runs
    that finished."""
    try:
        for key, row in stream:
            sims[key] = row
            progress.done(row, meets(row))
    except KeyboardInterrupt:
        close = getattr(stream, "close", None)
        if close is not None:
            try:
                close()
            except KeyboardInterrupt:  # a second Ctrl-C while the workers stop
                pass
        return True
    return False
