"""Engine profiles: named bundles of what an inference engine does around the kernels, the
defaults of a scenario's ``[engine]`` table (filled in by :func:`apply_profile` when the
scenario is loaded, before validation).

A profile (``[engine] profile``) fills the ``[engine]`` keys a scenario does not set
itself: the scheduler (chunked prefill or prefill-first), the token budget and sequence
limit, whether the CPU's per-step work overlaps the GPU step (async scheduling), the CUDA
graph capture sizes, the custom all-reduce, and the delay before a produced token reaches
the client. Explicit ``[engine]`` keys always win. Every value, with the engine source it
comes from, is listed in docs/cost-model.md ("Engine profiles").

A scenario that names no profile gets :data:`DEFAULT_PROFILE` (``vllm-v1``, the newest
public vLLM). ``profile = "none"`` sets nothing: the engine keys' own defaults, which are
the simulator's results before profiles existed (CPU step in line with the GPU step, no
graph padding, 256 sequences).
"""

from __future__ import annotations

from simulator import registry
from simulator.errors import ScenarioError
from simulator.hardware.specs import load_node

#: vLLM 0.6 (vllm/worker/model_runner.py): graphs for batch sizes 1, 2, 4 and multiples of
#: 8 up to 256 (``_BATCH_SIZES_TO_CAPTURE``), decode-only batches, padded up
#: (``_get_graph_batch_size``); larger batches and every prefill run eagerly.
VLLM_V06_SIZES = (1, 2, 4, *range(8, 257, 8))


def vllm_v1_ladder(top: int) -> tuple[int, ...]:
    """vLLM V1 capture sizes up to ``top`` (vllm/config/vllm.py ``_set_cudagraph_sizes``,
    v0.11+): 1, 2, 4, multiples of 8 below 256, then multiples of 16."""
    sizes = (1, 2, 4, *range(8, 256, 8), *range(256, top + 1, 16))
    return tuple(s for s in sizes if s <= top)


def vllm_v1_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """vLLM V1's default capture sizes: the ladder up to ``min(2 * max_num_seqs, 512)``."""
    return vllm_v1_ladder(min(2 * max_num_seqs, 512))


def sglang_sizes(max_bs: int) -> tuple[int, ...]:
    """SGLang capture sizes (python/sglang/srt/server_args.py
    ``_generate_cuda_graph_batch_sizes``): 1, 2, 4, 8, 12, multiples of 8 to 256, of 16 to
    512, of 32 beyond, up to ``cuda_graph_max_bs``."""
    sizes = (1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16),
             *range(512, max_bs + 1, 32))
    return tuple(s for s in sizes if s <= max_bs)


def trtllm_sizes(max_bs: int) -> tuple[int, ...]:
    """TensorRT-LLM PyTorch backend (tensorrt_llm/llmapi/llm_args.py
    ``CudaGraphConfig._generate_cuda_graph_batch_sizes`` with ``enable_padding``):
    1, 2, 4, multiples of 8 to 128, powers of 2 beyond, and ``max_batch_size`` itself."""
    sizes = [1, 2, 4, *range(8, 129, 8)]
    p = 256
    while p < max_bs:
        sizes.append(p)
        p *= 2
    sizes = sorted(s for s in sizes if s <= max_bs)
    if sizes[-1] != max_bs:
        sizes.append(max_bs)
    return tuple(sizes)


#: Host CPU work per step that grows with the step, per engine family (seconds per scheduled
#: sequence and per scheduled token; the fixed part is ``step_overhead_s``, 3 ms). vLLM:
#: the ~56 us per running sequence measured on Llama-3.1-8B at TP4 and TP8 on H100 (the
#: same ~10 ms TPOT at 128 sequences on both: host-bound). SGLang and TensorRT-LLM: that
#: slope scaled by the same measurement's engine ratio at 128 sequences (Qwen3-32B TP8:
#: SGLang 15.4 ms, TensorRT-LLM 19.8, vLLM 21.3). Per token: 0 (input preparation is
#: vectorized: numpy/torch over the whole batch). Sources: docs/cost-model.md.
HOST: dict[str, dict[str, float]] = {
    "vllm": {"host_seq_s": 56e-6, "host_token_s": 0.0},
    "sglang": {"host_seq_s": 40e-6, "host_token_s": 0.0},
    "trtllm": {"host_seq_s": 52e-6, "host_token_s": 0.0},
}

#: The profiles: the ``[engine]`` keys each sets. ``cuda_graph_sizes`` names a capture rule
#: (:data:`CAPTURE_RULES`), evaluated with the scenario's ``max_num_seqs`` when the cluster
#: is built; ``cuda_graph_max_batch`` bounds it (None: the rule's own bound).
PROFILES = registry.PROFILES.add({
    # vLLM 0.6.x (Sep-Dec 2024) with the defaults of `vllm serve` for max_model_len <= 32k:
    # chunked prefill off (prefill-first), max_num_seqs 256, graphs on decode batches only,
    # custom all-reduce on, CPU scheduling in line with the GPU step, prefix caching off
    # (EngineArgs.enable_prefix_caching = False in vllm/engine/arg_utils.py).
    "vllm-v0.6": {"scheduler": "vllm_v0", "max_num_seqs": 256,
                  "cuda_graphs": "vllm-v0.6", "cuda_graph_max_batch": None,
                  "custom_allreduce": True, "cpu_overlap": False, "token_delay_s": 0.0,
                  "prefix_caching": False, **HOST["vllm"]},
    # vLLM V1 (v0.14+, async scheduling on by default): chunked prefill always, token budget
    # 8192 and 1024 sequences for the API server on >= 70 GiB GPUs other than A100,
    # FULL_AND_PIECEWISE graphs (mixed steps padded by token count), automatic prefix
    # caching on (CacheConfig.enable_prefix_caching = True in vllm/config/cache.py).
    "vllm-v1": {"scheduler": "vllm", "max_num_seqs": 1024, "max_num_batched_tokens": 8192,
                "cuda_graphs": "vllm-v1", "cuda_graph_max_batch": None,
                "custom_allreduce": True, "cpu_overlap": True, "token_delay_s": 0.0,
                "prefix_caching": True, **HOST["vllm"]},
    # SGLang (server_args.py defaults on 80-160 GB GPUs): chunked_prefill_size 8192,
    # overlap scheduler on, cuda_graph_max_bs 256 below TP4 and 512 from TP4 (the rule),
    # radix cache on (ServerArgs.disable_radix_cache = False).
    "sglang": {"scheduler": "vllm", "max_num_batched_tokens": 8192,
               "cuda_graphs": "sglang", "cuda_graph_max_batch": None,
               "custom_allreduce": True, "cpu_overlap": True, "token_delay_s": 0.0,
               "prefix_caching": True, **HOST["sglang"]},
    # TensorRT-LLM PyTorch backend (llm_args.py defaults): max_batch_size 2048,
    # max_num_tokens 8192, chunked prefill, overlap scheduler on, CUDA graphs with padding
    # up to cuda_graph_config.max_batch_size 128, KV block reuse on
    # (KvCacheConfig.enable_block_reuse = True).
    "trtllm": {"scheduler": "vllm", "max_num_batched_tokens": 8192,
               "cuda_graphs": "trtllm", "cuda_graph_max_batch": 128,
               "custom_allreduce": True, "cpu_overlap": True, "token_delay_s": 0.0,
               "prefix_caching": True, **HOST["trtllm"]},
    # No profile: the [engine] keys' own defaults (the results before profiles existed).
    "none": {},
})

#: Capture rules: name -> (sizes from the bound, whether graphs cover mixed steps, the
#: rule's own bound from max_num_seqs, and for SGLang the TP degree).
CAPTURE_RULES = registry.CAPTURE_RULES.add({
    "none": (lambda top: (), False, lambda seqs, tp: 0),  # graphs not modelled
    "vllm-v0.6": (lambda top: tuple(s for s in VLLM_V06_SIZES if s <= top), False,
                  lambda seqs, tp: min(256, -(-seqs // 8) * 8)),
    "vllm-v1": (vllm_v1_ladder, True, lambda seqs, tp: min(2 * seqs, 512)),
    "sglang": (sglang_sizes, False, lambda seqs, tp: 256 if tp < 4 else 512),
    "trtllm": (trtllm_sizes, False, lambda seqs, tp: 128),
})


def capture_sizes(rule: str, max_num_seqs: int, max_batch: int | None = None,
                  tp: int = 1) -> tuple[tuple[int, ...], bool]:
    """Captured sizes (ascending) and whether mixed steps use them, for a rule name.

    ``"none"`` gives no sizes (graphs not modelled). ``max_batch`` overrides the rule's own
    bound (vLLM 0.6: max_num_seqs rounded up to 8, at most 256; vLLM V1:
    ``min(2 * max_num_seqs, 512)``; SGLang 256 below TP 4 and 512 from TP 4 on 80-160 GB
    GPUs; TensorRT-LLM 128).
    """
    if rule == "none":
        return (), False
    sizes_of, mixed, bound = CAPTURE_RULES[rule]
    top = max_batch if max_batch is not None else bound(max_num_seqs, tp)
    return tuple(sizes_of(top)), mixed


#: The profile of a scenario that names none: the newest vLLM. ``"none"`` keeps
#: the engine keys' own defaults (every result before the flip; see docs/cost-model.md).
DEFAULT_PROFILE: str | None = "vllm-v1"


#: vLLM V1's batch limits on the other GPUs (vllm/engine/arg_utils.py
#: ``get_batch_defaults``, API server): below 70 GiB of memory, or an A100 (PR #17885: the
#: larger budget lowered A100 throughput), 2048 tokens and 256 sequences.
VLLM_V1_SMALL_GPU = {"max_num_batched_tokens": 2048, "max_num_seqs": 256}
BATCH_KEYS = tuple(VLLM_V1_SMALL_GPU)


def vllm_v1_batch_limits(gpu_name: str, memory_bytes: int) -> dict[str, int]:
    """vLLM V1's default token budget and sequence limit on a GPU."""
    if memory_bytes >= 70 * 2**30 and "a100" not in gpu_name.lower():
        return {k: PROFILES["vllm-v1"][k] for k in BATCH_KEYS}
    return dict(VLLM_V1_SMALL_GPU)


def _gpu_limits(topology: object, base_dir: str) -> dict[str, int] | None:
    """:func:`vllm_v1_batch_limits` of a node preset's GPU (None: the name does not resolve;
    validation reports it)."""
    if not isinstance(topology, str):
        return None
    try:
        gpu = load_node(topology, base_dir).gpu
    except ScenarioError:
        return None
    return vllm_v1_batch_limits(str(gpu.name), gpu.memory_bytes)


def apply_profile(data: dict, base_dir: str = ".") -> dict:
    """``data`` (a raw scenario dict) with the profile's keys filled into ``[engine]``
    where the scenario does not set them. Unknown names are left for validation.

    ``vllm-v1``'s token budget and sequence limit depend on the GPU, as vLLM's do: those of
    ``[cluster] topology``'s GPU go into ``[engine]``, and a ``[[pools]]`` entry on another
    kind of node gets its own GPU's limits in its ``engine`` overrides (``base_dir``
    resolves node files given by path).
    """
    engine = data.get("engine", {})
    if not isinstance(engine, dict):
        return data
    name = engine.get("profile", DEFAULT_PROFILE)
    if name not in PROFILES:
        return data
    out = dict(data)
    keys = dict(PROFILES[name])
    if name == "vllm-v1":
        cluster = data.get("cluster", {})
        top = cluster.get("topology", "dgx-h100") if isinstance(cluster, dict) else None
        keys.update(_gpu_limits(top, base_dir) or {})
        pools = data.get("pools")
        if isinstance(pools, list):
            out["pools"] = [_pool_limits(p, keys, engine, base_dir) for p in pools]
    out["engine"] = {**keys, "profile": name, **engine}
    return out


def _pool_limits(pool: object, keys: dict, engine: dict, base_dir: str) -> object:
    """A pool entry with its own GPU's vLLM V1 batch limits in its ``engine`` overrides,
    where they differ from ``[engine]``'s and neither the scenario's ``[engine]`` nor the
    pool sets them."""
    if not isinstance(pool, dict) or "topology" not in pool:
        return pool
    own = _gpu_limits(pool["topology"], base_dir)
    over = pool.get("engine") or {}
    if own is None or not isinstance(over, dict):
        return pool
    add = {k: v for k, v in own.items()
           if v != keys[k] and k not in engine and k not in over}
    return {**pool, "engine": {**over, **add}} if add else pool
