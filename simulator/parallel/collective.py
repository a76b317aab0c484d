"""Collective and point-to-point times over topology paths (alpha-beta form).

Ring all-reduce of S bytes over n ranks with per-rank bandwidth B and per-step latency a:
``t = t0 + 2(n-1)*a + 2(n-1)/n * S / (B*eta)`` (REFERENCE.md section 2). B and a come from
the graph: the slowest and highest-latency hop between ring neighbours. ``t0`` is the
launch/synchronisation cost of one NCCL call and ``eta`` the achieved fraction of link
bandwidth; both are per-fabric calibration constants (measured on H100 NVSwitch: 8 KiB
all-reduce 16 us on 8 GPUs, 10 us on 4, 7 us on 2; 64 MiB busbw 265-365 GB/s).
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.topology.graph import Paths

#: NCCL call launch and synchronisation, seconds (fits the 2/4/8-GPU small-message points).
LAUNCH_S = 5.2e-6
#: Software latency per ring step on top of the wire latency, seconds.
STEP_S = 0.0
#: Achieved fraction of link bandwidth for large messages.
BANDWIDTH_EFFICIENCY = 0.75


@dataclass(frozen=True)
class AllReduceCost:
    """``time(S) = alpha + beta * S`` for one all-reduce of S bytes over a fixed group."""

    alpha: float
    beta: float
    ranks: int

    def time(self, nbytes: float) -> float:
        if self.ranks <= 1:
            return 0.0
        return self.alpha + self.beta * nbytes


def ring_allreduce(paths: Paths, group: tuple[str, ...]) -> AllReduceCost:
    """Alpha-beta cost of a ring all-reduce over ``group`` (GPU names, ring order)."""
    n = len(group)
    if n <= 1:
        return AllReduceCost(0.0, 0.0, n)
    hops = [(group[i], group[(i + 1) % n]) for i in range(n)]
    bw = min(paths.bandwidth(a, b) for a, b in hops)
    lat = max(paths.latency(a, b) for a, b in hops) + STEP_S
    alpha = LAUNCH_S + 2 * (n - 1) * lat
    beta = 2 * (n - 1) / n / (bw * BANDWIDTH_EFFICIENCY)
    return AllReduceCost(alpha, beta, n)


def send_time(paths: Paths, src: str, dst: str, nbytes: float) -> float:
    """Point-to-point send of ``nbytes`` from src to dst (PP activation hand-off)."""
    if nbytes <= 0 or src == dst:
        return 0.0
    return paths.latency(src, dst) + nbytes / (paths.bandwidth(src, dst) * BANDWIDTH_EFFICIENCY)
