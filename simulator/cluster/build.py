"""From a validated scenario to a static cluster plan (:mod:`simulator.cluster.plan`):
hardware, graph, placement, memory, per-stage costs. A colocated scenario builds a cluster of
one pool here; :func:`simulator.cluster.pools.build_plan`, the entry point for any scenario,
builds each ``[[pools]]`` entry with it.
Everything here is checked before any simulation starts.
"""

from __future__ import annotations

from dataclasses import replace

from simulator.calibration.engines import engine_gpu
from simulator.cluster.plan import ClusterPlan, PoolPlan, ReplicaPlan
from simulator.engine.host import host_keys
from simulator.engine.schedulers import SCHEDULERS
from simulator.engine.speculative import SpecConfig, spec_config
from simulator.errors import ScenarioError
from simulator.hardware.specs import NodeSpec, load_node
from simulator.io.layout import head_engine, head_problems
from simulator.io.profiles import capture_sizes
from simulator.io.scenario import resolve_path
from simulator.io.schema import Scenario
from simulator.model.cost import ACT_BYTES, StageCost
from simulator.model.memory import (
    GIB,
    ExpertLayout,
    MemoryPlan,
    hybrid_block_tokens,
    plan_memory,
    plan_moe_memory,
    split_layers,
)
from simulator.model.moe_cost import A2APaths
from simulator.model.moe_stage import LayoutComm, MoEStageCost
from simulator.model.routing import Routing, popularity, read_weights
from simulator.model.spec import BYTES_PER_DTYPE, KV_DTYPES, ModelSpec, load_model
from simulator.model.speculative import DraftCost, draft_kv_bytes_per_token, draft_weight_bytes
from simulator.parallel.collective import BANDWIDTH_EFFICIENCY, allreduce, group_cost
from simulator.parallel.placement import ReplicaPlacement, place
from simulator.topology.flows import Flow, finish_times
from simulator.topology.graph import PEER_LINKS, Paths, build_graph, nvlink_domains


def _check_heads(model: ModelSpec, tp: int, pp: int, engine: str = "vllm",
                 key: str = "parallel.tp") -> list[str]:
    """The engine's head rules for attention TP ``tp`` (simulator.io.layout) and
    pp <= layers. MLA has no KV heads: only the query heads must divide."""
    problems = head_problems(model.q_heads, model.q_heads if model.mla else model.kv_heads,
                             tp, engine, model.name, key)
    if pp > model.layers:
        problems.append(f"parallel.pp: {pp} exceeds the {model.layers} layers of {model.name}")
    return problems


def build_colocated(scenario: Scenario) -> ClusterPlan:
    """Check a colocated scenario against model and hardware and derive its static
    cluster of one pool. The entry point that builds any scenario is
    :func:`simulator.cluster.pools.build_plan`, which builds each pool with this.

    Raises
    ------
    ScenarioError
        Naming the key: tp not dividing the heads, layout larger than the cluster, a model
        that does not fit (and by how much), a max_model_len beyond the KV cache.
    ValueError
        A scenario with ``[[pools]]`` (build it with ``build_plan``).
    """
    if scenario.pools:
        raise ValueError("build_colocated: the scenario has [[pools]]; "
                         "simulator.cluster.pools.build_plan builds it")
    try:
        return _build(scenario)
    except ScenarioError as exc:
        raise exc.with_source(scenario.source) from None


def replica_costs(s: Scenario, model: ModelSpec, node: NodeSpec, pl: ReplicaPlacement,
                  paths: Paths, shared: dict | None = None
                  ) -> tuple[tuple[StageCost, ...], tuple[tuple[float, float], ...]]:
    """Stage costs and stage-to-stage hand-off costs of a placed replica, priced on the
    graph's paths (the whole graph, or what is left of it after failures).

    ``shared`` maps (stage, all-reduce cost) to a StageCost already built: replicas placed
    alike then share one object and its per-token-count cache (with 128 replicas, one
    evaluation of the calibrated GEMM forms per token count instead of 128).
    """
    eng, tp, pp = s.engine, s.parallel.tp, s.parallel.pp
    layers = split_layers(model.layers, pp)
    graphs, mixed = capture_sizes(eng.cuda_graphs, eng.max_num_seqs, eng.cuda_graph_max_batch,
                                  tp)
    stages = []
    for i, group in enumerate(pl.stages):
        # A TP group placed in one NVLink domain may use its switch (NVLS) and vLLM's
        # custom all-reduce, as long as every ring hop still runs over NVLink only (a
        # failed link can send a hop around through PCIe).
        nvlink = _nvlink_ring(paths, group)
        ar = allreduce(paths, group, node.gpu.calibration.collectives,
                       node.scale_up.in_switch_reduction and nvlink,
                       eng.custom_allreduce and nvlink)
        key = (i, ar)
        cost = shared.get(key) if shared is not None else None
        if cost is None and (model.layer_plan):
            layout, routing = expert_setup(s, model, node)
            cost = MoEStageCost(model, node.gpu, tp, sum(layers[:i]), layers[i], i == 0,
                                i == pp - 1, s.model.weight_dtype, s.model.kv_dtype, ar,
                                layout, routing, a2a_paths(paths, group),
                                s.model.moe_a2a_mode, eng.layer_launch_s,
                                s.model.two_batch_overlap,
                                comm=layout_comm(paths, group, layout, node,
                                                 eng.custom_allreduce),
                                **host_keys(eng, i))
            if shared is not None:
                shared[key] = cost
        if cost is None:
            cost = StageCost(model, node.gpu, tp, layers[i], i == 0, i == pp - 1,
                             s.model.weight_dtype, s.model.kv_dtype, ar, eng.layer_launch_s,
                             graphs, mixed, **host_keys(eng, i))
            if shared is not None:
                shared[key] = cost
        stages.append(cost)
    sends = tuple(
        (paths.latency(a[0], b[0]),
         model.hidden * ACT_BYTES / (paths.bandwidth(a[0], b[0]) * BANDWIDTH_EFFICIENCY))
        for a, b in zip(pl.stages, pl.stages[1:], strict=False))
    return tuple(stages), sends


def expert_setup(s: Scenario, model: ModelSpec, node: NodeSpec) -> tuple[ExpertLayout, Routing]:
    """The expert layout of a MoE / MLA model and its routing (popularity over the EP
    ranks, redundant experts, the run's routing draws from the scenario seed)."""
    par, moe = s.parallel, model.moe
    dtype = s.model.weight_dtype
    if moe is not None and moe.expert_dtype is not None:  # the release's own (MXFP4, NVFP4)
        if moe.expert_scheme == "nvfp4" and moe.expert_dtype not in node.gpu.weight_dtypes:
            raise ScenarioError(f"model.name: {model.name} ships its experts in NVFP4, which "
                                f"needs FP4 tensor cores; {node.gpu.name} has none (allowed "
                                f"there: {', '.join(node.gpu.weight_dtypes)}); use a "
                                f"Blackwell GPU or the release's FP8 / BF16 checkpoint")
        dtype = moe.expert_dtype if moe.expert_dtype in node.gpu.weight_dtypes else "int4"
    layout = ExpertLayout(par.ep, par.attention_dp, par.redundant_experts, dtype,
                          (par.attention_tp or 1) if par.attention_dp else 1)
    experts = moe.experts if moe is not None else 1
    rt = s.model.routing or {}
    weights = (read_weights(resolve_path(s, rt["weights_file"]), experts)
               if "weights_file" in rt else None)
    p = popularity(experts, rt.get("distribution", "uniform"), rt.get("skew", 1.0), weights,
                   seed=s.seed)
    return layout, Routing.build(p, par.ep, par.redundant_experts,
                                 moe.top_k if moe else 1, s.seed)


def layout_comm(paths: Paths, group: tuple[str, ...], layout: ExpertLayout, node: NodeSpec,
                custom: bool) -> LayoutComm | None:
    """The attention group's all-reduce (its first ``attention_tp`` GPUs stand for every
    group) and the stage's all-gather / reduce-scatter, for attention DP with attention
    TP > 1 or TP-sliced experts; None otherwise (TP attention, or DP attention over whole
    experts and single-GPU attention groups)."""
    tp = len(group)
    a = layout.attn_tp(tp)
    if not layout.attention_dp or (a == 1 and layout.ep == tp):
        return None
    params = node.gpu.calibration.collectives
    sub = group[:a]
    nvlink = _nvlink_ring(paths, sub) if a > 1 else False
    attention = allreduce(paths, sub, params, node.scale_up.in_switch_reduction and nvlink,
                          custom and nvlink)
    return LayoutComm(attention, group_cost(paths, "all_gather", group, params),
                      group_cost(paths, "reduce_scatter", group, params))


def a2a_paths(paths: Paths, group: tuple[str, ...]) -> A2APaths:
    """The group's all-to-all on the graph: one byte from every rank to every other at once
    through the max-min fair fluid model (the last one lands after ``s_per_byte``), and for
    the first rank alone the seconds per byte over NVLink-only paths and over the rest.
    All at full link bandwidth: the calibrated DeepEP form's link efficiency applies on
    top (``moe_cost.a2a_time``)."""
    g = paths.g
    capacity = {(a, b): d["bandwidth_Bps"] for a, b, d in g.edges(data=True)}
    flows = []
    for a in group:
        for b in group:
            if a != b:
                hops = paths.path(a, b)
                flows.append(Flow(tuple(zip(hops, hops[1:], strict=False)), 1.0))
    s_per_byte = float(finish_times(flows, capacity).max()) if flows else 0.0
    src = group[0]
    intra = inter = lat = 0.0
    peers = 0
    for dst in group[1:]:
        path = paths.path(src, dst)
        one = 1.0 / paths.bandwidth(src, dst)
        if all(g.edges[a, b]["kind"] in PEER_LINKS for a, b in zip(path, path[1:],
                                                                   strict=False)):
            intra += one
            peers += 1
        else:
            inter += one
        lat = max(lat, paths.latency(src, dst))
    return A2APaths(intra, inter, lat, len(group), peers, s_per_byte)


def _check_moe(model: ModelSpec, s: Scenario) -> list[str]:
    par, problems = s.parallel, []
    if model.moe is None and s.model.two_batch_overlap:
        problems.append(f"model.two_batch_overlap: needs a mixture-of-experts model; "
                        f"{model.name} is dense")
    if model.moe is None:
        for key, value, default in (("ep", par.ep, 1), ("attention_dp", par.attention_dp,
                                                        False),
                                    ("redundant_experts", par.redundant_experts, 0),
                                    ("attention_tp", par.attention_tp, None)):
            if value != default:
                problems.append(f"parallel.{key}: {value!r} needs a mixture-of-experts "
                                f"model; {model.name} is dense")
        return problems
    if par.tp % par.ep:
        allowed = [d for d in range(1, par.tp + 1) if par.tp % d == 0]
        problems.append(f"parallel.ep: {par.ep} does not divide parallel.tp ({par.tp}; "
                        f"allowed: {', '.join(map(str, allowed))}: each expert sliced over "
                        f"tp / ep GPUs)")
    a = par.attention_tp or 1
    if par.attention_tp is not None and not par.attention_dp:
        problems.append(f"parallel.attention_tp: {a} needs parallel.attention_dp = true "
                        f"(attention is TP over all tp GPUs without it)")
    if par.attention_dp and (par.tp == 1 or par.tp % a or a >= par.tp):
        problems.append(f"parallel.attention_dp: needs tp > 1 split into attention groups of "
                        f"attention_tp GPUs (attention_tp divides tp and is below it), got "
                        f"tp={par.tp}, attention_tp={a}")
    if s.model.two_batch_overlap and not (par.attention_dp and par.ep == par.tp):
        problems.append("model.two_batch_overlap: needs parallel.attention_dp = true and "
                        "ep = tp (it overlaps the all-to-all, which only DP attention with "
                        "whole experts per rank has)")
    if par.redundant_experts and par.ep == 1:
        problems.append("parallel.redundant_experts: needs expert parallelism (ep > 1)")
    return problems


def _nvlink_ring(paths: Paths, group: tuple[str, ...]) -> bool:
    """Whether every hop around the group's ring runs over NVLink (or xGMI) edges only."""
    g, n = paths.g, len(group)
    for i in range(n):
        path = paths.path(group[i], group[(i + 1) % n])
        if any(g.edges[a, b]["kind"] not in PEER_LINKS
               for a, b in zip(path, path[1:], strict=False)):
            return False
    return True


def cluster_node(s: Scenario) -> NodeSpec:
    """The scenario's node preset with its cluster overrides: NIC line rate
    (``nic_gbps * 1e9 / 8`` bytes/s per direction) and fabric switch latency, and the
    kernel calibration of the engine profile's engine on its GPU
    (:func:`~simulator.calibration.engines.engine_gpu`)."""
    node = load_node(s.cluster.topology, s.base_dir)
    gpu = engine_gpu(node.gpu, s.engine.profile)
    if gpu is not node.gpu:
        node = replace(node, gpu=gpu)
    c = s.cluster
    if c.nic_gbps is not None:
        node = replace(node, nic=replace(node.nic, bandwidth_Bps=c.nic_gbps * 1e9 / 8))
    if c.switch_latency_s is not None:
        node = replace(node, switch_latency_s=c.switch_latency_s)
    return node


def _build(s: Scenario) -> ClusterPlan:
    model = load_model(s.model.name, s.base_dir)
    node = cluster_node(s)
    tp, pp, dp = s.parallel.tp, s.parallel.pp, s.parallel.dp
    problems = _check_moe(model, s)
    attn_tp = (s.parallel.attention_tp or 1) if s.parallel.attention_dp else tp
    problems = problems or _check_heads(model, attn_tp, pp,
                             head_engine(s.parallel.heads_rule, s.engine.profile),
                             "parallel.attention_tp" if s.parallel.attention_dp else
                             "parallel.tp")
    if (model.linear is not None and prefix_unit(s)
            and s.engine.profile not in HYBRID_PREFIX_PROFILES):
        problems.append(f"engine.prefix_caching: true for {model.name}, a hybrid "
                        f"linear-attention model, is modelled as vLLM V1 keeps its Gated "
                        f"DeltaNet state (block-aligned checkpoints, docs/model.md), not "
                        f"under engine.profile = {s.engine.profile!r} (allowed: "
                        f"{', '.join(HYBRID_PREFIX_PROFILES)}); or set "
                        f"engine.prefix_caching = false")
    if problems:
        raise ScenarioError(problems)
    for key, allowed in (("weight_dtype", node.gpu.weight_dtypes), ("kv_dtype", KV_DTYPES)):
        dtype = getattr(s.model, key)
        if dtype not in allowed:
            raise ScenarioError(f"model.{key}: {dtype} is not supported on {node.gpu.name} "
                                f"(allowed: {', '.join(allowed)})")
    graph = build_graph(node, s.cluster.nodes, s.cluster.fabric, s.cluster.oversubscription,
                        s.cluster.spines, s.cluster.rail_optimized, s.cluster.nodes_per_leaf)
    placements = place(nvlink_domains(graph), tp, pp, dp, s.parallel.placement)
    eng = s.engine
    draft, draft_bytes = drafter_of(s, model, tp, node)

    def memory_with(reserve: float) -> MemoryPlan:
        if model.layer_plan:
            return plan_moe_memory(model, node.gpu.memory_bytes, tp, pp,
                                   expert_setup(s, model, node)[0], s.model.weight_dtype,
                                   s.model.kv_dtype, eng.block_size,
                                   eng.gpu_memory_utilization, eng.max_num_batched_tokens,
                                   eng.max_num_seqs, reserve,
                                   snapshot_tokens=prefix_snapshot_tokens(s, model))
        return plan_memory(model, node.gpu.memory_bytes, tp, pp, s.model.weight_dtype,
                           s.model.kv_dtype, eng.block_size, eng.gpu_memory_utilization,
                           eng.max_num_batched_tokens, eng.max_num_seqs, reserve)
    try:
        memory = memory_with(eng.runtime_reserve_gib * GIB + draft_bytes)
    except ScenarioError:
        if not draft_bytes:
            raise
        # The target alone: if it misses too, its own message; if it fits, the drafter is
        # what does not (its weights are no runtime reserve).
        alone = memory_with(eng.runtime_reserve_gib * GIB)
        key = ("speculative.draft_model" if s.speculative.method == "draft_model"
               else "speculative.method")
        raise ScenarioError(
            f"{key}: the drafter's weights take {draft_bytes / GIB:.2f} GiB per GPU, but "
            f"{model.name} with tp={tp}, pp={pp} leaves {min(alone.kv_bytes_per_gpu) / GIB:.2f}"
            f" GiB per GPU for them and the KV cache; use a smaller draft, raise tp, or raise "
            f"engine.gpu_memory_utilization") from None
    if s.speculative is not None:
        memory = with_draft_kv(memory, draft_kv_bytes_per_token(
            s.speculative.method, model, draft, tp, s.model.kv_dtype))
    streams = eng.max_inflight_microbatches or pp
    stream_tokens = (memory.kv_blocks // streams) * eng.block_size
    if eng.max_model_len is not None:
        if eng.max_model_len > model.max_position_embeddings:
            raise ScenarioError(f"engine.max_model_len: {eng.max_model_len} exceeds the "
                                f"{model.max_position_embeddings} positions of {model.name}")
        if eng.max_model_len > stream_tokens:
            raise ScenarioError(f"engine.max_model_len: {eng.max_model_len} tokens do not fit "
                                f"the KV cache ({stream_tokens} tokens per micro-batch stream "
                                f"of a replica); lower it, or add memory (tp, pp, "
                                f"gpu_memory_utilization, fp8 KV)")
        max_len = eng.max_model_len
    else:
        max_len = min(model.max_position_embeddings, stream_tokens)
    if not SCHEDULERS[eng.scheduler].CHUNKED:  # prompts run whole: the budget bounds them
        if eng.max_model_len is not None and eng.max_model_len > eng.max_num_batched_tokens:
            raise ScenarioError(
                f"engine.max_model_len: {eng.max_model_len} exceeds max_num_batched_tokens "
                f"({eng.max_num_batched_tokens}); scheduler \"{eng.scheduler}\" does not split "
                f"prompts, so a step must hold a whole prompt")
        max_len = min(max_len, eng.max_num_batched_tokens)
    if stream_tokens < 1:
        raise ScenarioError(f"engine.max_inflight_microbatches: {streams} streams leave no KV "
                            f"block per stream ({memory.kv_blocks} blocks per replica)")
    paths = Paths(graph)
    replicas = []
    shared: dict = {}
    for pl in placements:
        stages, sends = replica_costs(s, model, node, pl, paths, shared)
        host = [paths.transfer_time(g[0], f"host{graph.nodes[g[0]]['node']}",
                                    memory.block_bytes_per_gpu[i])
                for i, g in enumerate(pl.stages)]
        replicas.append(ReplicaPlan(pl, stages, sends, max(host)))
    swap = int(eng.swap_space_gib * GIB // max(memory.block_bytes_per_gpu)) // streams
    offload = _offload_units(s, memory, streams)
    spec = _spec_config(s, model, node, draft, replicas[0], paths)
    pool = PoolPlan(s, model, node, memory, tuple(replicas), streams, max_len, swap, offload,
                    spec)
    return ClusterPlan(s, model, graph, (pool,), max_len)


def with_draft_kv(memory: MemoryPlan, per_token: float) -> MemoryPlan:
    """The memory plan with the drafter's KV in every block (charged to every pipeline
    stage: conservative for pp > 1, where the drafter runs before the first)."""
    if not per_token:
        return memory
    extra = memory.block_size * per_token
    pairs = list(zip(memory.kv_bytes_per_gpu, memory.block_bytes_per_gpu, strict=True))
    # Replicas of the cache per replica (tp under attention DP, else 1), kept as planned.
    copies = memory.kv_blocks // min(int(f // b) for f, b in pairs)
    blocks = copies * min(int(f // (b + extra)) for f, b in pairs)
    if blocks < 1:
        raise ScenarioError("speculative: the drafter's KV cache leaves no KV block; raise tp "
                            "or pp, or use a smaller draft")
    return replace(memory, kv_blocks=blocks)


def _spec_config(s: Scenario, model: ModelSpec, node: NodeSpec, draft: ModelSpec | None,
                 rp: ReplicaPlan, paths: Paths) -> SpecConfig | None:
    """The [speculative] section as the streams use it, the drafter priced on the first
    replica's last TP group; an MTP module of a MoE / MLA model as that model's last layer
    (experts, all-to-all and MLA included)."""
    sp, eng, tp = s.speculative, s.engine, s.parallel.tp
    if sp is None:
        return None
    graphs, mixed = capture_sizes(eng.cuda_graphs, eng.max_num_seqs, eng.cuda_graph_max_batch,
                                  tp)
    ar, head = rp.stages[-1].allreduce, None
    if sp.method == "mtp" and (model.layer_plan):
        layout, routing = expert_setup(s, model, node)
        head = MoEStageCost(model, node.gpu, tp, model.layers - 1, 1, False, True,
                            s.model.weight_dtype, s.model.kv_dtype, ar, layout, routing,
                            a2a_paths(paths, rp.placement.stages[-1]), s.model.moe_a2a_mode,
                            eng.layer_launch_s, s.model.two_batch_overlap,
                            comm=layout_comm(paths, rp.placement.stages[-1], layout, node,
                                             eng.custom_allreduce))
    cost = DraftCost(sp.method, model, draft, node.gpu, tp, s.model.weight_dtype,
                     s.model.kv_dtype, ar, eng.layer_launch_s, graphs, mixed, head)
    return spec_config(sp.method, sp.num_speculative_tokens, sp.acceptance,
                       sp.mean_accepted_tokens, sp.disable_by_batch_size, cost, s.seed)


def drafter_of(s: Scenario, model: ModelSpec, tp: int,
               node: NodeSpec) -> tuple[ModelSpec | None, float]:
    """The draft model (method draft_model) and the drafter's weight bytes per GPU; checks
    the [speculative] section against the engine and the models."""
    sp = s.speculative
    if sp is None:
        return None, 0.0
    if sp.method == "mtp" and not model.mtp_layers:
        raise ScenarioError(f"speculative.method: \"mtp\" needs a model with MTP layers "
                            f"(num_nextn_predict_layers in its config.json); {model.name} "
                            f"has none (allowed here: draft_model, eagle, ngram)")
    draft = None
    if sp.method == "draft_model":
        try:
            draft = load_model(sp.draft_model, s.base_dir)
        except ScenarioError as exc:
            raise ScenarioError(str(exc).replace("model.name", "speculative.draft_model",
                                                 1)) from None
        problems = _check_heads(draft, tp, 1)
        if problems:
            raise ScenarioError([f"speculative.draft_model: {p}" for p in problems])
        if draft.vocab != model.vocab:
            raise ScenarioError(f"speculative.draft_model: {draft.name} has a vocabulary of "
                                f"{draft.vocab} tokens, {model.name} {model.vocab}; a draft "
                                f"must share the target's tokenizer")
    layout = (expert_setup(s, model, node)[0]
              if model.layer_plan else None)
    return draft, draft_weight_bytes(sp.method, model, draft, tp, s.model.weight_dtype, layout)


def _offload_units(s: Scenario, memory: MemoryPlan, streams: int) -> int:
    """Hash blocks of the prefix cache's host tier per stream (``kv_offload_gib`` per GPU);
    checks that a hash block is a whole number of KV blocks."""
    w, eng = s.workload, s.engine
    if prefix_unit(s) and w.hash_block_tokens % eng.block_size:
        raise ScenarioError(f"workload.hash_block_tokens: {w.hash_block_tokens} is not a "
                            f"multiple of engine.block_size ({eng.block_size}); prefix "
                            f"caching maps each hash block onto whole KV blocks")
    per_block = max(memory.block_bytes_per_gpu) * max(1, w.hash_block_tokens // eng.block_size)
    return int(eng.kv_offload_gib * GIB // per_block) // streams


#: Engine profiles whose prefix caching of a hybrid model is modelled: vLLM V1's
#: block-aligned state checkpoints (``mamba_cache_mode = "align"``), and no profile.
HYBRID_PREFIX_PROFILES = ("vllm-v1", "none")


def prefix_snapshot_tokens(s: Scenario, model: ModelSpec) -> int:
    """Tokens between the recurrent-state snapshots of a hybrid model under prefix caching
    (vLLM V1 keeps one per attention block, :func:`~simulator.model.memory.hybrid_block_tokens`,
    and a hit resumes only from one), or 0: no hybrid model, or no prefix cache."""
    if model.linear is None or not prefix_unit(s):
        return 0
    attn_tp = (s.parallel.attention_tp or 1) if s.parallel.attention_dp else s.parallel.tp
    return hybrid_block_tokens(model, BYTES_PER_DTYPE[s.model.kv_dtype], attn_tp)


def prefix_unit(s: Scenario) -> int:
    """Tokens per prefix-cache hash block, or 0 (no prefix cache: prefix caching off, or
    a workload without block hashes: a Mooncake .jsonl trace or sessions have them)."""
    w = s.workload
    hashed = w.arrival == "sessions" or (w.arrival == "trace"
                                         and str(w.trace).endswith(".jsonl"))
    return w.hash_block_tokens if s.engine.prefix_caching and hashed else 0
