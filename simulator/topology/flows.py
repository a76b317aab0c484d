"""Link contention: flows on directed links share bandwidth max-min fairly.

A flow is a path of directed edges of the cluster graph with a number of bytes to move.
While several flows are active, their rates are the max-min fair allocation of the links'
capacities (progressive filling: raise every unfrozen flow's rate together until some link
is full, freeze the flows crossing it, repeat). Rates are recomputed whenever a flow starts
or ends, so :func:`finish_times` is an exact fluid simulation of the flows, and a pure
function of its inputs.

Collectives (:mod:`simulator.parallel.collective`) are sets of flows on the links their
algorithm uses; the engine's analytic costs are the special case of flows alone on their
links.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

#: Relative tolerance under which a link counts as full or a flow as finished.
_EPS = 1e-12


@dataclass(frozen=True)
class Flow:
    """``nbytes`` to move over ``edges`` (directed links, each a hashable key such as the
    graph edge ``(u, v)``), starting at ``start_s``."""

    edges: tuple[Hashable, ...]
    nbytes: float
    start_s: float = 0.0


def max_min_rates(edges: Sequence[Sequence[Hashable]], capacity: dict) -> np.ndarray:
    """Max-min fair rates (bytes/s) of flows that cross ``edges[i]``, by progressive filling.

    Parameters
    ----------
    edges : sequence of sequences of hashable
        The links each flow crosses.
    capacity : dict
        Bytes/s of each link (per direction).

    Returns
    -------
    numpy.ndarray
        One rate per flow; ``inf`` for a flow that crosses no link.

    Notes
    -----
    Progressive filling (Bertsekas and Gallager, *Data Networks*, section 6.5.2): with
    ``U`` the unfrozen flows, each round adds ``d = min over links l of r_l / u_l`` to every
    flow of ``U`` (``r_l`` the link's remaining capacity, ``u_l`` its unfrozen flows), then
    freezes the flows on the links that became full. The result is the unique allocation in
    which no flow can go faster without slowing a flow that is no faster.
    """
    n = len(edges)
    rates = np.zeros(n)
    links = sorted({e for path in edges for e in path}, key=repr)
    if not links:
        return np.full(n, np.inf)
    index = {e: j for j, e in enumerate(links)}
    inc = np.zeros((len(links), n), dtype=bool)
    for i, path in enumerate(edges):
        for e in path:
            inc[index[e], i] = True
    left = np.array([float(capacity[e]) for e in links])
    scale = left.copy()
    frozen = ~inc.any(axis=0)
    rates[frozen] = np.inf
    while not frozen.all():
        users = inc[:, ~frozen].sum(axis=1)
        active = users > 0
        share = np.full(len(links), np.inf)
        share[active] = left[active] / users[active]
        d = share.min()
        rates[~frozen] += d
        left = left - d * users
        full = active & (left <= _EPS * scale)
        frozen = frozen | inc[full].any(axis=0)
    return rates


def finish_times(flows: Sequence[Flow], capacity: dict) -> np.ndarray:
    """When each flow's last byte leaves (seconds), flows sharing links max-min fairly.

    Rates are recomputed at every start and every finish (an exact fluid model: between
    two such events the rates are constant).

    Parameters
    ----------
    flows : sequence of Flow
    capacity : dict
        Bytes/s of each directed link.

    Returns
    -------
    numpy.ndarray
        Finish time of each flow, seconds (``start_s`` for an empty flow or one that
        crosses no link). Path latency is not included: callers add it.
    """
    n = len(flows)
    start = np.array([f.start_s for f in flows], dtype=float)
    left = np.array([max(float(f.nbytes), 0.0) for f in flows])
    done = np.full(n, np.nan)
    instant = (left <= 0) | np.array([len(f.edges) == 0 for f in flows], dtype=bool)
    done[instant] = start[instant]
    pending = ~instant
    now = float(start[pending].min()) if pending.any() else 0.0
    while pending.any():
        active = pending & (start <= now)
        later = start[pending & ~active]
        next_start = later.min() if later.size else np.inf
        if not active.any():
            now = next_start
            continue
        idx = np.flatnonzero(active)
        rates = max_min_rates([flows[i].edges for i in idx], capacity)
        to_end = left[idx] / rates
        dt = min(to_end.min(), next_start - now)
        left[idx] -= rates * dt
        now += dt
        ended = idx[left[idx] <= _EPS * np.maximum(1.0, [flows[i].nbytes for i in idx])]
        ended = np.union1d(ended, idx[to_end <= dt * (1 + 1e-12)])
        left[ended] = 0.0
        done[ended] = now
        pending[ended] = False
    return done


class FlowNetwork:
    """Max-min fair flows inside a SimPy environment (the engine-facing helper).

    ``transfer`` starts a flow and returns an event that fires when its last byte has
    arrived: rates are recomputed at every start and finish, as in :func:`finish_times`,
    and the path latency is added after the last byte leaves. Event delays are rounded up
    to multiples of ``quantum_s`` (the engine's clock tick), so a flow never wakes before
    its bytes are through.

    Parameters
    ----------
    env : simpy.Environment
    capacity : dict
        Bytes/s of each directed link a flow may cross.
    quantum_s : float
        Clock resolution of the environment (0: exact delays).
    """

    def __init__(self, env, capacity: dict, quantum_s: float = 0.0):
        self.env, self.capacity, self.quantum_s = env, capacity, quantum_s
        self._flows: dict[int, list] = {}  # id -> [edges, bytes left, event, latency_s]
        self._rates: dict[int, float] = {}
        self._since = 0.0
        self._ids = 0
        self._version = 0
        self.bytes_total = 0.0

    def _round(self, seconds: float) -> float:
        q = self.quantum_s
        return float(np.ceil(seconds / q - 1e-9) * q) if q > 0 else float(seconds)

    def transfer(self, edges: tuple, nbytes: float, latency_s: float = 0.0):
        """Start moving ``nbytes`` over ``edges`` now; the returned event fires on arrival."""
        done = self.env.event()
        self.bytes_total += max(nbytes, 0.0)
        if nbytes <= 0 or not edges:
            self.env.timeout(self._round(latency_s)).callbacks.append(lambda _: done.succeed())
            return done
        self._advance()
        self._ids += 1
        self._flows[self._ids] = [tuple(edges), float(nbytes), done, latency_s]
        self._plan()
        return done

    @property
    def active(self) -> int:
        """Flows moving bytes now."""
        return len(self._flows)

    def _advance(self) -> None:
        dt = self.env.now - self._since
        if dt > 0:
            for k, f in self._flows.items():
                f[1] -= self._rates.get(k, 0.0) * dt
        self._since = self.env.now

    def _plan(self) -> None:
        if not self._flows:
            self._rates = {}
            return
        ids = list(self._flows)
        rates = max_min_rates([self._flows[k][0] for k in ids], self.capacity)
        self._rates = dict(zip(ids, rates, strict=True))
        first = min(max(self._flows[k][1], 0.0) / r for k, r in self._rates.items())
        self._version += 1
        version = self._version
        self.env.timeout(self._round(first)).callbacks.append(
            lambda _, v=version: self._wake(v))

    def _wake(self, version: int) -> None:
        if version != self._version:  # a start or finish since has replanned
            return
        self._advance()
        slack = max(self.quantum_s, 0.0)
        for k in [k for k, f in self._flows.items()
                  if f[1] <= max(_EPS * self.capacity_of(f[0]), self._rates[k] * slack)]:
            _, _, done, latency = self._flows.pop(k)
            self.env.timeout(self._round(latency)).callbacks.append(
                lambda _, d=done: d.succeed())
        self._plan()

    def capacity_of(self, edges: tuple) -> float:
        """The slowest capacity on ``edges`` (bytes/s)."""
        return min(self.capacity[e] for e in edges)
