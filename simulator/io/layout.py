"""Parallel layouts as the engines spell them, and the head rules they enforce.

The simulator's own ``[parallel]`` spelling (docs/moe.md, "Layouts"): ``tp`` GPUs per
pipeline stage form the MoE group; ``ep`` divides ``tp`` (each expert sliced over
``tp / ep`` GPUs); ``attention_dp`` splits the stage into ``tp / attention_tp`` attention
groups of ``attention_tp`` GPUs each running attention for their own requests; ``dp`` is
the number of replicas. :func:`translate` turns an engine's spelling (``convention =
"vllm" | "sglang" | "trtllm"``) into it, with the engine's own rules:

- vLLM (``vllm/engine/arg_utils.py``: ``--tensor-parallel-size``, ``--data-parallel-size``,
  ``--enable-expert-parallel``; ``vllm/model_executor/layers/fused_moe/config.py``,
  ``FusedMoEParallelConfig.make``): for a MoE model the DP ranks of one engine run
  attention on their own requests and the MoE layers span all ``tp x dp`` GPUs, as EP
  (``ep = tp x dp``) or flattened TP (``ep = 1``); for a dense model DP ranks are
  independent replicas.
- SGLang (``python/sglang/srt/server_args.py``: ``--tp-size``, ``--dp-size``,
  ``--ep-size``, ``--enable-dp-attention``; ``python/sglang/srt/layers/dp_attention.py``,
  ``compute_dp_attention_world_info``: ``attn_tp_size = tp_size // dp_size``): ``tp`` is
  the engine's GPUs; with DP attention ``dp`` attention groups share it, else ``dp``
  replicas behind its router.
- TensorRT-LLM (``tensorrt_llm/mapping.py``: ``moe_tp_size x moe_ep_size = tp_size``, the
  missing one derived, both missing: ``moe_tp = tp``; ``enable_attention_dp``: attention
  TP 1): ``tp`` is the engine's GPUs per stage, ``dp`` replicas.

Head rules (:func:`head_problems`): vLLM and SGLang need the attention TP size to divide
the query heads and, for KV heads, to divide them or be a multiple of them (each of
``tp / kv`` ranks then holds a replica of one KV head: ``QKVParallelLinear`` in
``vllm/model_executor/layers/linear.py``); TensorRT-LLM needs it to divide the query
heads only and gives each rank ``ceil(kv / tp)`` KV heads (``tensorrt_llm/_torch/modules/
attention.py``), replicating the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from simulator.io.schema import ParallelKeys

#: Keys each convention may not set (the engine has no such flag).
FOREIGN = {"vllm": ("attention_dp", "attention_tp", "moe_tp"),
           "sglang": ("attention_tp", "moe_tp"),
           "trtllm": ("attention_tp", "replicas")}


def translate(par: ParallelKeys, is_moe: Callable[[], bool]) -> tuple[ParallelKeys, list[str]]:
    """``par`` in the simulator's own spelling, and the problems found (one line each,
    naming the key, the value and what the engine allows). ``is_moe`` tells whether the
    model is a mixture of experts (vLLM's DP means replicas for a dense model); it is
    called only when that decides the meaning."""
    conv, problems = par.convention, []
    if conv is None:
        for key in ("moe_tp", "replicas"):
            if getattr(par, key) is not None:
                problems.append(f"parallel.{key}: {getattr(par, key)} is an engine's flag; "
                                f"set parallel.convention (allowed: vllm, sglang, trtllm) or "
                                f"use the simulator's keys (tp, ep, attention_tp, dp)")
        return par, problems
    defaults = ParallelKeys()
    for key in FOREIGN[conv]:
        if getattr(par, key) != getattr(defaults, key):
            problems.append(f"parallel.{key}: not a {conv} flag (with convention = "
                            f"\"{conv}\" set: {', '.join(_allowed(conv))})")
    if problems:
        return par, problems
    out = replace(par, convention=None, replicas=None, moe_tp=None,
                  heads_rule=par.heads_rule or conv)
    replicas = par.replicas or 1
    if conv == "vllm":
        world = par.tp * par.dp
        if par.ep not in (1, world):
            problems.append(f"parallel.ep: {par.ep} is not what vLLM runs (allowed: 1, or "
                            f"tp x dp = {world} for --enable-expert-parallel: one EP group "
                            f"over all DP ranks)")
        elif par.dp > 1 and is_moe():
            out = replace(out, tp=world, dp=replicas, attention_dp=True,
                          attention_tp=par.tp if par.tp > 1 else None)
        else:  # dense: DP ranks are replicas
            out = replace(out, dp=par.dp * replicas)
    elif conv == "sglang":
        if par.tp % par.ep:
            problems.append(f"parallel.ep: {par.ep} does not divide tp = {par.tp} (SGLang's "
                            f"--ep-size divides --tp-size)")
        if par.attention_dp and par.tp % par.dp:
            problems.append(f"parallel.dp: {par.dp} does not divide tp = {par.tp} (SGLang "
                            f"with --enable-dp-attention: attention TP = tp / dp)")
        elif par.attention_dp and par.dp > 1:
            a = par.tp // par.dp
            out = replace(out, dp=replicas, attention_tp=a if a > 1 else None)
        elif par.replicas is not None:
            problems.append("parallel.replicas: needs attention_dp = true and dp > 1 "
                            "(otherwise SGLang's --dp-size counts the replicas: set dp)")
        else:
            out = replace(out, attention_dp=False)
    else:  # trtllm
        ep = par.ep
        if par.moe_tp and ep == 1 and par.tp % par.moe_tp == 0:  # ep unset: derived
            ep = par.tp // par.moe_tp
            out = replace(out, ep=ep)
        moe_tp = par.moe_tp or (par.tp // ep if par.tp % ep == 0 else 0)
        if moe_tp * ep != par.tp:
            problems.append(f"parallel.moe_tp: {par.moe_tp or 'derived'} x ep {ep} != "
                            f"tp {par.tp} (TensorRT-LLM needs moe_tp_size x moe_ep_size = "
                            f"tp_size)")
    return out, problems


def _allowed(conv: str) -> list[str]:
    keys = ("tp", "pp", "dp", "ep", "attention_dp", "attention_tp", "moe_tp", "replicas",
            "redundant_experts", "placement")
    return [k for k in keys if k not in FOREIGN[conv]]


#: The engine whose head rules apply, by [engine] profile (vLLM for the others).
ENGINE_OF_PROFILE = {"sglang": "sglang", "trtllm": "trtllm"}


def head_engine(heads_rule: str | None, profile: str | None) -> str:
    """Which engine's head rules apply: ``[parallel] heads_rule`` (which a convention sets
    when the scenario is read), else the profile's engine, else vLLM's."""
    return heads_rule or ENGINE_OF_PROFILE.get(profile or "", "vllm")


def head_problems(q_heads: int, kv_heads: int, tp: int, engine: str, name: str,
                  key: str = "parallel.tp") -> list[str]:
    """The head rules of ``engine`` for attention TP ``tp`` (one line per problem)."""
    if q_heads % tp:
        divisors = [d for d in range(1, q_heads + 1) if q_heads % d == 0]
        return [f"{key}: {tp} does not divide the {q_heads} attention heads of {name} "
                f"(allowed: {', '.join(map(str, divisors))}; {engine} refuses)"]
    if engine != "trtllm" and tp % kv_heads and kv_heads % tp:
        return [f"{key}: {tp} is neither a divisor nor a multiple of the {kv_heads} KV heads "
                f"of {name} ({engine} refuses; TensorRT-LLM replicates them: convention = "
                f"\"trtllm\")"]
    return []
