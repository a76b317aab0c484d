"""The static plan of a run: a cluster (:class:`ClusterPlan`) of pools (:class:`PoolPlan`)
of replicas (:class:`ReplicaPlan`) on one graph.

A colocated scenario (``[parallel]``, no ``[[pools]]``) is a cluster of one pool; a scenario
with ``[[pools]]`` has one pool per entry, in file order. Everything here is derived from the
scenario and never written back into it: :func:`simulator.cluster.pools.build_plan` builds
either (a colocated scenario as one pool).
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from simulator.engine.speculative import SpecConfig
from simulator.hardware.specs import NodeSpec
from simulator.io.schema import PoolKeys, Scenario
from simulator.model.cost import StageCost
from simulator.model.memory import MemoryPlan
from simulator.model.spec import ModelSpec
from simulator.parallel.placement import ReplicaPlacement


@dataclass(frozen=True)
class ReplicaPlan:
    placement: ReplicaPlacement
    stages: tuple[StageCost, ...]
    sends: tuple[tuple[float, float], ...]  # (latency_s, s_per_token) from stage i to i+1
    swap_s_per_block: float  # one KV block over PCIe, the slowest stage (GPUs in parallel)


@dataclass(frozen=True)
class PoolPlan:
    """One pool: replicas of one layout, GPU and engine settings.

    ``scenario`` is the pool's own view of the run (its node preset, layout, engine keys,
    KV dtype and speculation; :func:`simulator.cluster.pools.pool_scenario`), ``spec`` its
    ``[[pools]]`` entry (None: the one pool of a colocated scenario, which ``[parallel]``,
    ``[engine]`` and ``[router]`` describe). ``replicas[k]`` is cluster-wide replica
    ``first_replica + k``.
    """

    scenario: Scenario
    model: ModelSpec
    node: NodeSpec
    memory: MemoryPlan
    replicas: tuple[ReplicaPlan, ...]
    streams_per_replica: int
    max_model_len: int
    swap_blocks_per_stream: int  # CPU blocks for swapped KV
    offload_units_per_stream: int = 0  # prefix-cache hash blocks the host tier holds
    speculative: SpecConfig | None = None  # [speculative]: drafts, acceptance, draft cost
    index: int = 0
    spec: PoolKeys | None = None
    first_replica: int = 0

    @property
    def name(self) -> str:
        """The ``[[pools]]`` name ("" for a colocated scenario's pool)."""
        return self.spec.name if self.spec is not None else ""

    @property
    def role(self) -> str:
        """``prefill``, ``decode`` or ``mixed`` (a colocated scenario's pool is mixed)."""
        return self.spec.role if self.spec is not None else "mixed"

    @property
    def router(self) -> str:
        """The routing policy of the pool's entry (its own, else ``[router]``'s)."""
        own = self.spec.router if self.spec is not None else None
        return own or self.scenario.router.policy

    @property
    def kv_dtype(self) -> str:
        return self.scenario.model.kv_dtype

    @property
    def gpus(self) -> int:
        p = self.scenario.parallel
        return p.tp * p.pp * p.dp


@dataclass(frozen=True)
class ClusterPlan:
    """Everything static about a run: its pools on one graph.

    The single-pool views (``node``, ``memory``, ``streams_per_replica``,
    ``swap_blocks_per_stream``, ``offload_units_per_stream``, ``speculative``) are those of
    :attr:`pool`, the one pool of a colocated plan; a plan of several pools raises
    ValueError there (read ``pools`` instead).
    """

    scenario: Scenario
    model: ModelSpec
    graph: nx.DiGraph
    pools: tuple[PoolPlan, ...]
    max_model_len: int

    @property
    def pooled(self) -> bool:
        """Whether the scenario has ``[[pools]]`` (it may still name one pool)."""
        return bool(self.scenario.pools)

    @property
    def gpus_used(self) -> int:
        return sum(p.gpus for p in self.pools)

    @property
    def speculates(self) -> bool:
        """Whether any pool speculates (each pool's own ``[speculative]``)."""
        return any(p.speculative is not None for p in self.pools)

    @property
    def replicas(self) -> tuple[ReplicaPlan, ...]:
        """Every replica, pools in order (index = cluster-wide replica number)."""
        if len(self.pools) == 1:
            return self.pools[0].replicas
        return tuple(r for p in self.pools for r in p.replicas)

    @property
    def pool(self) -> PoolPlan:
        """The one pool of a single-pool plan."""
        if len(self.pools) != 1:
            raise ValueError(f"the plan has {len(self.pools)} pools; read plan.pools")
        return self.pools[0]

    @property
    def node(self) -> NodeSpec:
        return self.pool.node

    @property
    def memory(self) -> MemoryPlan:
        return self.pool.memory

    @property
    def streams_per_replica(self) -> int:
        return self.pool.streams_per_replica

    @property
    def swap_blocks_per_stream(self) -> int:
        return self.pool.swap_blocks_per_stream

    @property
    def offload_units_per_stream(self) -> int:
        return self.pool.offload_units_per_stream

    @property
    def speculative(self) -> SpecConfig | None:
        return self.pool.speculative
