"""The scenario as frozen dataclasses: every key, its type, default and allowed values.

The dataclass fields are the contract of the TOML file. Constraints live in field metadata
(``min``, ``gt``, ``choices``, ``kind``) and are checked by :mod:`simulator.io.scenario`.
Derived values (KV blocks, world size) are never stored here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from simulator import registry

#: Weight dtypes (int4: weight-only; fp8, int8, fp4: weights and activations) and KV dtypes
#: (bf16, fp16, fp8). What a GPU supports is checked when the cluster is built.
DTYPES = ("bf16", "fp16", "fp8", "int8", "int4", "fp4")
ARRIVALS = ("poisson", "gamma", "constant", "closed_loop", "trace", "sessions")
PREEMPTION = ("recompute", "swap")
LENGTH_DISTS = ("constant", "uniform", "normal", "lognormal", "exponential")
SPEC_METHODS = ("draft_model", "eagle", "mtp", "ngram")
#: Engines whose parallel flags ``[parallel] convention`` reads (simulator/io/layout.py).
CONVENTIONS = ("vllm", "sglang", "trtllm")


def _f(default: Any = None, **meta: Any) -> Any:
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class ModelSpecKeys:
    name: str = _f("llama-3.1-8b", kind="model")
    weight_dtype: str = _f("bf16", choices=DTYPES)
    kv_dtype: str = _f("bf16", choices=DTYPES)
    # MoE all-to-all (attention DP): DeepEP "normal" (prefill), "low_latency" (decode), or
    # "auto" (normal for steps with prefill, low_latency for decode-only steps).
    moe_a2a_mode: str = _f("auto", choices=("auto", "normal", "low_latency"))
    # [model.routing]: distribution = "uniform" | "zipf", skew (zipf exponent),
    # weights_file (one weight per expert). Checked in simulator.io.scenario.
    routing: dict | None = _f(None, kind="table", optional=True)
    # Two micro-batches per step whose all-to-all and compute overlap (attention DP only).
    two_batch_overlap: bool = _f(False)


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
    # Price of one GPU-hour, USD (simulator/hardware/prices.py defaults by GPU).
    gpu_hour_usd: float | None = _f(None, min=0.0, optional=True)


@dataclass(frozen=True)
class ParallelKeys:
    tp: int = _f(1, min=1)
    pp: int = _f(1, min=1)
    dp: int = _f(1, min=1)
    # spread: replicas on the nodes with the most free GPUs (across failure domains);
    # packed: fill nodes in order.
    placement: str = _f("spread", choices=("spread", "packed"))
    # MoE models: expert parallelism over the tp GPUs of a stage (ep divides tp; each expert
    # sliced over tp / ep GPUs: 1 is "MoE-TP", tp whole experts), attention data parallel
    # (each attention group of attention_tp GPUs runs attention for its own requests), and
    # extra expert replicas (EPLB) spread over the EP ranks (docs/moe.md, "Layouts").
    ep: int = _f(1, min=1)
    attention_dp: bool = _f(False)
    redundant_experts: int = _f(0, min=0)
    # Attention TP inside each attention-DP group (attention_dp only; None: 1).
    attention_tp: int | None = _f(None, min=1, optional=True)
    # Whose flags the keys above spell (None: the simulator's own, SGLang-like; "vllm",
    # "sglang", "trtllm": that engine's, translated when the scenario is read; the resolved
    # scenario shows the simulator's spelling). moe_tp is TensorRT-LLM's moe_tp_size;
    # replicas the engines behind the router where dp means the engine's own DP ranks.
    convention: str | None = _f(None, choices=CONVENTIONS, optional=True)
    moe_tp: int | None = _f(None, min=1, optional=True)
    replicas: int | None = _f(None, min=1, optional=True)
    # Whose KV-head rule applies (None: the convention's, else the [engine] profile's, else
    # vLLM's): vLLM and SGLang need tp to divide the KV heads or be a multiple of them,
    # TensorRT-LLM gives each GPU ceil(kv / tp) of them.
    heads_rule: str | None = _f(None, choices=CONVENTIONS, optional=True)


@dataclass(frozen=True)
class EngineKeys:
    scheduler: str = _f("vllm", choices=registry.SCHEDULERS)
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
    # CPU time per step (scheduling, input preparation, sampling launch), seconds: the
    # fixed part of the engine's host work per step.
    step_overhead_s: float = _f(0.003, min=0.0)
    # The host work that grows with the step, seconds per scheduled sequence (scheduling,
    # sampling, detokenization, output streaming) and per scheduled token (input
    # preparation); overlapped or in line with the GPU as cpu_overlap says.
    host_seq_s: float = _f(0.0, min=0.0)
    host_token_s: float = _f(0.0, min=0.0)
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
    # keys set here override it. "none": the defaults above; unset: vllm-v1.
    profile: str | None = _f(None, choices=registry.PROFILES, optional=True)
    # CUDA graphs: the capture-size rule of an engine ("none": not modelled) and its largest
    # captured batch (None: the rule's default). Covered steps run padded to a captured
    # size; larger ones run eagerly (layer_launch_s applies).
    cuda_graphs: str = _f("none", choices=registry.CAPTURE_RULES)
    cuda_graph_max_batch: int | None = _f(None, min=1, optional=True)
    # The CPU's per-step work overlaps the GPU step (async scheduling): a step takes
    # max(step_overhead_s, GPU compute) + communication instead of their sum.
    cpu_overlap: bool = _f(False)
    # The API server in front of the engine (one process, requests in turn): seconds per
    # request (HTTP, validation) and per prompt token (tokenization) before the engine
    # sees a closed-loop client's request; TTFT counts them.
    api_request_s: float = _f(0.0, min=0.0)
    api_token_s: float = _f(0.0, min=0.0)
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
    policy: str = _f("round_robin", choices=registry.ROUTERS)
    # kv_aware: score = cached prompt tokens - load_weight x load tokens.
    load_weight: float = _f(1.0, min=0.0)
    # The replicas' load as of the router's last metrics scrape, every refresh_s (None:
    # live).
    refresh_s: float | None = _f(None, gt=0.0, optional=True)


@dataclass(frozen=True)
class WorkloadKeys:
    arrival: str = _f("poisson", choices=ARRIVALS)
    rate_per_s: float | None = _f(None, gt=0.0, optional=True)
    cv: float = _f(1.0, gt=0.0)  # gamma arrivals: coefficient of variation of the gaps
    concurrency: int | None = _f(None, min=1, optional=True)
    # closed_loop: a named benchmark client's warm-up and front end (docs/scenario.md,
    # "Benchmark clients"); warmup_requests overrides its warm-up count.
    client: str | None = _f(None, choices=registry.CLIENTS, optional=True)
    warmup_requests: int | None = _f(None, min=0, optional=True)
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
    # [workload.rate_profile]: the rate over time (diurnal, steps, bursts, noise); a
    # multiplier of the trace's rate over a replay. Checked in simulator.workload.profile.
    rate_profile: dict | None = _f(None, kind="table", optional=True)


@dataclass(frozen=True)
class SloKeys:
    ttft_s: float = _f(2.0, gt=0.0)
    tpot_s: float = _f(0.1, gt=0.0)


@dataclass(frozen=True)
class OutputKeys:
    steps: bool = _f(True)  # write steps.csv (one row per stage step); off for very long runs
    trace: bool = _f(True)  # write trace.json (Perfetto); needs steps
    # At most this many steps in the trace: a longer run's trace covers its first steps (the
    # time window up to the first step left out), so Perfetto can open it; 0: every step.
    trace_max_steps: int = _f(500_000, min=0)
    window_s: float = _f(1.0, gt=0.0)  # timeseries.csv window
    format: str = _f("csv", choices=("csv", "parquet"))  # the four tables' file format
    trace_gzip: bool = _f(True)  # trace.json.gz (about 9x smaller) rather than trace.json
    # Energy, power and the MoE summary without step records (steps = false): folded from
    # the steps as the run goes, at about 1.6x the run time on decode-heavy runs. With step
    # records they come from the records at no cost, whatever this key says.
    energy: bool = _f(False)


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
    queue_len_max: float = _f(0.0, min=0.0)
    oldest_queued_s: float = _f(0.0, min=0.0)
    waiting_ttft_s: float = _f(5.0, min=0.0)
    min_completions: int = _f(10, min=1)
    # Hysteresis: a rule fires after this many windows in a row break it, and clears after
    # this many in a row do not (windows without a value do not count either way).
    fire_after: int = _f(2, min=1)
    clear_after: int = _f(3, min=1)


@dataclass(frozen=True)
class SpeculativeKeys:
    """Speculative decoding (optional section; docs/speculative.md). Set ``acceptance``
    (one probability alpha: geometric; or a list of k per-position probabilities, each
    given the previous drafts were accepted) or ``mean_accepted_tokens`` (drafts accepted
    per step, 0..k: the geometric model with that mean)."""

    method: str | None = _f(None, choices=SPEC_METHODS, optional=True)
    num_speculative_tokens: int = _f(3, min=1)
    draft_model: str | None = _f(None, kind="model", optional=True)  # method = draft_model
    acceptance: Any = _f(None, kind="acceptance", optional=True)
    mean_accepted_tokens: float | None = _f(None, min=0.0, optional=True)
    # Steps scheduled while this many requests or more run decode without speculation.
    disable_by_batch_size: int | None = _f(None, min=1, optional=True)


#: Roles of a ``[[pools]]`` entry and the two ways a prefill pool hands KV to decode.
POOL_ROLES = ("prefill", "decode", "mixed")
KV_TRANSFER_MODES = ("after_prefill", "layerwise")
#: Where the client's stream gets a disaggregated request's first token from.
FIRST_TOKEN_SOURCES = ("prefill", "decode")


SCALE_METRICS = ("outstanding_per_replica", "queued_per_replica", "kv_util")
WEIGHT_SOURCES = ("nvme", "nfs", "object_store", "peer")


@dataclass(frozen=True)
class AutoscaleKeys:
    """``[autoscale]``: replicas added and removed while the run goes (docs/autoscaling.md)."""

    policy: str = _f("none", choices=registry.AUTOSCALE_POLICIES)
    min_replicas: int = _f(1, min=1)
    max_replicas: int | None = _f(None, min=1, optional=True)  # None: parallel.dp
    initial_replicas: int | None = _f(None, min=1, optional=True)  # None: min_replicas
    interval_s: float = _f(60.0, gt=0.0)  # how often the policy looks and decides
    cooldown_up_s: float = _f(0.0, min=0.0)  # after a scale-up, no other before this
    cooldown_down_s: float = _f(300.0, min=0.0)  # after any scaling, no scale-down before
    # A cold start: provisioning, then the weights over the source's bandwidth, then
    # CUDA-graph capture and warm-up; then the router sees the replica.
    provision_s: float = _f(30.0, min=0.0)
    weights_from: str = _f("nvme", choices=WEIGHT_SOURCES)
    weights_bandwidth_Bps: float | None = _f(None, gt=0.0, optional=True)  # per node
    graph_capture_s: float = _f(20.0, min=0.0)
    # policy = "load": thresholds on a per-replica metric with hysteresis.
    metric: str = _f("outstanding_per_replica", choices=SCALE_METRICS)
    target: float = _f(8.0, gt=0.0)  # the metric per replica the policy sizes for
    scale_down_below: float = _f(0.5, min=0.0)  # scale down only under target x this
    up_intervals: int = _f(1, min=1)  # consecutive intervals wanting more before adding
    down_intervals: int = _f(3, min=1)  # ... wanting fewer before removing
    # policy = "sla": forecast the next interval's arrival rate, size for it.
    forecaster: str = _f("moving_average", choices=registry.FORECASTERS)
    window: int = _f(5, min=1)  # moving_average: intervals averaged
    smoothing: float = _f(0.5, gt=0.0, max=1.0)  # holt_winters: level weight (alpha)
    trend_smoothing: float = _f(0.1, min=0.0, max=1.0)  # holt_winters: trend weight (beta)
    season_intervals: int = _f(0, min=0)  # holt_winters: season length (0: none)
    kalman_q_over_r: float = _f(0.1, gt=0.0)  # kalman: process over measurement noise
    replica_capacity_per_s: float | None = _f(None, gt=0.0, optional=True)
    target_utilization: float = _f(0.8, gt=0.0, max=1.0)


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
    router: str | None = _f(None, choices=registry.ROUTERS, optional=True)  # None: [router]'s
    kv_dtype: str | None = _f(None, choices=DTYPES, optional=True)  # None: [model]'s
    # Price of one GPU of this pool per hour, USD (None: no cost figures).
    gpu_hour_usd: float | None = _f(None, min=0.0, max=10000.0, optional=True)
    # prefill pools: move the KV after the prefill ends, or layer by layer during it.
    kv_transfer: str = _f("after_prefill", choices=KV_TRANSFER_MODES)
    # prefill pools: the client sees the first token when the prefill instance computes it
    # (None: "prefill"), or when the decode instance has its KV ("decode": the front end
    # streams every token from the decode side).
    first_token: str | None = _f(None, choices=FIRST_TOKEN_SOURCES, optional=True)
    engine: dict | None = _f(None, kind="table", optional=True)  # [engine] keys overridden
    # MoE models, as in [parallel] (the simulator's spelling): expert parallelism over a
    # stage's tp GPUs (divides tp), attention data parallel over groups of attention_tp
    # GPUs (None: 1), extra expert replicas (needs ep > 1).
    ep: int = _f(1, min=1, max=1024)
    attention_dp: bool = _f(False)
    redundant_experts: int = _f(0, min=0, max=4096)
    attention_tp: int | None = _f(None, min=1, max=1024, optional=True)
    # Decode and mixed pools: None speculates as [speculative] says (if present); false: this
    # pool does not; a table: [speculative] keys for this pool, over the section's.
    speculative: bool | dict | None = _f(None, kind="pool_speculative", optional=True)
    # Prefill and decode pools: ``[autoscale]`` keys for this pool alone (an inline table,
    # kept as the checked values of the keys it sets; :meth:`autoscale_of`). None: the
    # pool's ``dp`` replicas serve for the whole run (docs/autoscaling.md).
    autoscale: dict | None = _f(None, kind="table", optional=True)

    def speculative_of(self, top: SpeculativeKeys | None) -> SpeculativeKeys | None:
        """This pool's speculation: none for a prefill pool or ``speculative = false``, the
        ``[pools.speculative]`` keys over ``top`` (the scenario's section, or the defaults
        without one), or ``top`` itself."""
        if self.role == "prefill" or self.speculative is False:
            return None
        if isinstance(self.speculative, dict):
            return replace(top or SpeculativeKeys(), **self.speculative)
        return top

    def autoscale_of(self) -> AutoscaleKeys | None:
        """This pool's scaling keys (None: it does not scale)."""
        return None if self.autoscale is None else AutoscaleKeys(**self.autoscale)


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
    speculative: SpeculativeKeys | None = None
    autoscale: AutoscaleKeys | None = None
    # [gateway] with [[gateway.classes]]: checked by simulator.cluster.gateway.parse_gateway.
    gateway: dict | None = None


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


# -- physical ranges ------------------------------------------------------------------------
#: Most tokens in one prompt, output, step budget or context: 16 Mi, beyond any model's.
MAX_TOKENS = 2**24
#: Longest simulated time a key may ask for (s): 2**23 s (97 days) is the range in which the
#: clock's times stay exact (simulator.engine.clock).
MAX_TIME_S = float(2**23)
#: Most requests one run may draw (10 million: a run's tables then hold ~2 GB).
MAX_REQUESTS = 10_000_000
#: Bounds of the numeric keys beyond the ``min``/``gt``/``max`` of their field metadata,
#: by dotted key (``faults.random.*`` for every ``[faults.random]`` table). A value outside
#: is an error that names the key and the range; docs/scenario.md lists them.
LIMITS: dict[str, dict[str, float]] = {
    "cluster.nodes": {"max": 4096},
    "cluster.oversubscription": {"max": 64.0},
    "cluster.spines": {"max": 4096},
    "cluster.nodes_per_leaf": {"max": 4096},
    "cluster.nic_gbps": {"min": 1.0, "max": 10_000.0},
    "cluster.switch_latency_s": {"max": 1e-3},
    "cluster.gpu_hour_usd": {"max": 10000.0},
    "parallel.tp": {"max": 1024},
    "parallel.pp": {"max": 1024},
    "parallel.dp": {"max": 65536},
    "parallel.ep": {"max": 1024},
    "parallel.attention_tp": {"max": 1024},
    "parallel.moe_tp": {"max": 1024},
    "parallel.replicas": {"max": 65536},
    "parallel.redundant_experts": {"max": 65536},
    "engine.swap_space_gib": {"max": 4096.0},
    "engine.max_num_seqs": {"max": 65536},
    "engine.max_num_batched_tokens": {"max": MAX_TOKENS},
    "engine.block_size": {"max": 1024},
    "engine.max_model_len": {"max": MAX_TOKENS},
    "engine.max_inflight_microbatches": {"max": 1024},
    "engine.step_overhead_s": {"max": 1.0},
    "engine.host_seq_s": {"max": 0.01},
    "engine.host_token_s": {"max": 0.001},
    "engine.api_request_s": {"max": 10.0},
    "engine.api_token_s": {"max": 0.001},
    "engine.runtime_reserve_gib": {"max": 1024.0},
    "engine.layer_launch_s": {"max": 0.1},
    "engine.cuda_graph_max_batch": {"max": 65536},
    "engine.token_delay_s": {"max": 60.0},
    "engine.kv_offload_gib": {"max": 65536.0},
    "router.load_weight": {"max": 1e6},
    "router.refresh_s": {"max": MAX_TIME_S},
    "workload.rate_per_s": {"min": 1e-6, "max": 1e6},
    "workload.cv": {"min": 0.01, "max": 100.0},
    "workload.concurrency": {"max": 100_000},
    "workload.warmup_requests": {"max": 100_000},
    "workload.think_time_s": {"max": MAX_TIME_S},
    "workload.num_requests": {"max": MAX_REQUESTS},
    "workload.duration_s": {"max": MAX_TIME_S},
    "workload.time_scale": {"min": 1e-6, "max": 1e6},
    "workload.start_s": {"max": 1e9},
    "workload.hash_block_tokens": {"max": 65536},
    "workload.shared_prefix_tokens": {"max": MAX_TOKENS},
    "workload.prefix_groups": {"max": 1_000_000},
    "slo.ttft_s": {"max": MAX_TIME_S},
    "slo.tpot_s": {"max": MAX_TIME_S},
    "output.window_s": {"min": 1e-3, "max": MAX_TIME_S},
    "alerts.ttft_p99_s": {"max": MAX_TIME_S},
    "alerts.e2e_p99_s": {"max": MAX_TIME_S},
    "alerts.queue_len_max": {"max": float(MAX_REQUESTS)},
    "alerts.oldest_queued_s": {"max": MAX_TIME_S},
    "alerts.waiting_ttft_s": {"max": MAX_TIME_S},
    "alerts.min_completions": {"max": MAX_REQUESTS},
    "alerts.fire_after": {"max": MAX_REQUESTS},
    "output.trace_max_steps": {"max": 10**12},
    "alerts.clear_after": {"max": MAX_REQUESTS},
    "recovery.max_retries": {"max": 1000},
    "recovery.restart_s": {"max": MAX_TIME_S},
    "recovery.pending_timeout_s": {"max": MAX_TIME_S},
    "faults.random.gpu_mtbf_h": {"min": 1e-3, "max": 1e9},
    "faults.random.node_mtbf_h": {"min": 1e-3, "max": 1e9},
    "faults.random.link_mtbf_h": {"min": 1e-3, "max": 1e9},
    "faults.random.repair_s": {"max": MAX_TIME_S},
    "speculative.num_speculative_tokens": {"max": 64},
    "speculative.mean_accepted_tokens": {"max": 64.0},
    "speculative.disable_by_batch_size": {"max": 65536},
}
#: Highest seed (numpy's SeedSequence takes any integer; TOML integers are 64-bit).
MAX_SEED = 2**63 - 1
#: A scenario name is a plain folder name (it names ``runs/<name>/``).
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}"
