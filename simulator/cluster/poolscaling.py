"""Autoscaling of a disaggregated cluster: each prefill or decode pool with an ``autoscale``
table scales on its own (docs/autoscaling.md, "Scaling prefill and decode pools").

One :class:`~simulator.cluster.autoscale.Autoscaler` per scaling pool decides every
``interval_s`` from its own pool's replicas, as NVIDIA Dynamo's planner scales prefill and
decode workers separately (ai-dynamo/dynamo, docs/architecture/load_planner.md and
sla_planner.md):

- the ``load`` policy of a prefill pool sees its prompts queued or held
  (``queued_per_replica``, ``outstanding_per_replica``) or its KV in use, as Dynamo's load
  planner watches the prefill queue; a decode pool's ``outstanding_per_replica`` and
  ``queued_per_replica`` also count the prefilled requests waiting for decode admission
  (its backlog), and ``kv_util`` its KV in use, as Dynamo watches decode KV utilization;
- the ``sla`` policy corrects a prefill pool by the TTFT ratio alone and a decode pool by
  the TPOT (ITL) ratio alone, Dynamo's ``prefill_correction = actual_ttft / expected_ttft``
  and ``decode_correction = actual_itl / expected_itl``.

Scale-down drains as Dynamo's workers do: a draining prefill replica takes no new prompt,
finishes its prefills and keeps each prompt's KV until a decode replica has taken it over
(the hand-off's normal path), then is parked; a draining decode replica is admitted no new
request and finishes those it holds. No request is moved, lost or counted twice. Pools
without a table keep their ``dp`` replicas serving and paid for the whole run.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from simulator.cluster.autoscale import Autoscaler, capped_figures

#: A role's SLOs for the sla correction: the other latency is left out (an infinite SLO).
_ONLY = {"prefill": "tpot_s", "decode": "ttft_s"}


class PoolScaling:
    """The scaling pools' autoscalers, seen by the cluster as one (``cluster.scaling``)."""

    def __init__(self, env, cluster, slo):
        self.env, self.cluster = env, cluster
        self.scalers: dict[str, Autoscaler] = {}
        for pool in cluster.plan.pools:
            a = pool.spec.autoscale_of()
            if a is not None:
                own_slo = replace(slo, **{_ONLY[pool.role]: math.inf})
                self.scalers[pool.name] = Autoscaler(env, cluster, a, own_slo, pool=pool)
        self._of = [self.scalers.get(p.name) for p in cluster.pool_of]

    # -- what the cluster asks
    def routable(self, replica) -> bool:
        s = self._of[replica.index]
        return s is None or s.routable(replica)

    def on_submit(self) -> None:
        for s in self.scalers.values():
            s.on_submit()

    def on_finish(self, req) -> None:
        for s in self.scalers.values():  # every pool sees the front end's latencies
            s.record(req)
        self.release(req.replica)

    def release(self, index: int) -> None:
        if 0 <= index < len(self._of) and self._of[index] is not None:
            self._of[index].release(index)

    def run(self):
        """Start every scaling pool's decision loop."""
        for s in self.scalers.values():
            self.env.process(s.run())
        yield self.env.timeout(0)

    def scaler_keys(self) -> list:
        """Each scaling pool's autoscale keys."""
        return [s.a for s in self.scalers.values()]

    # -- what a day costs
    def cold_start_spans(self) -> list[tuple[float, float]]:
        """Every scaling pool's cold starts, by start time."""
        return sorted(x for s in self.scalers.values() for x in s.cold_start_spans())

    def pool_replicas(self, edges: np.ndarray) -> dict[str, np.ndarray]:
        """Replicas paid for in each pool at each of ``edges`` (a pool that does not scale:
        all of them)."""
        out = {}
        for pool in self.cluster.plan.pools:
            s = self.scalers.get(pool.name)
            out[pool.name] = (s.replicas_over_time(edges) if s is not None
                              else np.full(len(edges), len(pool.replicas)))
        return out

    def replicas_over_time(self, edges: np.ndarray) -> np.ndarray:
        """Replicas paid for, all pools together, at each of ``edges``."""
        return np.sum(list(self.pool_replicas(edges).values()), axis=0)

    def timeseries_columns(self, edges: np.ndarray) -> dict[str, np.ndarray]:
        """``replicas`` and one ``replicas_pool_<pool>`` column per pool at ``edges``."""
        per = self.pool_replicas(edges)
        return {"replicas": np.sum(list(per.values()), axis=0),
                **{f"replicas_pool_{name}": v for name, v in per.items()}}

    def summary(self, end_s: float, gpu_hour_usd: float | None,
                output_tokens: float) -> dict:
        """The colocated autoscaling keys over all pools (GPU-hours and cost of every pool,
        replicas summed), and per pool: ``autoscale_pool_replicas_mean``, ``..._min``,
        ``..._max``, ``autoscale_pool_gpu_hours``, ``autoscale_pool_scale_ups`` and
        ``autoscale_pool_scale_downs`` (dicts by pool name). A pool's price is its
        ``gpu_hour_usd``, else ``gpu_hour_usd``."""
        edges = np.linspace(0.0, end_s, 2001) if end_s > 0 else np.zeros(1)
        per = self.pool_replicas(edges)
        total = np.sum(list(per.values()), axis=0)
        hours, usd, ups, downs = {}, 0.0, {}, {}
        cold: list[float] = []
        for pool in self.cluster.plan.pools:
            s = self.scalers.get(pool.name)
            per_replica = pool.gpus // len(pool.replicas)
            gpu_s = (s.gpu_seconds(end_s, per_replica) if s is not None
                     else pool.gpus * end_s)
            hours[pool.name] = gpu_s / 3600.0
            price = pool.spec.gpu_hour_usd
            price = gpu_hour_usd if price is None else price
            usd += hours[pool.name] * price if price is not None else math.nan
            changes = s.log.changes if s is not None else []
            ups[pool.name] = sum(st == "starting" for _, _, st in changes)
            downs[pool.name] = sum(st == "draining" for _, _, st in changes)
            cold += s.log.cold_starts_s if s is not None else []
        span = slice(1, None) if len(edges) > 1 else slice(None)
        return {"autoscale_replica_capacity_per_s": math.nan,
                "autoscale_policy": ", ".join(f"{n}: {s.a.policy}"
                                              for n, s in self.scalers.items()),
                "autoscale_replicas_mean": float(np.mean(total)),
                "autoscale_replicas_max": int(np.max(total)),
                "autoscale_replicas_min": int(np.min(total[span])),
                "autoscale_scale_ups": sum(ups.values()),
                "autoscale_scale_downs": sum(downs.values()),
                **capped_figures([s.log for s in self.scalers.values()]),
                "autoscale_cold_start_mean_s": float(np.mean(cold)) if cold else math.nan,
                "autoscale_gpu_hours": sum(hours.values()),
                "autoscale_cost_usd": usd,
                "cost_per_million_output_tokens_usd": (usd / (output_tokens / 1e6)
                                                       if output_tokens > 0 else math.nan),
                "autoscale_pool_replicas_mean": {n: float(np.mean(v)) for n, v in per.items()},
                "autoscale_pool_replicas_min": {n: int(np.min(v[span]))
                                                for n, v in per.items()},
                "autoscale_pool_replicas_max": {n: int(np.max(v)) for n, v in per.items()},
                "autoscale_pool_gpu_hours": hours,
                "autoscale_pool_scale_ups": ups, "autoscale_pool_scale_downs": downs}
