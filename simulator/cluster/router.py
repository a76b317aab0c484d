"""DP load balancers: pick a replica for each request from a read-only view of the replicas.

A policy is any object with ``choose(replicas, request) -> int``. ``replicas`` is a sequence
of views exposing ``outstanding`` (requests in flight), ``kv_used_fraction`` (KV blocks in
use / capacity) and ``load_tokens`` (prompt tokens still to prefill plus KV tokens held);
policies are testable without SimPy. Register new ones in :data:`ROUTERS`. Ties go to the
lowest replica index.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import Any, Protocol

import numpy as np


class Router(Protocol):
    def choose(self, replicas: Sequence[Any], request: Any) -> int: ...


class RoundRobin:
    """Replicas in turn: 0, 1, ..., dp-1, 0, ..."""

    def __init__(self, rng: np.random.Generator | None = None) -> None:
        self._next = 0

    def choose(self, replicas: Sequence[Any], request: Any) -> int:
        i = self._next % len(replicas)
        self._next = i + 1
        return i


class Random:
    """A replica uniformly at random (from the run's router stream)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def choose(self, replicas: Sequence[Any], request: Any) -> int:
        return int(self.rng.integers(len(replicas)))


class _LeastBy:
    """The replica with the least of ``attr``."""

    attr = "outstanding"

    def __init__(self, rng: np.random.Generator | None = None) -> None:
        self._load = attrgetter(self.attr)

    def choose(self, replicas: Sequence[Any], request: Any) -> int:
        loads = list(map(self._load, replicas))
        return loads.index(min(loads))


class LeastOutstanding(_LeastBy):
    """Fewest requests in flight (queued or running)."""

    attr = "outstanding"


class LeastKV(_LeastBy):
    """Lowest KV-cache occupancy."""

    attr = "kv_used_fraction"


class LeastTokens(_LeastBy):
    """Fewest tokens queued for prefill plus tokens held in KV by running requests."""

    attr = "load_tokens"


class PowerOfTwo:
    """Power of two choices (Mitzenmacher 2001): sample two distinct replicas, take the one
    with fewer requests in flight."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def choose(self, replicas: Sequence[Any], request: Any) -> int:
        n = len(replicas)
        if n == 1:
            return 0
        a, b = (int(x) for x in self.rng.choice(n, size=2, replace=False))
        return a if (replicas[a].outstanding, a) <= (replicas[b].outstanding, b) else b


ROUTERS: dict[str, type] = {"round_robin": RoundRobin, "random": Random,
                            "least_outstanding": LeastOutstanding, "least_kv": LeastKV,
                            "least_tokens": LeastTokens, "power_of_two": PowerOfTwo}


def make_router(policy: str | Router, rng: np.random.Generator | None = None) -> Router:
    """A router by registered name (given the run's router random stream), or the given
    object when it already has ``choose``."""
    if hasattr(policy, "choose"):
        return policy  # type: ignore[return-value]
    try:
        cls = ROUTERS[policy]
    except KeyError:
        raise ValueError(f"router.policy: unknown policy {policy!r} "
                         f"(allowed: {', '.join(ROUTERS)})") from None
    return cls(rng if rng is not None else np.random.default_rng(0))
