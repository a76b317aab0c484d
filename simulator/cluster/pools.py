"""Build the static cluster of any scenario (:func:`build_plan`, the one entry point): a
colocated scenario is a cluster of one pool (:func:`simulator.cluster.build.build_colocated`);
a scenario with ``[[pools]]`` gets one graph joining the nodes of every pool, and per pool its
replicas placed on that graph, with the memory and step costs of the pool's own GPU, layout
and engine settings.

Each pool is checked as a scenario of its own (its node preset, ``tp``/``pp``/``dp`` and
engine overrides): :func:`simulator.cluster.build.build_colocated` says whether the model fits,
whether tp divides the heads, and sizes the KV cache. Its replicas are then placed on the
joined graph (the GPUs of the pool's nodes that earlier pools sharing them left free) and
priced on that graph. Every node's NICs sit on one fabric switch, so a KV transfer between
pools crosses NIC, switch, NIC, or NVLink when both GPUs share a node; with ``leaf_spine``
it crosses the leaves and spines as without pools (over several presets:
:func:`simulator.topology.graph.leaf_spine_graph`).
"""

from __future__ import annotations

from dataclasses import replace

import networkx as nx

from simulator.cluster.build import build_colocated, cluster_node, replica_costs
from simulator.cluster.plan import ClusterPlan, PoolPlan, ReplicaPlan
from simulator.errors import ScenarioError
from simulator.hardware.specs import NodeSpec, transfer_note
from simulator.io.schema import ParallelKeys, PoolKeys, Scenario
from simulator.model.spec import BYTES_PER_DTYPE, load_model
from simulator.parallel.placement import ReplicaPlacement, place
from simulator.topology.graph import Paths, add_server, leaf_spine_graph, nvlink_domains


def pool_scenario(s: Scenario, pool: PoolKeys, topology: str, nodes: int) -> Scenario:
    """The scenario a pool runs as on its own: its node preset and count, its layout (MoE
    keys ``ep``, ``attention_dp``, ``redundant_experts`` included), its engine overrides and
    KV dtype; no pools, no faults; its speculation (``PoolKeys.speculative_of``: the
    scenario's ``[speculative]``, the pool's ``[pools.speculative]`` keys over it, or none
    with ``speculative = false``) for decode and mixed pools only (a prefill pool emits one
    token per request: it never decodes, nor holds a drafter)."""
    engine = replace(s.engine, **(pool.engine or {}))
    return replace(s, cluster=replace(s.cluster, topology=topology, nodes=nodes),
                   parallel=ParallelKeys(tp=pool.tp, pp=pool.pp, dp=pool.dp,
                                         placement=pool.placement, ep=pool.ep,
                                         attention_dp=pool.attention_dp,
                                         redundant_experts=pool.redundant_experts,
                                         attention_tp=pool.attention_tp),
                   engine=engine, model=replace(s.model, kv_dtype=pool.kv_dtype
                                                or s.model.kv_dtype),
                   pools=(), faults=(), random_faults=None,
                   speculative=pool.speculative_of(s.speculative))


def joined_graph(nodes: list[NodeSpec]) -> nx.DiGraph:
    """Nodes of (possibly) different presets, every NIC on one fabric switch.

    The same vertices, links and attributes as :func:`simulator.topology.graph.build_graph`
    with ``fabric = "single_switch"``: node n's GPUs are numbered after those of nodes
    0..n-1, and each NIC link carries its own node's NIC bandwidth and latency plus half
    its preset's switch latency.
    """
    g = nx.DiGraph(name=" + ".join(n.name for n in nodes), node_type=nodes[0].name,
                   fabric="single_switch")
    g.graph["gpu"] = nodes[0].gpu
    g.graph["in_switch_reduction"] = all(n.scale_up.in_switch_reduction for n in nodes)
    if len(nodes) > 1:
        g.add_node("switch", kind="switch")
    first = 0
    for n, node in enumerate(nodes):
        add_server(g, node, n, first, (lambda _: "switch") if len(nodes) > 1 else None)
        first += node.gpus_per_node
    return g


def fabric_graph(s: Scenario, nodes: list[NodeSpec]) -> nx.DiGraph:
    """The pools' nodes joined by ``[cluster] fabric``: :func:`joined_graph` (one switch),
    or for ``leaf_spine`` :func:`simulator.topology.graph.leaf_spine_graph` (the same node
    numbering and GPU indices as :func:`joined_graph`; each node's NICs on the rails, every
    link at its own preset's line rate; over one preset, the graph
    :func:`simulator.topology.graph.build_graph` builds).
    """
    c = s.cluster
    if c.fabric != "leaf_spine":
        return joined_graph(nodes)
    return leaf_spine_graph(nodes, c.oversubscription, c.spines, c.rail_optimized,
                            c.nodes_per_leaf)


def build_plan(s: Scenario) -> ClusterPlan:
    """Check the scenario against model and hardware and derive its static cluster: one
    pool for a colocated scenario, one per ``[[pools]]`` entry (in file order) on the graph
    joining their nodes.

    Raises
    ------
    ScenarioError
        Naming the key: tp not dividing the heads, a layout larger than the cluster, a model
        that does not fit (and by how much), a max_model_len beyond the KV cache; with
        pools, naming the pool too: a ``same_nodes_as`` naming no earlier pool or another
        preset, a KV dtype that differs between prefill and decode pools.
    """
    if not s.pools:
        return build_colocated(s)
    try:
        return _join_pools(s)
    except ScenarioError as exc:
        raise exc.with_source(s.source) from None


def _join_pools(s: Scenario) -> ClusterPlan:
    model = load_model(s.model.name, s.base_dir)
    # Node groups: each pool either brings nodes of its own or shares an earlier pool's.
    specs: list[NodeSpec] = []
    first_node: dict[str, tuple[int, int, str]] = {}  # pool -> (first node, count, preset)
    subs, plans = [], []
    for i, pool in enumerate(s.pools):
        key = f"pools[{i}] ({pool.name})"
        if pool.same_nodes_as is not None:
            if pool.same_nodes_as not in first_node:
                raise ScenarioError(f"{key}.same_nodes_as: {pool.same_nodes_as!r} is not an "
                                    f"earlier pool (allowed: {', '.join(first_node) or 'none'})")
            start, count, topo = first_node[pool.same_nodes_as]
            if pool.topology is not None and pool.topology != topo:
                raise ScenarioError(f"{key}.topology: {pool.topology!r} differs from the "
                                    f"nodes it shares ({topo!r})")
        else:
            topo, count, start = pool.topology or s.cluster.topology, pool.nodes, len(specs)
        sub = pool_scenario(s, pool, topo, count)
        try:
            plan = build_colocated(sub).pool
        except ScenarioError as exc:
            raise ScenarioError([f"{key}: {p}" for p in exc.problems]) from None
        if pool.same_nodes_as is None:
            specs += [cluster_node(sub)] * count
        first_node[pool.name] = (start, count, topo)
        subs.append((sub, start, count))
        plans.append(plan)
    roles = [(i, p, p.kv_dtype or s.model.kv_dtype) for i, p in enumerate(s.pools)
             if p.role != "mixed"]
    for i, p, dt in roles:
        if dt != roles[0][2]:
            raise ScenarioError(f"pools[{i}] ({p.name}).kv_dtype: {dt} differs from "
                                f"{roles[0][2]} of pool {roles[0][1].name!r}; prefill and "
                                f"decode pools must keep KV in one dtype to hand it over")
    graph = fabric_graph(s, specs)
    domains = nvlink_domains(graph)
    node_of = {gpu: graph.nodes[gpu]["node"] for d in domains for gpu in d}
    used: set[str] = set()
    paths = Paths(graph)
    pools, first = [], 0
    for i, (pool, (sub, start, count), plan) in enumerate(zip(s.pools, subs, plans,
                                                              strict=True)):
        free = [[g for g in d if g not in used] for d in domains
                if start <= node_of[d[0]] < start + count]
        free = [d for d in free if d]
        try:
            placements = place(free, pool.tp, pool.pp, pool.dp, pool.placement)
        except ScenarioError as exc:
            raise ScenarioError([f"pools[{i}] ({pool.name}): {p} (GPUs left on its nodes: "
                                 f"{sum(map(len, free))})" for p in exc.problems]) from None
        node = plan.node
        replicas, shared = [], {}
        for k, pl in enumerate(placements):
            pl = ReplicaPlacement(first + k, pl.stages)
            used.update(pl.gpus)
            stages, sends = replica_costs(sub, model, node, pl, paths, shared)
            host = [paths.transfer_time(g[0], f"host{graph.nodes[g[0]]['node']}",
                                        plan.memory.block_bytes_per_gpu[j])
                    for j, g in enumerate(pl.stages)]
            replicas.append(ReplicaPlan(pl, stages, sends, max(host)))
        pools.append(replace(plan, replicas=tuple(replicas), index=i, spec=pool,
                             first_replica=first))
        first += len(replicas)
    max_len = min(p.max_model_len for p in pools)
    return ClusterPlan(s, model, graph, tuple(pools), max_len)


def kv_element_bytes(pool: PoolPlan) -> float:
    """Bytes of one KV element in the pool's KV dtype."""
    return BYTES_PER_DTYPE[pool.kv_dtype]


def describe_pools(plan: ClusterPlan) -> str:
    """Text lines of ``validate`` for a cluster of pools: per pool its role, nodes, layout,
    KV cache and replicas' GPUs."""
    lines = [f"  cluster    {plan.graph.graph['name']}, {plan.gpus_used} GPUs used, "
             f"max_model_len {plan.max_model_len}"]
    for pool in plan.pools:
        sp, mem = pool.spec, pool.memory
        moe = (f" ep={sp.ep}" if sp.ep > 1 else "") + (" attention_dp" if sp.attention_dp
                                                         else "")
        spec = pool.scenario.speculative
        moe += (f", speculative {spec.method} k={spec.num_speculative_tokens}"
                if spec is not None else "")
        lines.append(f"  pool {sp.name} ({sp.role})  {pool.node.name}, tp={sp.tp} "
                     f"pp={sp.pp} dp={sp.dp}{moe}, KV {pool.kv_dtype} {mem.kv_tokens} tokens per "
                     f"replica, weights {max(mem.weights_per_gpu) / 2**30:.1f} GiB per GPU")
        if transfer_note(pool.node.gpu):  # docs/hardware.md
            lines.append(f"    kernels  {transfer_note(pool.node.gpu)}")
        for rp in pool.replicas:
            stages = " | ".join(",".join(g.removeprefix("gpu") for g in st)
                                for st in rp.placement.stages)
            lines.append(f"    replica {rp.placement.replica}  GPUs {stages}")
    return "\n".join(lines)
