"""Autoscaling: replicas of one colocated layout added and removed while the run goes.

The cluster holds the fleet scaling may use (``parallel.dp`` replicas placed on
``cluster.nodes``); ``[autoscale]`` decides how many of them serve. A replica is in one of
four states:

- ``parked``: no GPU paid for, not routed to;
- ``starting``: its GPUs are paid for while it cold-starts: provisioning, the weights over
  the source's bandwidth, CUDA-graph capture and warm-up (:func:`cold_start_s`);
- ``serving``: the router sends it requests;
- ``draining``: scaled down: the router sends it nothing more, it finishes what it holds,
  then it is parked. No request is dropped or moved by scaling.

Every ``interval_s`` the policy looks at the interval just ended and names the replicas it
wants (the states above keep the count within ``[min_replicas, max_replicas]``):

- ``none``: the initial replicas, always.
- ``load`` (as KServe's and llm-d's autoscalers): ``desired = ceil(total metric / target)``
  over the serving replicas, the metric ``outstanding_per_replica`` (requests held),
  ``queued_per_replica`` (waiting for a first step) or ``kv_util`` (KV blocks in use, a
  fraction); it adds replicas after ``up_intervals`` consecutive intervals that want more,
  and removes them after ``down_intervals`` consecutive intervals that want fewer and in
  which the metric per replica is under ``target x scale_down_below`` (hysteresis: a load
  near the threshold does not flap).
- ``sla`` (as NVIDIA Dynamo's throughput planner): forecast the next interval's arrival
  rate from the past ones (:data:`FORECASTERS`), and size for it:
  ``desired = ceil(forecast x c / (capacity x target_utilization))``, the capacity being what
  one replica serves within the SLOs by the step cost model (:mod:`simulator.cluster.sizing`,
  once per run) unless ``replica_capacity_per_s`` sets it, with the correction
  ``c = clip(max(TTFT p90 / SLO, TPOT p90 / SLO), 1, 2)`` of the interval just
  ended: the measured over the wanted latency, which raises the count when the SLOs are
  missed at the forecast load.

Scale-ups wait ``cooldown_up_s`` after the last one; scale-downs ``cooldown_down_s`` after
any scaling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from simulator import registry
from simulator.cluster.sizing import Sizing, sizing_of_requests
from simulator.io.schema import AutoscaleKeys
from simulator.topology.graph import Paths

#: Read bandwidth of the weight sources per node (bytes/s), when the scenario sets none:
#: local NVMe (DGX H100: 8 x 3.84 TB NVMe U.2 in RAID 0, about 25 GB/s of reads), a network
#: file system over one 400 Gb/s storage NIC at half its rate (25 GB/s x 0.2 = 5 GB/s seen
#: per node under shared load), an object store (about 20 Gb/s of GETs per node: 2.5 GB/s).
#: Assumptions, stated in docs/autoscaling.md; set ``weights_bandwidth_Bps`` for yours.
SOURCE_BPS = {"nvme": 25e9, "nfs": 5e9, "object_store": 2.5e9}
STATES = ("parked", "starting", "serving", "draining")


# ----------------------------------------------------------------------------- forecasters

class Last:
    """The next interval's rate is the last one's."""

    def __init__(self, a: AutoscaleKeys):
        self.x = None

    def update(self, x: float) -> None:
        self.x = x

    def predict(self) -> float:
        return self.x or 0.0


class MovingAverage:
    """The mean of the last ``window`` intervals."""

    def __init__(self, a: AutoscaleKeys):
        self.window, self.xs = a.window, []

    def update(self, x: float) -> None:
        self.xs = (self.xs + [x])[-self.window:]

    def predict(self) -> float:
        return float(np.mean(self.xs)) if self.xs else 0.0


class HoltWinters:
    """Additive Holt-Winters: level (alpha = ``smoothing``), trend (beta =
    ``trend_smoothing``) and, with ``season_intervals`` m >= 2, a season of m intervals
    (gamma = alpha); one step ahead: level + trend + season[t + 1 - m]."""

    def __init__(self, a: AutoscaleKeys):
        self.alpha, self.beta, self.m = a.smoothing, a.trend_smoothing, a.season_intervals
        self.level = self.trend = None
        self.season = [0.0] * max(self.m, 1)
        self.t = 0

    def update(self, x: float) -> None:
        s = self.season[self.t % len(self.season)] if self.m else 0.0
        if self.level is None:
            self.level, self.trend = x, 0.0
        else:
            prev = self.level
            self.level = self.alpha * (x - s) + (1 - self.alpha) * (self.level + self.trend)
            self.trend = self.beta * (self.level - prev) + (1 - self.beta) * self.trend
        if self.m:
            self.season[self.t % self.m] = self.alpha * (x - self.level) + (1 - self.alpha) * s
        self.t += 1

    def predict(self) -> float:
        if self.level is None:
            return 0.0
        s = self.season[self.t % len(self.season)] if self.m else 0.0
        return max(0.0, self.level + self.trend + s)


class Kalman:
    """A local-level Kalman filter: the rate a random walk (process variance q) seen with
    measurement variance r; ``kalman_q_over_r`` = q / r sets how fast it follows."""

    def __init__(self, a: AutoscaleKeys):
        self.q, self.x, self.p = a.kalman_q_over_r, None, 1.0

    def update(self, z: float) -> None:
        if self.x is None:
            self.x = z
            return
        p = self.p + self.q  # predict (r = 1)
        k = p / (p + 1.0)
        self.x += k * (z - self.x)
        self.p = (1 - k) * p

    def predict(self) -> float:
        return self.x or 0.0


#: The forecasters (``[autoscale] forecaster``): the one place a forecaster is added.
FORECASTERS = registry.FORECASTERS.add({"last": Last, "moving_average": MovingAverage,
                                        "holt_winters": HoltWinters, "kalman": Kalman})


# ----------------------------------------------------------------------------- policies

@dataclass
class Observation:
    """The interval just ended, as the policy sees it."""

    serving: int  # replicas the router sends to
    arrivals_per_s: float
    metric_total: float  # the load policy's metric summed over the serving replicas
    ttft_p90_s: float = float("nan")
    tpot_p90_s: float = float("nan")


@dataclass
class LoadPolicy:
    a: AutoscaleKeys
    ups: int = 0
    downs: int = 0

    def desired(self, obs: Observation, current: int) -> int:
        want = math.ceil(obs.metric_total / self.a.target - 1e-9)
        per = obs.metric_total / max(obs.serving, 1)
        self.ups = self.ups + 1 if want > current else 0
        low = want < current and per < self.a.target * self.a.scale_down_below
        self.downs = self.downs + 1 if low else 0
        if self.ups >= self.a.up_intervals:
            self.ups = 0
            return want
        if self.downs >= self.a.down_intervals:
            self.downs = 0
            return want
        return current


@dataclass
class SlaPolicy:
    a: AutoscaleKeys
    slo_ttft_s: float
    slo_tpot_s: float
    capacity_per_s: float  # one replica's, within the SLOs
    forecaster: object = None

    def __post_init__(self):
        self.forecaster = FORECASTERS[self.a.forecaster](self.a)

    def correction(self, obs: Observation) -> float:
        ratios = [x / slo for x, slo in ((obs.ttft_p90_s, self.slo_ttft_s),
                                         (obs.tpot_p90_s, self.slo_tpot_s)) if x == x]
        return min(2.0, max(1.0, *ratios)) if ratios else 1.0

    def desired(self, obs: Observation, current: int) -> int:
        self.forecaster.update(obs.arrivals_per_s)
        need = self.forecaster.predict() * self.correction(obs)
        return math.ceil(need / (self.capacity_per_s * self.a.target_utilization) - 1e-9)


@dataclass
class NonePolicy:
    a: AutoscaleKeys

    def desired(self, obs: Observation, current: int) -> int:
        return current


# ----------------------------------------------------------------------------- cold start

def cold_start_s(a: AutoscaleKeys, plan, replica: int, peer: int | None,
                 pool=None) -> float:
    """Seconds from a scale-up decision to the router seeing replica ``replica``:
    ``provision_s + weights + graph_capture_s``. The weights: each GPU loads its own shard
    (``plan.memory.weights_per_gpu`` of its stage); from storage, the GPUs of one node share
    the node's read bandwidth; from a ``peer`` (a serving replica, NIXL-style), each GPU
    reads the matching GPU of the peer over its path in the topology graph. With ``pool``
    (a :class:`~simulator.cluster.plan.PoolPlan`), ``replica`` and ``peer`` index its
    replicas and its memory plan gives the shards; the graph is ``plan``'s."""
    group = plan if pool is None else pool
    placement = group.replicas[replica].placement
    weights = group.memory.weights_per_gpu
    shards = [(g, weights[i]) for i, stage in enumerate(placement.stages) for g in stage]
    if a.weights_from == "peer" and peer is not None:
        paths = Paths(plan.graph)
        src = group.replicas[peer].placement
        pairs = zip((g for st in src.stages for g in st), shards, strict=True)
        load = max(paths.transfer_time(s, d, w) for s, (d, w) in pairs)
    else:
        bw = a.weights_bandwidth_Bps or SOURCE_BPS.get(a.weights_from, SOURCE_BPS["nvme"])
        per_node: dict = {}
        for g, w in shards:
            node = plan.graph.nodes[g].get("node", 0)
            per_node[node] = per_node.get(node, 0.0) + w
        load = max(per_node.values()) / bw
    return a.provision_s + load + a.graph_capture_s


#: The scaling policies (``[autoscale] policy``), each made from the autoscale keys, the
#: scenario's SLOs and a function that gives one replica's capacity within them (requests/s;
#: called only by the policies that size from it): the one place a policy is added.
POLICIES = registry.AUTOSCALE_POLICIES.add({
    "none": lambda a, slo, capacity: NonePolicy(a),
    "load": lambda a, slo, capacity: LoadPolicy(a),
    "sla": lambda a, slo, capacity: SlaPolicy(a, slo.ttft_s, slo.tpot_s, capacity()),
})


# ----------------------------------------------------------------------------- the process
def capped_figures(logs) -> dict:
    """How often scaling wanted more replicas than it could start, over ``logs``
    (:class:`ScaleLog`): decisions, the first one's time, the most replicas wanted."""
    capped = [c for log in logs for c in log.capped]
    return {"autoscale_scale_ups_capped": len(capped),
            "autoscale_capped_first_s": min(t for t, _ in capped) if capped else math.nan,
            "autoscale_capped_wanted_max": max(n for _, n in capped) if capped else 0}


@dataclass
class ScaleLog:
    """What scaling did: every state change, the cold starts, GPU-seconds paid."""

    changes: list[tuple[float, int, str]] = field(default_factory=list)  # (t, replica, to)
    cold_starts_s: list[float] = field(default_factory=list)
    decisions: list[tuple[float, int, float]] = field(default_factory=list)  # (t, n, rate)
    #: Decisions that wanted more replicas than there are to start (max_replicas, or no
    #: parked replica left on the cluster's nodes): (t, replicas wanted).
    capped: list[tuple[float, int]] = field(default_factory=list)


class Autoscaler:
    """Decides every ``interval_s`` and moves replicas between the states above: every
    replica of the cluster, or with ``pool`` (a :class:`~simulator.cluster.plan.PoolPlan`
    of a disaggregated cluster) that pool's replicas, ``state[k]`` being the pool's
    replica ``k`` (cluster-wide ``pool.first_replica + k``)."""

    def __init__(self, env, cluster, a: AutoscaleKeys, slo, requests=None, pool=None):
        self.env, self.cluster, self.a, self.pool = env, cluster, a, pool
        self.sizing: Sizing | None = None  # the cost model's, when a policy asks for it
        self.first = 0 if pool is None else pool.first_replica
        n = len(cluster.replicas) if pool is None else len(pool.replicas)
        self.reps = cluster.replicas[self.first:self.first + n]
        self.max = a.max_replicas or n
        start = a.initial_replicas or a.min_replicas
        self.state = ["serving" if i < start else "parked" for i in range(n)]
        self.log = ScaleLog()
        for i in range(start):
            self.log.changes.append((0.0, i, "serving"))

        def capacity() -> float:
            if a.replica_capacity_per_s is not None:
                return a.replica_capacity_per_s
            self.sizing = sizing_of_requests(cluster.plan, requests, slo.ttft_s, slo.tpot_s)
            return self.sizing.capacity_per_s

        self.policy = POLICIES[a.policy](a, slo, capacity)
        self._capacity = capacity
        self.arrivals = 0
        self.ttfts: list[float] = []
        self.tpots: list[float] = []
        self.last_up = self.last_change = -math.inf

    # -- what the cluster asks
    def routable(self, replica) -> bool:
        return self.state[replica.index - self.first] == "serving"

    def serving(self) -> list:
        return [r for r, st in zip(self.reps, self.state, strict=True) if st == "serving"]

    def on_submit(self) -> None:
        self.arrivals += 1

    def on_finish(self, req) -> None:
        self.record(req)
        self.release(req.replica)

    def record(self, req) -> None:
        """A finished request's TTFT and TPOT, for the interval's percentiles."""
        if req.status == "completed":
            self.ttfts.append(req.first_token_s - req.arrival_s)
            if req.output > 1:
                self.tpots.append((req.finish_s - req.first_token_s) / (req.output - 1))

    def release(self, index: int) -> None:
        """Cluster-wide replica ``index`` let go of a request (or of held KV): a draining
        replica that now holds nothing is parked."""
        i = index - self.first
        if 0 <= i < len(self.state) and self.state[i] == "draining":
            self._park_if_empty(i)

    # -- the loop
    def run(self):
        """Decide every ``interval_s`` until every expected request is accounted for."""
        while True:
            yield self.env.timeout(self.a.interval_s)
            if self.cluster.done.triggered:
                return
            self.step()

    def observe(self) -> Observation:
        serving = self.serving()
        a = self.a
        if a.metric == "kv_util":
            total = sum(r.kv_used_fraction for r in serving)
        elif a.metric == "queued_per_replica":
            total = sum(sum(st.outstanding - st.running for st in r.streams) for r in serving)
        else:
            total = sum(r.outstanding for r in serving)
        handoff = self.cluster.handoff
        if (self.pool is not None and self.pool.role == "decode"
                and a.metric != "kv_util"):  # prefilled requests waiting for admission
            total += len(handoff.queue)
        obs = Observation(len(serving), self.arrivals / a.interval_s, float(total),
                          float(np.percentile(self.ttfts, 90)) if self.ttfts else math.nan,
                          float(np.percentile(self.tpots, 90)) if self.tpots else math.nan)
        self.arrivals, self.ttfts, self.tpots = 0, [], []
        return obs

    def step(self) -> None:
        now, a = self.env.now, self.a
        for i, st in enumerate(self.state):  # drained replicas leave
            if st == "draining":
                self._park_if_empty(i)
        obs = self.observe()
        up = sum(st in ("serving", "starting") for st in self.state)
        desired = max(a.min_replicas, self.policy.desired(obs, up))
        want = min(self.max, desired)
        if desired > want:  # the scale-up waits for replicas there are none of: say so
            self.log.capped.append((now, desired))
        self.log.decisions.append((now, want, obs.arrivals_per_s))
        if want > up and now - self.last_up >= a.cooldown_up_s:
            for _ in range(want - up):
                self._start_one()
            self.last_up = self.last_change = now
        elif want < up and now - self.last_change >= a.cooldown_down_s:
            for _ in range(up - want):
                self._drain_one()
            self.last_change = now

    def _set(self, i: int, state: str) -> None:
        self.state[i] = state
        self.log.changes.append((self.env.now, i, state))

    def _start_one(self) -> None:
        draining = [i for i, st in enumerate(self.state) if st == "draining"]
        if draining:  # still warm: serve again at once
            self._set(draining[0], "serving")
            return
        parked = [i for i, st in enumerate(self.state) if st == "parked"]
        if not parked:
            return
        i = parked[0]
        peers = [j for j, st in enumerate(self.state) if st == "serving"]
        delay = cold_start_s(self.a, self.cluster.plan, i, peers[0] if peers else None,
                             self.pool)
        self._set(i, "starting")
        self.log.cold_starts_s.append(delay)
        self.env.process(self._warm(i, delay))

    def _warm(self, i: int, delay: float):
        yield self.env.timeout(delay)
        if self.state[i] == "starting":
            self._set(i, "serving")
            self.cluster._serve_pending()

    def _drain_one(self) -> None:
        serving = [i for i, st in enumerate(self.state) if st == "serving"]
        starting = [i for i, st in enumerate(self.state) if st == "starting"]
        if starting:  # cancel a cold start before draining a warm replica
            self._set(starting[-1], "parked")
            return
        if len(serving) <= 1:
            return
        i = min(serving, key=lambda j: (self.reps[j].outstanding, -j))
        self._set(i, "draining")
        self._park_if_empty(i)

    def _park_if_empty(self, i: int) -> None:
        """Park draining replica ``i`` once it holds no request: none running or queued
        and, on a prefill replica, no KV still held for the decode side."""
        rep, handoff = self.reps[i], self.cluster.handoff
        if rep.outstanding == 0 and (handoff is None or not handoff.holding.get(rep.index)):
            self._set(i, "parked")

    # -- what a day costs
    def gpu_seconds(self, end_s: float, gpus_per_replica: int) -> float:
        """GPU-seconds paid: every replica's time starting, serving or draining."""
        paid, since = 0.0, {}
        for t, i, st in self.log.changes:
            if st == "parked":
                if i in since:
                    paid += t - since.pop(i)
            elif i not in since:
                since[i] = t
        paid += sum(end_s - t for t in since.values())
        return paid * gpus_per_replica

    def cold_start_spans(self) -> list[tuple[float, float]]:
        """``[start, end)`` of every cold start: from the scale-up decision until the
        replica serves or the start is cancelled (inf: still starting when the run ended)."""
        spans, open_ = [], {}
        for t, i, st in self.log.changes:
            if i in open_:
                spans.append((open_.pop(i), t))
            if st == "starting":
                open_[i] = t
        return spans + [(t, math.inf) for t in open_.values()]

    def replicas_over_time(self, edges: np.ndarray) -> np.ndarray:
        """Replicas paid for (starting, serving or draining) at each of ``edges``."""
        paid, times, counts = set(), [0.0], [0]
        for t, i, st in self.log.changes:
            (paid.discard if st == "parked" else paid.add)(i)
            times.append(t)
            counts.append(len(paid))
        times, counts = np.array(times), np.array(counts)
        idx = np.searchsorted(times, edges, side="right") - 1
        return np.where(idx >= 0, counts[np.clip(idx, 0, None)], 0)

    def summary(self, end_s: float, gpus_per_replica: int, gpu_hour_usd: float,
                output_tokens: float) -> dict:
        """What the run's scaling cost: replicas over time, GPU-hours, cold starts; the
        cost of a million output tokens from the GPU-hours paid (not the whole fleet)."""
        gpu_s = self.gpu_seconds(end_s, gpus_per_replica)
        edges = np.linspace(0.0, end_s, 2001) if end_s > 0 else np.zeros(1)
        counts = self.replicas_over_time(edges)
        ups = sum(st == "starting" for _, _, st in self.log.changes)
        downs = sum(st == "draining" for _, _, st in self.log.changes)
        cold = self.log.cold_starts_s
        usd = gpu_s / 3600.0 * gpu_hour_usd
        # One replica's capacity within the SLOs: the sla policy's, else the cost model's
        # (for the plot of load against the capacity paid for).
        cap = (self.policy.capacity_per_s if isinstance(self.policy, SlaPolicy)
               else self._capacity())
        return {"autoscale_replica_capacity_per_s": cap, "autoscale_policy": self.a.policy,
                "autoscale_replicas_mean": float(np.mean(counts)),
                "autoscale_replicas_max": int(np.max(counts)),
                "autoscale_replicas_min": int(np.min(counts[1:] if len(counts) > 1
                                                     else counts)),
                "autoscale_scale_ups": ups, "autoscale_scale_downs": downs,
                **capped_figures([self.log]),
                "autoscale_cold_start_mean_s": float(np.mean(cold)) if cold else math.nan,
                "autoscale_gpu_hours": gpu_s / 3600.0,
                "autoscale_cost_usd": usd,
                "cost_per_million_output_tokens_usd": (usd / (output_tokens / 1e6)
                                                       if output_tokens > 0 else math.nan)}
