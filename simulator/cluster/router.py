"""DP load balancers: pick a replica for each request from a read-only view of the replicas.

A policy is any object with ``choose(replicas, request) -> int``. ``replicas`` is a sequence
of views exposing ``outstanding`` (requests in flight), ``kv_used_fraction`` (KV blocks in
use / capacity), ``load_tokens`` (prompt tokens still to prefill plus KV tokens held),
``index`` (the replica's number) and ``cached_tokens(request)`` (prompt tokens of the request
found in the replica's prefix cache); policies are testable without SimPy. Register new ones
in :data:`ROUTERS`. Ties go to the lowest replica index.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from operator import attrgetter
from typing import Any, Protocol

import numpy as np

from simulator import registry
from simulator.hashing import splitmix64


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


class PrefixAware:
    """Most cached prompt tokens (longest cached prefix), ties by fewest requests in flight
    (as llm-d's prefix-cache scorer, SGLang's cache-aware router without its balance
    threshold)."""

    def __init__(self, rng: np.random.Generator | None = None, **_: float) -> None:
        pass

    def choose(self, replicas: Sequence[Any], request: Any) -> int:
        keys = [(-r.cached_tokens(request), r.outstanding) for r in replicas]
        return keys.index(min(keys))


class KVAware:
    """Cached overlap against load, as the KV-aware routers (Dynamo, Mooncake's conductor):
    score = cached prompt tokens - ``load_weight`` x load tokens (prefill still queued plus
    KV held); the highest score wins. ``load_weight`` 0 is :class:`PrefixAware` without its
    tie-break; a large one is :class:`LeastTokens`."""

    def __init__(self, rng: np.random.Generator | None = None, load_weight: float = 1.0,
                 **_: float) -> None:
        self.weight = load_weight

    def choose(self, replicas: Sequence[Any], request: Any) -> int:
        w = self.weight
        scores = [r.cached_tokens(request) - w * r.load_tokens for r in replicas]
        return scores.index(max(scores))


class Scraped:
    """A replica as a router sees it between metric scrapes: its load (requests in flight,
    KV occupancy, load tokens) as of the last :meth:`scrape`; its prefix cache live (the
    prefix-aware routers keep their own index of what they routed, llm-d's and Dynamo's
    alike). ``[router] refresh_s`` sets the scrape interval (docs/policies.md)."""

    __slots__ = ("replica", "index", "outstanding", "kv_used_fraction", "load_tokens")

    def __init__(self, replica: Any):
        self.replica, self.index = replica, replica.index
        self.scrape()

    def scrape(self) -> None:
        r = self.replica
        self.outstanding = r.outstanding
        self.kv_used_fraction = r.kv_used_fraction
        self.load_tokens = r.load_tokens

    def cached_tokens(self, request: Any) -> int:
        return self.replica.cached_tokens(request)


class SessionAffinity:
    """Consistent hashing of the session (Karger et al. 1997): each replica owns
    ``VNODES`` points on a 64-bit ring; a request goes to the first point clockwise of its
    session's hash, so every turn of a session lands on one replica and a replica going down
    moves only its own sessions. A request without a session hashes its id."""

    VNODES = 64

    def __init__(self, rng: np.random.Generator | None = None, **_: float) -> None:
        self._rings: dict[tuple, tuple[list[int], list[int]]] = {}

    def _ring(self, indices: tuple) -> tuple[list[int], list[int]]:
        ring = self._rings.get(indices)
        if ring is None:
            # Points hash inputs >= 2**63, keys < 2**63: splitmix64 is a bijection, so a key
            # never lands exactly on a point.
            points = sorted((splitmix64((1 << 63) | (i << 16) | v), k)
                            for k, i in enumerate(indices) for v in range(self.VNODES))
            ring = self._rings[indices] = ([p for p, _ in points], [k for _, k in points])
        return ring

    def choose(self, replicas: Sequence[Any], request: Any) -> int:
        indices = tuple(getattr(r, "index", k) for k, r in enumerate(replicas))
        points, owners = self._ring(indices)
        key = request.session if request.session >= 0 else (1 << 40) + request.id
        j = bisect.bisect_left(points, splitmix64(key))
        return owners[j % len(points)]


#: The routers a scenario may name (``[router] policy``): the one place a router is added.
ROUTERS = registry.ROUTERS.add({
    "round_robin": RoundRobin, "random": Random, "least_outstanding": LeastOutstanding,
    "least_kv": LeastKV, "least_tokens": LeastTokens, "power_of_two": PowerOfTwo,
    "prefix_aware": PrefixAware, "kv_aware": KVAware, "session_affinity": SessionAffinity})


def make_router(policy: str | Router, rng: np.random.Generator | None = None,
                load_weight: float = 1.0) -> Router:
    """A router by registered name (given the run's router random stream and, for
    ``kv_aware``, its ``load_weight``), or the given object when it already has
    ``choose``."""
    if hasattr(policy, "choose"):
        return policy  # type: ignore[return-value]
    try:
        cls = ROUTERS[policy]
    except KeyError:
        raise ValueError(f"router.policy: unknown policy {policy!r} "
                         f"(allowed: {', '.join(ROUTERS)})") from None
    rng = rng if rng is not None else np.random.default_rng(0)
    return cls(rng, load_weight=load_weight) if cls is KVAware else cls(rng)
