"""Place replicas on GPUs: TP groups inside one NVLink domain, PP stages over groups, DP
replicas spread over nodes.

Rules (REFERENCE.md section 2, placement rules from practice): a TP group no larger than a
domain never leaves its NVLink domain; a replica whose stages fit in one domain stays there;
otherwise its stages fill the domain with the most free GPUs, then the next, so PP crosses
nodes as few times as the layout allows; replicas go to the domain with the most free GPUs,
which spreads DP over nodes and keeps fragmentation low.
A TP group larger than a domain (tp = 16 on 8-GPU nodes) takes whole free domains, and its
all-reduces cross the network (priced by the multi-node collectives).
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.errors import ScenarioError


@dataclass(frozen=True)
class ReplicaPlacement:
    """GPU names of one replica: ``stages[i]`` is the TP group of pipeline stage i."""

    replica: int
    stages: tuple[tuple[str, ...], ...]

    @property
    def gpus(self) -> tuple[str, ...]:
        return tuple(g for stage in self.stages for g in stage)


def place(domains: list[list[str]], tp: int, pp: int, dp: int,
          policy: str = "spread") -> list[ReplicaPlacement]:
    """Assign GPUs to ``dp`` replicas of ``pp`` stages of ``tp`` GPUs each.

    Parameters
    ----------
    domains : list of list of str
        NVLink domains, each a list of GPU names in index order.
    tp, pp, dp : int
        Tensor, pipeline and data parallel degrees.
    policy : {"spread", "packed"}
        ``spread`` puts each replica on the domain with the most free GPUs (replicas land
        on different nodes: one node failure cannot take them all); ``packed`` fills
        domains in order (fewest nodes used).

    Raises
    ------
    ScenarioError
        When the layout needs more GPUs than exist or a TP group cannot fit in a domain.
    """
    total = sum(len(d) for d in domains)
    if tp * pp * dp > total:
        raise ScenarioError(f"parallel: tp*pp*dp = {tp}*{pp}*{dp} = {tp * pp * dp} GPUs, "
                            f"but the cluster has {total}")
    largest = max(len(d) for d in domains)
    if tp > largest:
        return _place_spanning(domains, tp, pp, dp, largest)
    free = [list(d) for d in domains]
    placements = []

    def order() -> list[int]:
        if policy == "packed":
            return list(range(len(free)))
        return sorted(range(len(free)), key=lambda i: -len(free[i]))  # ties: lower index

    for r in range(dp):
        order_now = order()
        whole = next((i for i in order_now if len(free[i]) >= tp * pp), None)
        stages = []
        if whole is not None:
            for _ in range(pp):
                stages.append(tuple(free[whole][:tp]))
                del free[whole][:tp]
        else:
            last = None
            for _ in range(pp):
                # Stay in the previous stage's domain while it has room: consecutive stages
                # then cross between domains as few times as the layout allows.
                room = ([last] if last is not None and len(free[last]) >= tp
                        else [i for i in order() if len(free[i]) >= tp])
                if not room:
                    raise ScenarioError(
                        f"parallel: cannot place replica {r}: no NVLink domain has {tp} free "
                        f"GPUs for its next stage (tp={tp}, pp={pp}, dp={dp} on domains of "
                        f"{largest} GPUs)")
                last = room[0]
                stages.append(tuple(free[last][:tp]))
                del free[last][:tp]
        placements.append(ReplicaPlacement(r, tuple(stages)))
    return placements


def _place_spanning(domains: list[list[str]], tp: int, pp: int, dp: int,
                    size: int) -> list[ReplicaPlacement]:
    """TP groups of ``tp / size`` whole domains each, domains taken in index order."""
    if tp % size:
        raise ScenarioError(f"parallel.tp: {tp} exceeds the largest NVLink domain ({size} "
                            f"GPUs) and is not a multiple of it; a TP group larger than a "
                            f"domain takes whole domains (tp = {size}, {2 * size}, ...)")
    whole = [d for d in domains if len(d) == size]
    per = tp // size
    if per * pp * dp > len(whole):
        raise ScenarioError(f"parallel: tp={tp}, pp={pp}, dp={dp} needs {per * pp * dp} whole "
                            f"NVLink domains of {size} GPUs; the cluster has {len(whole)}")
    placements, k = [], 0
    for r in range(dp):
        stages = []
        for _ in range(pp):
            stages.append(tuple(g for d in whole[k:k + per] for g in d))
            k += per
        placements.append(ReplicaPlacement(r, tuple(stages)))
    return placements
