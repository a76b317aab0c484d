"""DP load balancers: pick a replica for each request from a read-only view of the replicas.

A policy is any object with ``choose(replicas, request) -> int``; ``replicas`` is a
sequence of objects exposing ``outstanding`` (requests in flight). Policies are testable
without SimPy. Register new ones in :data:`ROUTERS`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class Router(Protocol):
    def choose(self, replicas: Sequence[Any], request: Any) -> int: ...


class RoundRobin:
    """Replicas in turn: 0, 1, ..., dp-1, 0, ..."""

    def __init__(self) -> None:
        self._next = 0

    def choose(self, replicas: Sequence[Any], request: Any) -> int:
        i = self._next % len(replicas)
        self._next = i + 1
        return i


class LeastOutstanding:
    """The replica with the fewest requests in flight (lowest index on ties)."""

    def choose(self, replicas: Sequence[Any], request: Any) -> int:
        loads = [r.outstanding for r in replicas]
        return loads.index(min(loads))


ROUTERS: dict[str, type] = {"round_robin": RoundRobin, "least_outstanding": LeastOutstanding}


def make_router(policy: str | Router) -> Router:
    """A router by registered name, or the given object when it already has ``choose``."""
    if hasattr(policy, "choose"):
        return policy  # type: ignore[return-value]
    try:
        return ROUTERS[policy]()
    except KeyError:
        raise ValueError(f"router.policy: unknown policy {policy!r} "
                         f"(allowed: {', '.join(ROUTERS)})") from None
