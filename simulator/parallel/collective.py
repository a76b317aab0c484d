"""Collective and point-to-point times over topology paths (alpha-beta per algorithm).

Two levels. Inside one NVLink domain the calibrated closed forms price an all-reduce
(:func:`allreduce`, below). Over any GPU group, multi-node included,
:func:`schedules` lays each algorithm out as phases of flows on the graph's links (ring
neighbour sends, tree edges, switch reductions, the three phases of the hierarchical
all-reduce) and :func:`run_collectives` times them with max-min fair sharing
(:mod:`simulator.topology.flows`), alone or with concurrent collectives on shared links.
A collective alone on its links is linear in its size, so the engine gets the same
``alpha + beta * S`` form from :func:`multinode_allreduce`.

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

import math
from dataclasses import dataclass

from simulator.calibration.forms import allreduce_times
from simulator.calibration.params import (
    RING_BANDWIDTH_EFF,
    RING_LAUNCH_S,
    CollectiveParams,
)
from simulator.errors import ScenarioError
from simulator.topology.flows import Flow, finish_times
from simulator.topology.graph import Paths, full_mesh

#: NCCL call launch and synchronisation of an uncalibrated fabric, seconds.
LAUNCH_S = RING_LAUNCH_S
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

    Notes
    -----
    A group on several nodes is priced by :func:`multinode_allreduce` (ring, tree and
    hierarchical over the graph's paths; no NVLS, no custom all-reduce).

    A group whose GPUs are fully connected by direct xGMI links (an AMD node) has no
    switch: no NVLS. RCCL lays ``n - 1`` rings over each GPU's ``n - 1`` links (the
    complete digraph splits into ``n - 1`` Hamiltonian cycles), so the ring and the custom
    all-reduces see ``(n - 1) B`` per GPU; a tree edge is one link, ``B``.
    """
    n = len(group)
    if n <= 1:
        return AllReduceCost((("none", 0.0, 0.0),), n)
    params = params or CollectiveParams()
    if len(by_node(paths, group)) > 1:
        return multinode_allreduce(paths, group, params)
    hops = [(group[i], group[(i + 1) % n]) for i in range(n)]
    bw = min(paths.bandwidth(a, b) for a, b in hops)
    lat = max(paths.latency(a, b) for a, b in hops)
    if full_mesh(paths.g, group):
        algos = allreduce_times(params, n, (n - 1) * bw, lat, False)
        algos.update({k: v for k, v in allreduce_times(params, n, bw, lat, False).items()
                      if k == "tree"})
    else:
        algos = allreduce_times(params, n, bw, lat, in_switch)
    nccl = tuple((k, *v) for k, v in algos.items() if k in ("ring", "tree", "nvls"))
    use_custom = custom and n in (2, 4, 6, 8)
    mine = tuple((k, *v) for k, v in algos.items() if k in ("one_shot", "two_shot"))
    return AllReduceCost(nccl, n, mine if use_custom else (), params.custom_max_bytes)


def ring_allreduce(paths: Paths, group: tuple[str, ...]) -> AllReduceCost:
    """Alpha-beta cost of the uncalibrated ring all-reduce over ``group``."""
    return allreduce(paths, group)


# --- Any group, multi-node included: algorithms as phases of flows -------------------------

OPS = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
ALGORITHMS = ("ring", "tree", "nvls", "hierarchical")
#: Bytes of the reference size at which schedules are timed (times are linear in size).
_REF_BYTES = float(2**30)


@dataclass(frozen=True)
class Phase:
    """``steps`` identical steps; each moves ``flows`` (links crossed, share of the buffer)
    at once and pays ``latency_s`` (slowest path's wire latency plus software per step)."""

    steps: int
    flows: tuple[tuple[tuple[tuple[str, str], ...], float], ...]
    latency_s: float


@dataclass(frozen=True)
class Schedule:
    """One collective laid out on links: launch once, then the phases in order, every link
    running at ``eff`` of its bandwidth."""

    algorithm: str
    launch_s: float
    eff: float
    phases: tuple[Phase, ...]


@dataclass(frozen=True)
class CollectiveResult:
    """Time of ``concurrent`` identical collectives run at once (seconds), and NCCL's
    bandwidth figures: ``algbw = S / t``, ``busbw = algbw * factor(op, n)``."""

    op: str
    algorithm: str
    time_s: float
    nbytes: float
    ranks: int
    concurrent: int

    @property
    def algbw_bytes_per_s(self) -> float:
        return self.nbytes / self.time_s if self.time_s > 0 else math.inf

    @property
    def busbw_bytes_per_s(self) -> float:
        return self.algbw_bytes_per_s * bus_factor(self.op, self.ranks)


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw over algbw: 2(n-1)/n all-reduce, (n-1)/n all-gather and
    reduce-scatter, 1 send/recv (the per-rank link traffic a ring would need)."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    return 1.0


def by_node(paths: Paths, group: tuple[str, ...]) -> list[list[str]]:
    """The group's GPUs split by node (scale-up domain), nodes in order of first member."""
    nodes: dict[int, list[str]] = {}
    for gpu in group:
        nodes.setdefault(paths.g.nodes[gpu].get("node", 0), []).append(gpu)
    return list(nodes.values())


class Links:
    """Edges of the route between two GPUs. Routes through a spine spread over the spines
    by the sender's index (ECMP), instead of all taking the first spine."""

    def __init__(self, paths: Paths):
        self.paths, g = paths, paths.g
        self.spines = sorted(n for n, d in g.nodes(data=True) if d.get("tier") == "spine")
        self._cache: dict[tuple[str, str], tuple[tuple[str, str], ...]] = {}

    def __call__(self, a: str, b: str) -> tuple[tuple[str, str], ...]:
        key = (a, b)
        if key not in self._cache:
            path = list(self.paths.path(a, b))
            if self.spines:
                g = self.paths.g
                pick = self.spines[g.nodes[a].get("index", 0) % len(self.spines)]
                path = [pick if p in self.spines else p for p in path]
            self._cache[key] = tuple(zip(path, path[1:], strict=False))
        return self._cache[key]

    def latency(self, a: str, b: str) -> float:
        return self.paths.latency(a, b)


def _ring_orders(nodes: list[list[str]]) -> list[list[str]]:
    """NCCL-like channels: one ring per GPU of the smallest node (one per rail) when the
    group spans nodes, each entering and leaving every node on the same rail (node j runs
    up from local GPU c when j is even, down from c - 1 when odd); one ring in one node."""
    if len(nodes) == 1:
        return [nodes[0]]
    k = min(len(m) for m in nodes)
    orders = []
    for c in range(k):
        order = []
        for j, members in enumerate(nodes):
            g = len(members)
            order += [members[(c + s) % g] if j % 2 == 0 else members[(c - 1 - s) % g]
                      for s in range(g)]
        orders.append(order)
    return orders


def _ring_phase(links: Links, orders: list[list[str]], steps: int, share: float,
                step_s: float) -> Phase:
    """``steps`` ring steps: every rank of every channel sends ``share`` of the buffer to
    its successor."""
    flows, lat = [], 0.0
    for order in orders:
        n = len(order)
        for i in range(n):
            a, b = order[i], order[(i + 1) % n]
            flows.append((links(a, b), share))
            lat = max(lat, links.latency(a, b))
    return Phase(steps, tuple(flows), lat + step_s)


def _mesh_phase(links: Links, members: list[str], steps: int, share: float,
                step_s: float) -> Phase:
    """``steps`` ring steps over a full xGMI mesh: ``n - 1`` rings, one over each of a GPU's
    ``n - 1`` links, so every GPU sends ``share / (n - 1)`` of the buffer to every peer."""
    n, flows, lat = len(members), [], 0.0
    for a in members:
        for b in members:
            if a != b:
                flows.append((links(a, b), share / (n - 1)))
                lat = max(lat, links.latency(a, b))
    return Phase(steps, tuple(flows), lat + step_s)


def _ring_or_mesh(links: Links, orders: list[list[str]], steps: int, share: float,
                  step_s: float) -> Phase:
    """:func:`_ring_phase`, except that a ring whose GPUs form a full xGMI mesh runs as
    :func:`_mesh_phase` (RCCL's rings over every link of the mesh)."""
    meshes = [o for o in orders if full_mesh(links.paths.g, o)]
    if not meshes:
        return _ring_phase(links, orders, steps, share, step_s)
    rings = [o for o in orders if o not in meshes]
    parts = [_mesh_phase(links, o, steps, share, step_s) for o in meshes]
    if rings:
        parts.append(_ring_phase(links, rings, steps, share, step_s))
    return Phase(steps, tuple(f for ph in parts for f in ph.flows),
                 max(ph.latency_s for ph in parts))


def _tree_phases(links: Links, group: tuple[str, ...], step_s: float) -> tuple[Phase, ...]:
    """NCCL's double binary tree: two heap-ordered trees over the ranks (one over the
    reversed order, so each rank is inner in at most one), each reducing then broadcasting
    half the buffer; ``ceil(log2 n)`` levels up, as many down."""
    n = len(group)
    up, down, lat = [], [], 0.0
    for order in (list(group), list(reversed(group))):
        for i in range(1, n):
            child, parent = order[i], order[(i - 1) // 2]
            up.append((links(child, parent), 0.5))
            down.append((links(parent, child), 0.5))
            lat = max(lat, links.latency(child, parent))
    levels = math.ceil(math.log2(n))
    # The per-level latency is paid once per level; the data of a level pipelines.
    return (Phase(1, tuple(up), levels * (lat + step_s)),
            Phase(1, tuple(down), levels * (lat + step_s)))


def _switch_phase(paths: Paths, group: tuple[str, ...], share: float) -> Phase:
    """NVLS: every GPU sends ``share`` of the buffer into its switch and receives as much
    reduced data back."""
    g, flows, lat = paths.g, [], 0.0
    for gpu in group:
        sw = next(v for v in g.successors(gpu) if g.edges[gpu, v]["kind"] == "nvlink")
        flows += [(((gpu, sw),), share), (((sw, gpu),), share)]
        lat = max(lat, 2 * g.edges[gpu, sw]["latency_s"])
    return Phase(1, tuple(flows), lat)


def _in_switch(paths: Paths, group: tuple[str, ...]) -> bool:
    """The group is in one scale-up domain whose NVSwitch reduces (NVLS)."""
    g = paths.g
    if len(by_node(paths, group)) > 1:
        return False
    sws = {v for gpu in group for v in g.successors(gpu) if g.edges[gpu, v]["kind"] == "nvlink"}
    return len(sws) == 1 and bool(g.graph.get("in_switch_reduction", False))


def schedules(paths: Paths, op: str, group: tuple[str, ...],
              params: CollectiveParams | None = None) -> dict[str, Schedule]:
    """The algorithms available for ``op`` over ``group``, each laid out on links.

    Parameters
    ----------
    op : {"all_reduce", "all_gather", "reduce_scatter", "send_recv"}
    group : tuple of str
        GPU names; ``send_recv`` takes exactly two (sender, receiver).
    params : CollectiveParams, optional
        Launch latencies, software step latencies and achieved bandwidth fractions
        (the GPU's calibration).

    Notes
    -----
    With n ranks on m nodes of g GPUs and buffer S (REFERENCE.md section 2):
    ring all-reduce 2(n-1) steps of S/(n k) per rank per channel (k channels, one per rail
    across nodes); all-gather / reduce-scatter n-1 such steps; tree: reduce then broadcast
    of S/2 per tree edge over two trees; NVLS (one domain, switch reduces): S into and out
    of the switch per GPU; hierarchical: reduce-scatter in each node (g-1 steps of S/g),
    all-reduce of S/g across the m nodes per rail (2(m-1) steps of S/(g m)), all-gather in
    each node (g-1 steps of S/g); send_recv: one flow of S. GPUs of one full xGMI mesh
    (an AMD node) run each ring step as ``n - 1`` rings, one per link
    (:func:`_mesh_phase`); they have no NVLS.
    """
    if op not in OPS:
        raise ScenarioError(f"collective op: {op!r} is not one of {', '.join(OPS)}")
    p = params or CollectiveParams()
    links, n = Links(paths), len(group)
    if op == "send_recv":
        if n != 2:
            raise ScenarioError(f"collective --gpus: send_recv takes 2 GPUs (sender, "
                                f"receiver), got {n}")
        a, b = group
        return {"p2p": Schedule("p2p", 0.0, BANDWIDTH_EFFICIENCY,
                                (Phase(1, ((links(a, b), 1.0),), links.latency(a, b)),))}
    if n < 2:
        raise ScenarioError(f"collective --gpus: {op} needs at least 2 GPUs, got {n}")
    nodes = by_node(paths, group)
    orders = _ring_orders(nodes)
    k = len(orders)
    equal = len({len(m) for m in nodes}) == 1
    g, m = len(nodes[0]), len(nodes)
    out: dict[str, Schedule] = {}
    if op == "all_reduce":
        out["ring"] = Schedule("ring", p.ring_launch_s, p.ring_eff, (
            _ring_or_mesh(links, orders, 2 * (n - 1), 1 / (n * k), p.ring_step_s),))
        if p.tree_launch_s < math.inf:
            out["tree"] = Schedule("tree", p.tree_launch_s, p.tree_eff,
                                   _tree_phases(links, group, p.tree_step_s))
        if _in_switch(paths, group) and p.nvls_launch_s < math.inf:
            out["nvls"] = Schedule("nvls", p.nvls_launch_s, p.nvls_eff,
                                   (_switch_phase(paths, group, 1.0),))
        if m > 1 and equal and g > 1:
            rails = [[members[r] for members in nodes] for r in range(g)]
            st = p.ring_step_s
            out["hierarchical"] = Schedule("hierarchical", p.ring_launch_s, p.ring_eff, (
                _ring_or_mesh(links, nodes, g - 1, 1 / g, st),
                _ring_phase(links, rails, 2 * (m - 1), 1 / (g * m), st),
                _ring_or_mesh(links, nodes, g - 1, 1 / g, st)))
        return out
    launch, step, eff = ((p.gather_launch_s, p.gather_step_s, p.gather_eff)
                         if p.gather_launch_s < math.inf else
                         (p.ring_launch_s, p.ring_step_s, p.ring_eff))
    out["ring"] = Schedule("ring", launch, eff, (
        _ring_or_mesh(links, orders, n - 1, 1 / (n * k), step),))
    if _in_switch(paths, group) and p.nvls_launch_s < math.inf:
        out["nvls"] = Schedule("nvls", p.nvls_launch_s, p.nvls_eff,
                               (_switch_phase(paths, group, (n - 1) / n),))
    if m > 1 and equal and g > 1:
        rails = [[members[r] for members in nodes] for r in range(g)]
        intra = _ring_or_mesh(links, nodes, g - 1, 1 / g, step)
        inter = _ring_phase(links, rails, m - 1, 1 / (g * m), step)
        out["hierarchical"] = Schedule("hierarchical", launch, eff,
                                       (intra, inter) if op == "reduce_scatter"
                                       else (inter, intra))
    return out


def _phase_terms(paths: Paths, sched: list[Schedule]) -> tuple[float, float]:
    """``(alpha_s, beta_s_per_byte)`` of schedules of one algorithm run in lockstep: each
    phase's steps move the union of their flows, sharing links max-min fairly."""
    g = paths.g
    alpha, beta = max(s.launch_s for s in sched), 0.0
    for phases in zip(*(s.phases for s in sched), strict=True):
        flows = [f for ph in phases for f in ph.flows]
        cap = {e: g.edges[e]["bandwidth_Bps"] * sched[0].eff for edges, _ in flows for e in edges}
        done = finish_times([Flow(edges, share * _REF_BYTES) for edges, share in flows], cap)
        steps = phases[0].steps
        alpha += steps * max(ph.latency_s for ph in phases)
        beta += steps * float(done.max()) / _REF_BYTES
    return alpha, beta


def run_collectives(paths: Paths, op: str, groups: list[tuple[str, ...]], nbytes: float,
                    params: CollectiveParams | None = None,
                    algorithm: str | None = None) -> CollectiveResult:
    """Time of identical collectives over ``groups``, all started together, sharing links.

    NCCL's choice: the algorithm that finishes the whole set soonest at this size, unless
    ``algorithm`` forces one (an error when the topology does not offer it).

    Notes
    -----
    ``t = launch + sum over phases of steps * (latency + step transfer)``, the step
    transfer being the last finish among the step's flows of every group under max-min
    fair sharing (:func:`simulator.topology.flows.finish_times`). Flows scale with S, so
    the transfer is ``beta * S`` exactly.
    """
    per = [schedules(paths, op, grp, params) for grp in groups]
    names = [a for a in per[0] if all(a in s for s in per)]
    if algorithm is not None:
        if algorithm not in names:
            raise ScenarioError(f"collective --algorithm: {algorithm!r} is not available for "
                                f"{op} on these GPUs (available: {', '.join(names)})")
        names = [algorithm]
    best = None
    for name in names:
        alpha, beta = _phase_terms(paths, [s[name] for s in per])
        t = alpha + beta * nbytes
        if best is None or t < best[1]:
            best = (name, t)
    return CollectiveResult(op, best[0], best[1], float(nbytes), len(groups[0]), len(groups))


def multinode_allreduce(paths: Paths, group: tuple[str, ...],
                        params: CollectiveParams | None = None) -> AllReduceCost:
    """All-reduce over a group spanning nodes, as the engine uses it: each algorithm of
    :func:`schedules` alone on its links, ``alpha + beta * S``."""
    algos = schedules(paths, "all_reduce", group, params)
    nccl = tuple((name, *_phase_terms(paths, [s])) for name, s in algos.items())
    return AllReduceCost(nccl, len(group))


def group_cost(paths: Paths, op: str, group: tuple[str, ...],
               params: CollectiveParams | None = None) -> AllReduceCost:
    """``op`` (``all_gather`` or ``reduce_scatter``; ``all_reduce`` as
    :func:`multinode_allreduce`) over ``group`` as the engine uses it: each algorithm of
    :func:`schedules` alone on its links, ``alpha + beta * S`` with S the full buffer
    (every rank's shard together); nothing for one rank."""
    if len(group) <= 1:
        return AllReduceCost((("none", 0.0, 0.0),), len(group))
    algos = schedules(paths, op, group, params)
    return AllReduceCost(tuple((name, *_phase_terms(paths, [s])) for name, s in algos.items()),
                         len(group))
