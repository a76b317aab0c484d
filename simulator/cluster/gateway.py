"""The gateway in front of the replicas: request classes, admission control, flow control.

As llm-d's inference gateway runs it (flow control in front of the endpoint picker):

- **Classes.** ``[[gateway.classes]]`` name request classes (``critical``, ``standard``,
  ``batch``, ``sheddable``, ...) with a ``priority`` (0 is served first), the ``share`` of
  the traffic that is theirs (each request draws its class from the shares, and a tenant
  uniformly among ``gateway.tenants``), their own SLOs, an optional ``deadline_s`` (a request
  still held at the gateway that long after arriving expires: ``dropped``) and whether they
  are ``sheddable``.
- **Admission.** A token bucket per class (``rate_per_s``, ``burst``): a request that finds
  its bucket empty is shed if its class is sheddable (``rejected``), else it waits at the
  gateway like a saturated one.
- **Flow control.** A replica is saturated when requests wait in its queue
  (``saturation_queue``, default 5) or its KV cache is ``saturation_kv`` full (default
  0.8), llm-d's saturation detector's two signals and defaults. While every replica is
  saturated, requests are held at the gateway, up to ``max_queue`` (past it the lowest
  priority sheddable request is shed); each completion dispatches the held ones, highest
  priority first, then by ``order``: ``fcfs``, ``sjf`` (fewest prompt tokens: the gateway
  does not know the output length) or ``fair`` (round robin over the tenants waiting in the
  band, llm-d's fairness policy).

Outputs: each request's ``class`` and ``tenant`` in requests.csv, and per class the
goodput, SLO attainment, shed and expired counts, and Jain's fairness index over the
tenants' served share of their offered tokens.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import pandas as pd

from simulator.errors import ScenarioError
from simulator.io.gateway import GatewaySpec, parse_gateway

#: Classes drawn from their own stream (the run's other streams are untouched).
SEED_SALT = 0x6A7E


class Gateway:
    """Admits, holds and dispatches requests in front of a cluster's router."""

    def __init__(self, env, cluster, spec: GatewaySpec, seed: int):
        self.env, self.cluster, self.spec = env, cluster, spec
        self.rng = np.random.default_rng([seed, SEED_SALT])
        share = np.array([c.share for c in spec.classes])
        self.cum = np.cumsum(share / share.sum())
        self.klass: dict[int, int] = {}
        self.tenant: dict[int, int] = {}
        self.tokens = [c.burst for c in spec.classes]
        self.refilled = [0.0] * len(spec.classes)
        prios = sorted({c.priority for c in spec.classes})
        self.bands = {p: deque() for p in prios}
        self.held = 0
        self.expired: set[int] = set()
        self._served: dict[int, float] = {}  # tenant -> when it was last dispatched
        self.admitted: set[int] = set()  # requests let through to the router

    # -- a request arrives
    def classify(self, req) -> int:
        if req.id not in self.klass:  # a retry keeps its class and tenant
            u = self.rng.random(2)
            self.klass[req.id] = int(np.searchsorted(self.cum, u[0], side="right"))
            self.klass[req.id] = min(self.klass[req.id], len(self.cum) - 1)
            self.tenant[req.id] = int(u[1] * self.spec.tenants)
        return self.klass[req.id]

    def _token(self, k: int) -> bool:
        c = self.spec.classes[k]
        if c.rate_per_s is None:
            return True
        now = self.env.now
        self.tokens[k] = min(c.burst, self.tokens[k] + (now - self.refilled[k]) * c.rate_per_s)
        self.refilled[k] = now
        if self.tokens[k] >= 1:
            self.tokens[k] -= 1
            return True
        return False

    def admit(self, req, route) -> None:
        """Route ``req`` now, hold it, or shed it (a request the gateway already let through,
        resubmitted after a failure, goes straight to the router)."""
        if req.id in self.admitted:
            route(req)
            return
        k = self.classify(req)
        c = self.spec.classes[k]
        if not self._token(k):
            if c.sheddable:
                self.cluster._drop(req, "rejected", f"shed by the gateway: class {c.name} "
                                                    "over its rate limit")
                return
            self._hold(req, k)
            return
        if self.held == 0 and not self.saturated():
            self.admitted.add(req.id)
            route(req)
            return
        self._hold(req, k)

    def saturated(self) -> bool:
        """Every serving replica is saturated (llm-d's detector: queue or KV)."""
        reps = self.cluster.serving_replicas()
        s = self.spec
        return all(sum(st.outstanding - st.running for st in r.streams) >= s.saturation_queue
                   or r.kv_used_fraction >= s.saturation_kv for r in reps)

    def _hold(self, req, k: int) -> None:
        c = self.spec.classes[k]
        if self.held >= self.spec.max_queue:
            victim = self._shed_one(c.priority)
            if victim is None:  # nothing lower to shed: this one goes if it may
                if c.sheddable:
                    self.cluster._drop(req, "rejected", "shed by the gateway: queue full")
                    return
            else:
                self.cluster._drop(victim, "rejected", "shed by the gateway: queue full")
        self.bands[c.priority].append(req)
        self.held += 1
        if c.deadline_s is not None:  # counted from the request's arrival
            left = max(0.0, c.deadline_s - (self.env.now - req.arrival_s))
            self.env.timeout(left).callbacks.append(lambda _, req=req: self._expire(req))

    def _shed_one(self, priority: int):
        for p in sorted(self.bands, reverse=True):
            if p < priority:
                break
            band = self.bands[p]
            for i in range(len(band) - 1, -1, -1):
                if self.spec.classes[self.klass[band[i].id]].sheddable:
                    req = band[i]
                    del band[i]
                    self.held -= 1
                    return req
        return None

    def _expire(self, req) -> None:
        band = self.bands[self.spec.classes[self.klass[req.id]].priority]
        try:
            band.remove(req)
        except ValueError:
            return  # dispatched (or shed) before its deadline
        self.held -= 1
        self.expired.add(req.id)
        c = self.spec.classes[self.klass[req.id]]
        self.cluster._drop(req, "dropped", f"expired at the gateway: class {c.name} "
                                           f"deadline_s = {c.deadline_s:g}")

    # -- capacity frees
    def _next(self):
        for p in sorted(self.bands):
            band = self.bands[p]
            if not band:
                continue
            order = self.spec.order
            if order == "fcfs":
                return band.popleft()
            if order == "sjf":
                i = min(range(len(band)), key=lambda j: (band[j].prompt, j))
            else:  # fair: the tenant served least recently among those waiting
                i = min(range(len(band)), key=lambda j: (self._served.get(
                    self.tenant[band[j].id], -1), j))
            req = band[i]
            del band[i]
            return req
        return None

    def dispatch(self, route) -> None:
        """Route held requests while some replica has room."""
        while self.held and not self.saturated():
            req = self._next()
            self.held -= 1
            self._served[self.tenant[req.id]] = self.env.now
            self.admitted.add(req.id)
            route(req)

    # -- outputs
    def columns(self, requests: pd.DataFrame) -> pd.DataFrame:
        """requests.csv's ``class`` and ``tenant`` columns."""
        names = np.array([c.name for c in self.spec.classes], dtype=object)
        ids = requests["request_id"].to_numpy()
        k = np.array([self.klass.get(int(i), 0) for i in ids], dtype=np.int64)
        t = np.array([self.tenant.get(int(i), 0) for i in ids], dtype=np.int64)
        return requests.assign(**{"class": names[k], "tenant": t})

    def summary(self, requests: pd.DataFrame, slo) -> dict:
        """Per class: requests, goodput (completed within the class SLOs, per second of the
        run), SLO attainment, shed and expired; Jain's index over tenants' served share."""
        out: dict = {}
        span = float(requests["finish_s"].max() - requests["arrival_s"].min()) \
            if len(requests) else 0.0
        for c in self.spec.classes:
            rows = requests[requests["class"] == c.name]
            done = rows[rows["status"] == "completed"]
            ttft = c.ttft_slo_s or slo.ttft_s
            tpot = c.tpot_slo_s or slo.tpot_s
            ok = (done["ttft_s"] <= ttft) & (done["tpot_s"].fillna(0) <= tpot)
            shed = rows["reason"].astype(str).str.startswith("shed by the gateway")
            key = f"class_{c.name}"
            out[f"{key}_requests"] = int(len(rows))
            out[f"{key}_goodput_req_per_s"] = float(ok.sum()) / span if span > 0 else 0.0
            out[f"{key}_slo_attainment"] = float(ok.sum()) / len(rows) if len(rows) else \
                math.nan
            out[f"{key}_shed"] = int(shed.sum())
            out[f"{key}_expired"] = int(rows["request_id"].isin(list(self.expired)).sum())
        offered = requests.groupby("tenant")["output_tokens"].sum()
        served = requests[requests["status"] == "completed"].groupby("tenant")[
            "output_tokens"].sum().reindex(offered.index, fill_value=0)
        x = (served / offered.where(offered > 0)).dropna().to_numpy(dtype=float)
        out["fairness_jain"] = float(x.sum() ** 2 / (len(x) * (x**2).sum())) \
            if len(x) and (x**2).sum() > 0 else math.nan
        return out


def check_gateway(table: dict | None) -> GatewaySpec | None:
    """Parse or raise: for callers outside scenario loading."""
    if table is None:
        return None
    problems: list[str] = []
    spec = parse_gateway(table, problems)
    if problems:
        raise ScenarioError(problems[0])
    return spec
