"""The scenario as frozen dataclasses: every key, its type, default and allowed values.

The dataclass fields are the contract of the TOML file. Constraints live in field metadata
(``min``, ``gt``, ``choices``, ``kind``) and are checked by :mod:`simulator.io.scenario`.
Derived values (KV blocks, world size) are never stored here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Weight dtypes (int4: weight-only; fp8, int8, fp4: weights and activations) and KV dtypes
#: (bf16, fp16, fp8). What a GPU supports is checked when the cluster is built.
DTYPES = ("bf16", "fp16", "fp8", "int8", "int4", "fp4")
ARRIVALS = ("poisson", "gamma", "constant", "closed_loop", "trace", "sessions")
ROUTERS = ("round_robin", "random", "least_outstanding", "least_kv", "least_tokens",
           "power_of_two", "prefix_aware", "kv_aware", "session_affinity")
SCHEDULERS = ("vllm", "vllm_v0", "sarathi", "orca", "static")
#: Keyword parameters each scheduler takes in ``[engine] scheduler_args`` (all integers >= 1).
SCHEDULER_PARAMS = {"vllm": (), "vllm_v0": (), "sarathi": ("chunk_size",),
                    "orca": ("reserve_tokens",), "static": ("reserve_tokens",)}
PREEMPTION = ("recompute", "swap")
LENGTH_DISTS = ("constant", "uniform", "normal", "lognormal", "exponential")
#: Engine profiles (simulator/engine/profiles.py) and CUDA-graph capture rules.
PROFILES = ("vllm-v0.6", "vllm-v1", "sglang", "trtllm")
CUDA_GRAPHS = ("none", "vllm-v0.6", "vllm-v1", "sglang", "trtllm")


def _f(default: Any = None, **meta: Any) -> Any:
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class ModelSpecKeys:
    name: str = _f("llama-3.1-8b", kind="model")
    weight_dtype: str = _f("bf16", choices=DTYPES)
    kv_dtype: str = _f("bf16", choices=DTYPES)


@dataclass(frozen=True)
class ClusterKeys:
    topology: str = _f("dgx-h100", kind="topology")
    nodes: int = _f(1, min=1)
    # How nodes are joined: the preset's own fabric unless set.
    fabric: str | None = _f(None, choices=("single_switch", "leaf_spine"), optional=True)
    oversubscription: float = _f(1.0, min=1.0)  # leaf_spine: downlink / uplink bandwidth
    spines: int | None = _f(None, min=1, optional=True)  # leaf_spine: spine switches
    # leaf_spine: NIC r of every node on leaf r (true), or a node's NICs on its rack's leaf,
    # nodes_per_leaf nodes per leaf (false: traffic between racks crosses the spines).
    rail_optimized: bool = _f(True)
    nodes_per_leaf: int = _f(1, min=1)
    # The preset's NIC line rate per GPU (Gb/s, as NICs are sold: 400 = NDR) and the fabric
    # switch latency (s), unless set.
    nic_gbps: float | None = _f(None, gt=0.0, optional=True)
    switch_latency_s: float | None = _f(None, min=0.0, optional=True)


@dataclass(frozen=True)
class ParallelKeys:
    tp: int = _f(1, min=1)
    pp: int = _f(1, min=1)
    dp: int = _f(1, min=1)
    # spread: replicas on the nodes with the most free GPUs (across failure domains);
    # packed: fill nodes in order.
    placement: str = _f("spread", choices=("spread", "packed"))


@dataclass(frozen=True)
class EngineKeys:
    scheduler: str = _f("vllm", choices=SCHEDULERS)
    scheduler_args: dict | None = _f(None, kind="table", optional=True)
    # What a request that loses its KV blocks does: re-prefill, or copy them to CPU and back.
    preemption: str = _f("recompute", choices=PREEMPTION)
    swap_space_gib: float = _f(4.0, min=0.0)  # CPU memory for swapped KV, GiB per GPU
    max_num_seqs: int = _f(256, min=1)
    max_num_batched_tokens: int = _f(8192, min=1)
    block_size: int = _f(16, min=1)
    gpu_memory_utilization: float = _f(0.9, gt=0.0, max=1.0)
    max_model_len: int | None = _f(None, min=1, optional=True)
    max_inflight_microbatches: int | None = _f(None, min=1, optional=True)
    # CPU time per step (scheduling, input preparation, sampling launch), seconds.
    step_overhead_s: float = _f(0.003, min=0.0)
    # Memory kept for the CUDA context, NCCL buffers and CUDA graphs, GiB per GPU.
    runtime_reserve_gib: float = _f(1.0, min=0.0)
    # Advance runs of decode-only steps in one event; results are identical either way.
    fast_forward: bool = _f(True)
    # vLLM's custom all-reduce for TP groups of 2, 4, 6 or 8 GPUs on one NVLink domain
    # (messages up to 8 MiB); false: NCCL only.
    custom_allreduce: bool = _f(True)
    # CPU time to launch one layer's kernels without CUDA graphs (eager mode), seconds;
    # 0 with CUDA graphs. A stage takes at least layers x this.
    layer_launch_s: float = _f(0.0, min=0.0)
    # A named bundle of the keys below and above (docs/cost-model.md, "Engine profiles");
    # keys set here override it. None: the defaults above.
    profile: str | None = _f(None, choices=PROFILES, optional=True)
    # CUDA graphs: the capture-size rule of an engine ("none": not modelled) and its largest
    # captured batch (None: the rule's default). Covered steps run padded to a captured
    # size; larger ones run eagerly (layer_launch_s applies).
    cuda_graphs: str = _f("none", choices=CUDA_GRAPHS)
    cuda_graph_max_batch: int | None = _f(None, min=1, optional=True)
    # The CPU's per-step work overlaps the GPU step (async scheduling): a step takes
    # max(step_overhead_s, GPU compute) + communication instead of their sum.
    cpu_overlap: bool = _f(False)
    # Seconds between a token's step end and the client seeing it (output processing,
    # detokenization, streaming); shifts first-token and finish times.
    token_delay_s: float = _f(0.0, min=0.0)
    # Automatic prefix caching (vLLM v1 default): reuse cached KV blocks of shared prefixes
    # (needs a workload with block hashes: a Mooncake trace or sessions).
    prefix_caching: bool = _f(True)
    # Host-memory tier of the prefix cache, GiB per GPU (0: evicted blocks are lost).
    kv_offload_gib: float = _f(0.0, min=0.0)


@dataclass(frozen=True)
class RouterKeys:
    policy: str = _f("round_robin", choices=ROUTERS)
    # kv_aware: score = cached prompt tokens - load_weight x load tokens.
    load_weight: float = _f(1.0, min=0.0)


@dataclass(frozen=True)
class WorkloadKeys:
    arrival: str = _f("poisson", choices=ARRIVALS)
    rate_per_s: float | None = _f(None, gt=0.0, optional=True)
    cv: float = _f(1.0, gt=0.0)  # gamma arrivals: coefficient of variation of the gaps
    concurrency: int | None = _f(None, min=1, optional=True)
    think_time_s: float = _f(0.0, min=0.0)  # closed_loop: pause between a reply and the next
    num_requests: int | None = _f(None, min=1, optional=True)
    duration_s: float | None = _f(None, gt=0.0, optional=True)
    prompt_tokens: Any = _f(1024, kind="length")
    output_tokens: Any = _f(256, kind="length")
    trace: str | None = _f(None, kind="path", optional=True)
    time_scale: float = _f(1.0, gt=0.0)  # trace: arrival times are multiplied by this
    start_s: float = _f(0.0, min=0.0)  # trace: skip arrivals before this offset
    # Tokens per prefix hash block (a Mooncake trace's hash_ids: 512; sessions' blocks).
    hash_block_tokens: int = _f(512, min=1)
    # sessions: turns per session (a length spec), system prompt shared by each of
    # prefix_groups groups (sessions pick one uniformly).
    turns: Any = _f(4, kind="length")
    shared_prefix_tokens: int = _f(0, min=0)
    prefix_groups: int = _f(1, min=1)


@dataclass(frozen=True)
class SloKeys:
    ttft_s: float = _f(2.0, gt=0.0)
    tpot_s: float = _f(0.1, gt=0.0)


@dataclass(frozen=True)
class OutputKeys:
    steps: bool = _f(True)  # write steps.csv (one row per stage step); off for very long runs
    trace: bool = _f(True)  # write trace.json (Perfetto); needs steps
    window_s: float = _f(1.0, gt=0.0)  # timeseries.csv window


@dataclass(frozen=True)
class RecoveryKeys:
    """What happens to requests on a replica that goes down, and how long it takes back."""

    retry: str = _f("reroute", choices=("reroute", "drop"))
    max_retries: int = _f(2, min=0)
    restart_s: float = _f(90.0, min=0.0)  # reload weights once the replica's GPUs are back
    # A client gives up on a request that has waited this long with no replica up (None:
    # it waits until one is back, or is dropped at the end of the workload).
    pending_timeout_s: float | None = _f(None, gt=0.0, optional=True)


@dataclass(frozen=True)
class FaultSpec:
    """A scheduled fault: ``target`` (node:N, gpu:N or link:A-B) fails at ``at_s`` for
    ``duration_s`` seconds (None: for good)."""

    at_s: float
    target: str
    duration_s: float | None = None


@dataclass(frozen=True)
class RandomFaults:
    """Faults drawn at random: exponential times between failures per component."""

    gpu_mtbf_h: float | None = _f(None, gt=0.0, optional=True)
    node_mtbf_h: float | None = _f(None, gt=0.0, optional=True)
    link_mtbf_h: float | None = _f(None, gt=0.0, optional=True)
    repair_s: float = _f(600.0, gt=0.0)


@dataclass(frozen=True)
class AlertKeys:
    """Thresholds of the alert rules over each window; 0 disables a rule."""

    ttft_p99_s: float = _f(2.0, min=0.0)
    e2e_p99_s: float = _f(30.0, min=0.0)
    batch_efficiency_min: float = _f(0.6, min=0.0, max=1.0)


#: Roles of a ``[[pools]]`` entry and the two ways a prefill pool hands KV to decode.
POOL_ROLES = ("prefill", "decode", "mixed")
KV_TRANSFER_MODES = ("after_prefill", "layerwise")


@dataclass(frozen=True)
class PoolKeys:
    """One ``[[pools]]`` entry (docs/disaggregation.md): a set of replicas of one role on
    its own nodes, layout and engine settings."""

    name: str = _f("pool")
    role: str = _f("mixed", choices=POOL_ROLES)
    topology: str | None = _f(None, kind="topology", optional=True)  # None: [cluster]'s
    nodes: int = _f(1, min=1, max=4096)
    # The name of an earlier pool whose nodes this one shares (its GPUs left free by that
    # pool; ``nodes`` and ``topology`` then come from it). None: nodes of its own.
    same_nodes_as: str | None = _f(None, optional=True)
    tp: int = _f(1, min=1, max=1024)
    pp: int = _f(1, min=1, max=1024)
    dp: int = _f(1, min=1, max=65536)
    placement: str = _f("spread", choices=("spread", "packed"))
    router: str | None = _f(None, choices=ROUTERS, optional=True)  # None: [router]'s
    kv_dtype: str | None = _f(None, choices=DTYPES, optional=True)  # None: [model]'s
    # Price of one GPU of this pool per hour, USD (None: no cost figures).
    gpu_hour_usd: float | None = _f(None, min=0.0, max=10000.0, optional=True)
    # prefill pools: move the KV after the prefill ends, or layer by layer during it.
    kv_transfer: str = _f("after_prefill", choices=KV_TRANSFER_MODES)
    engine: dict | None = _f(None, kind="table", optional=True)  # [engine] keys overridden


@dataclass(frozen=True)
class Scenario:
    """A validated scenario. ``base_dir`` resolves relative paths (the file's folder)."""

    name: str = "scenario"
    seed: int = 0
    model: ModelSpecKeys = ModelSpecKeys()
    cluster: ClusterKeys = ClusterKeys()
    parallel: ParallelKeys = ParallelKeys()
    engine: EngineKeys = EngineKeys()
    router: RouterKeys = RouterKeys()
    workload: WorkloadKeys = WorkloadKeys()
    slo: SloKeys = SloKeys()
    output: OutputKeys = OutputKeys()
    alerts: AlertKeys = AlertKeys()
    recovery: RecoveryKeys = RecoveryKeys()
    faults: tuple[FaultSpec, ...] = ()
    random_faults: RandomFaults | None = None
    pools: tuple[PoolKeys, ...] = ()  # empty: one mixed pool from [cluster] and [parallel]
    base_dir: str = "."
    source: str | None = None


SECTIONS: dict[str, type] = {
    "model": ModelSpecKeys,
    "cluster": ClusterKeys,
    "parallel": ParallelKeys,
    "engine": EngineKeys,
    "router": RouterKeys,
    "workload": WorkloadKeys,
    "slo": SloKeys,
    "output": OutputKeys,
    "alerts": AlertKeys,
    "recovery": RecoveryKeys,
}
TOP_LEVEL = {"name": str, "seed": int}
