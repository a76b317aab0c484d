"""Collective and point-to-point times over topology paths (alpha-beta per algorithm).

An all-reduce of S bytes over a group costs the fastest available algorithm at that size,
each ``alpha + beta * S`` (:func:`simulator.calibration.forms.allreduce_times`): NCCL's ring,
tree and in-switch (NVLS) reductions, or vLLM's custom one-shot / two-shot all-reduce below
its size limit when the engine uses it. The link bandwidth and wire latency come from the
graph (the slowest and highest-latency hop between ring neighbours); launch latencies and
achieved fractions of bandwidth are per-GPU calibration (docs/cost-model.md). Without
calibration the ring alone prices it: ``t = t0 + 2(n-1)*a + 2(n-1)/n * S / (B*eta)``
(REFERENCE.md section 2).
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.calibration.forms import allreduce_times
from simulator.calibration.params import (
    RING_BANDWIDTH_EFF,
    RING_LAUNCH_S,
    RING_STEP_S,
    CollectiveParams,
)
from simulator.topology.graph import Paths

#: NCCL call launch and synchronisation of an uncalibrated fabric, seconds.
LAUNCH_S = RING_LAUNCH_S
#: Software latency per ring step on top of the wire latency, seconds.
STEP_S = RING_STEP_S
#: Achieved fraction of link bandwidth for large messages (and point-to-point sends).
BANDWIDTH_EFFICIENCY = RING_BANDWIDTH_EFF


@dataclass(frozen=True)
class AllReduceCost:
    """One all-reduce over a fixed group: ``time(S) = min over algorithms (alpha + beta*S)``.

    ``nccl`` and ``custom`` hold ``(name, alpha_s, beta_s_per_byte)``; the custom ones apply
    up to ``custom_max_bytes`` (vLLM's limit), NCCL's beyond.
    """

    nccl: tuple[tuple[str, float, float], ...]
    ranks: int
    custom: tuple[tuple[str, float, float], ...] = ()
    custom_max_bytes: float = 0.0

    @property
    def alpha(self) -> float:
        """Small-message latency of NCCL's fastest algorithm, seconds."""
        return min(a for _, a, _ in self.nccl) if self.ranks > 1 else 0.0

    @property
    def beta(self) -> float:
        """Seconds per byte of NCCL's fastest algorithm for large messages."""
        return min(b for _, _, b in self.nccl) if self.ranks > 1 else 0.0

    def algorithm(self, nbytes: float) -> str:
        """Name of the algorithm that all-reduces ``nbytes`` fastest."""
        algos = self.custom if self.custom and nbytes <= self.custom_max_bytes else self.nccl
        return min(algos, key=lambda x: x[1] + x[2] * nbytes)[0]

    def time(self, nbytes: float) -> float:
        if self.ranks <= 1:
            return 0.0
        algos = self.custom if self.custom and nbytes <= self.custom_max_bytes else self.nccl
        return min(a + b * nbytes for _, a, b in algos)


def allreduce(paths: Paths, group: tuple[str, ...], params: CollectiveParams | None = None,
              in_switch: bool = False, custom: bool = False) -> AllReduceCost:
    """All-reduce cost over ``group`` (GPU names, ring order).

    Parameters
    ----------
    params : CollectiveParams, optional
        The GPU's calibration; default: the uncalibrated ring.
    in_switch : bool
        Whether the group's switch reduces (NVLS): every hop is one NVLink domain whose
        switch supports it.
    custom : bool
        Whether the engine uses vLLM's custom all-reduce (the group shares one NVLink
        domain and has 2, 4, 6 or 8 GPUs).
    """
    n = len(group)
    if n <= 1:
        return AllReduceCost((("none", 0.0, 0.0),), n)
    params = params or CollectiveParams()
    hops = [(group[i], group[(i + 1) % n]) for i in range(n)]
    bw = min(paths.bandwidth(a, b) for a, b in hops)
    lat = max(paths.latency(a, b) for a, b in hops)
    algos = allreduce_times(params, n, bw, lat, in_switch)
    nccl = tuple((k, *v) for k, v in algos.items() if k in ("ring", "tree", "nvls"))
    use_custom = custom and n in (2, 4, 6, 8)
    mine = tuple((k, *v) for k, v in algos.items() if k in ("one_shot", "two_shot"))
    return AllReduceCost(nccl, n, mine if use_custom else (), params.custom_max_bytes)


def ring_allreduce(paths: Paths, group: tuple[str, ...]) -> AllReduceCost:
    """Alpha-beta cost of the uncalibrated ring all-reduce over ``group``."""
    return allreduce(paths, group)


def send_time(paths: Paths, src: str, dst: str, nbytes: float) -> float:
    """Point-to-point send of ``nbytes`` from src to dst (PP activation hand-off)."""
    if nbytes <= 0 or src == dst:
        return 0.0
    return paths.latency(src, dst) + nbytes / (paths.bandwidth(src, dst) * BANDWIDTH_EFFICIENCY)
