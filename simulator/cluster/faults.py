"""Faults: GPUs, nodes and links fail and come back; replicas that need them go down.

A target is ``node:N`` (every GPU, NIC, NVSwitch and host of node N), ``gpu:N`` (global GPU
index) or ``link:A-B`` (both directions of the graph edge between vertices A and B, as
``topology show`` names them). A replica is healthy while all its GPUs are up and every hop
it needs (TP ring neighbours, stage to stage) still has a path in the graph without the
failed parts: a failed link whose traffic can go another way costs only the detour. A
replica that turns unhealthy fails at once; one that turns healthy again restarts after
``recovery.restart_s`` (weights reload), if it is still healthy then.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import networkx as nx
import numpy as np
import simpy

from simulator.errors import ScenarioError
from simulator.io.schema import FaultSpec, RandomFaults


def resolve_target(g: nx.DiGraph, target: str) -> tuple[set[str], set[tuple[str, str]]]:
    """Graph vertices and (undirected) edges a target takes down; a ScenarioError names
    the target when it does not exist."""
    kind, _, name = target.partition(":")
    if kind == "node":
        nodes = {v for v, d in g.nodes(data=True) if str(d.get("node")) == name}
        if not name.isdigit() or not nodes:
            n = len({d["node"] for _, d in g.nodes(data=True) if "node" in d})
            raise ScenarioError(f"faults: target {target!r}: no such node (0..{n - 1})")
        return nodes, set()
    if kind == "gpu":
        if f"gpu{name}" not in g:
            n = sum(1 for _, d in g.nodes(data=True) if d.get("kind") == "gpu")
            raise ScenarioError(f"faults: target {target!r}: no such GPU (0..{n - 1})")
        return {f"gpu{name}"}, set()
    if kind == "link":
        a, _, b = name.partition("-")
        if not g.has_edge(a, b):
            raise ScenarioError(f"faults: target {target!r}: no link between {a!r} and {b!r} "
                                f"(links join e.g. gpu0-nvswitch0, gpu0-nic0, nic0-switch)")
        return set(), {tuple(sorted((a, b)))}
    raise ScenarioError(f"faults: target {target!r}: expected node:N, gpu:N or link:A-B")


class FaultState:
    """Which vertices and links are down (counted: overlapping faults nest)."""

    def __init__(self, g: nx.DiGraph):
        self.g = g
        self.nodes: Counter = Counter()
        self.edges: Counter = Counter()

    def apply(self, nodes: set, edges: set, sign: int) -> None:
        for v in nodes:
            self.nodes[v] += sign
        for e in edges:
            self.edges[e] += sign

    def view(self) -> nx.DiGraph:
        """The graph without what is down."""
        dead_nodes = {v for v, c in self.nodes.items() if c > 0}
        dead = [(a, b) for (a, b), c in self.edges.items() if c > 0]
        dead += [(b, a) for a, b in dead]
        return nx.restricted_view(self.g, dead_nodes, dead)

    def healthy(self, gpus: tuple[str, ...], hops: list[tuple[str, str]],
                view: nx.DiGraph) -> bool:
        if any(self.nodes[v] > 0 for v in gpus):
            return False
        return all(nx.has_path(view, a, b) for a, b in hops)


def replica_hops(stages: tuple[tuple[str, ...], ...]) -> list[tuple[str, str]]:
    """Hops a replica needs: around each TP ring, and from each stage to the next."""
    hops = []
    for group in stages:
        n = len(group)
        hops += [(group[i], group[(i + 1) % n]) for i in range(n) if n > 1]
    hops += [(a[0], b[0]) for a, b in zip(stages, stages[1:], strict=False)]
    return hops


def scheduled_faults(env: simpy.Environment, faults: tuple[FaultSpec, ...],
                     act: Callable[[str, int], None],
                     permanent: Callable[[str], None] | None = None):
    """Process: apply each scheduled fault at its time and undo it after its duration;
    ``permanent(target)`` is called after a fault without a duration is applied."""
    events = []
    for f in faults:
        events.append((f.at_s, 1, f.target, f.duration_s is None))
        if f.duration_s is not None:
            events.append((f.at_s + f.duration_s, -1, f.target, False))
    for t, sign, target, forever in sorted(events, key=lambda e: (e[0], -e[1])):
        if t > env.now:
            yield env.timeout(t - env.now)
        act(target, sign)
        if forever and permanent is not None:
            permanent(target)


def random_faults(env: simpy.Environment, spec: RandomFaults, g: nx.DiGraph,
                  rng: np.random.Generator, act: Callable[[str, int], None],
                  done: simpy.Event, horizon_s: float | None):
    """Process: failures as a Poisson process per component class (rate = components /
    MTBF), each repaired after ``repair_s``; stops once every request is accounted for."""
    classes = []
    gpus = sorted((d["index"] for _, d in g.nodes(data=True) if d.get("kind") == "gpu"))
    nodes = sorted({d["node"] for _, d in g.nodes(data=True) if "node" in d})
    links = sorted({tuple(sorted((a, b))) for a, b in g.edges})
    if spec.gpu_mtbf_h:
        classes.append((spec.gpu_mtbf_h, [f"gpu:{i}" for i in gpus]))
    if spec.node_mtbf_h:
        classes.append((spec.node_mtbf_h, [f"node:{n}" for n in nodes]))
    if spec.link_mtbf_h:
        classes.append((spec.link_mtbf_h, [f"link:{a}-{b}" for a, b in links]))
    if not classes:
        return
    rates = np.array([len(c) / (mtbf * 3600.0) for mtbf, c in classes])

    def repair(target: str):
        yield env.timeout(spec.repair_s)
        act(target, -1)

    while True:
        wait = rng.exponential(1.0 / rates.sum())
        timer = env.timeout(wait)
        yield timer | done
        if done.triggered or (horizon_s is not None and env.now > horizon_s):
            return
        _, targets = classes[int(rng.choice(len(classes), p=rates / rates.sum()))]
        target = targets[int(rng.integers(len(targets)))]
        act(target, 1)
        env.process(repair(target))
