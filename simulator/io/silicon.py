"""Measured serving runs as scenarios: one row of NVIDIA AIConfigurator's silicon data
(``../shared/validation/``, Apache-2.0) becomes the scenario that reproduces it.

A row is a fixed-ISL/OSL benchmark at fixed concurrency on one engine and GPU, in one of
two modes:

- ``agg``: one engine serves prefill and decode; the scenario is one replica with the
  row's layout;
- ``disagg``: ``prefill_num_workers`` prefill engines and ``decode_num_workers`` decode
  engines, each with its own layout (the ``prefill_`` and ``decode_`` columns); the
  scenario has a ``prefill`` and a ``decode`` ``[[pools]]`` entry (docs/disaggregation.md)
  behind Dynamo's front end, which streams every token from the decode worker: the
  client's first token arrives with the KV (``first_token = "decode"``).

Layouts, as the rows spell them (AIConfigurator's columns, the same for every engine):
``tp_size`` is the attention TP of one attention group, ``attention_dp_size`` the number of
attention groups of one engine, so the engine has ``tp x attention_dp`` GPUs per pipeline
stage, over which its MoE layers run as ``moe_tp_size x moe_ep_size`` (their product is
that GPU count). In the simulator's spelling (docs/moe.md, "Layouts"): ``tp = tp_size x
attention_dp_size``, ``ep = moe_ep_size``, ``attention_dp = attention_dp_size > 1`` with
``attention_tp = tp_size``. A row whose MoE group does not cover the engine's GPUs, or a
dense row with attention DP, is refused with the reason.

KV cache precision: TensorRT-LLM serves quantized DeepSeek-V3 with an FP8 MLA cache
(``kv_cache_config: dtype: fp8`` in its DeepSeek serving configurations, e.g.
``examples/serve/deepseek_r1_reasoning_parser.sh``); SGLang's ``--kv-cache-dtype auto``
keeps the 16-bit cache, and so does every engine for Qwen3-32B, whose quantized
checkpoints carry no KV-cache scales. Every request has the row's ISL and OSL; the client
keeps ``concurrency`` requests in flight (a closed loop).

The benchmark client of an aggregated row: AIConfigurator benchmarks every deployment with
AIPerf (``aiperf profile --concurrency C``; ``src/aiconfigurator/generator/sflow.py``
``_build_bench_script`` and ``generator/config/backend_templates/benchmark/bench_run.sh.j2``):
``--request-count`` ``MULTI_ROUND x C`` requests (``MULTI_ROUND`` 20 by default) after
``--warmup-request-count C`` warm-up requests, streamed through the server's OpenAI API
front end with ``ignore_eos``. The scenario is the ``aiperf`` client (docs/scenario.md,
"Benchmark clients") with ``ROUNDS x C`` measured requests and ``C`` warm-ups, so the
first wave's lockstep is one of twenty, as in the measurement. Its engine has the
limits AIConfigurator's generator deploys (:func:`agg_engine`). Disaggregated rows keep
the plain closed loop of ``2 x C`` requests (docs/disaggregation.md judges them on TPOT).

A row is any mapping of column name to value (a ``dict`` or a pandas row); missing values
are ``None`` or NaN.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from simulator.hardware.specs import load_node

#: The rows' ``system`` -> node preset.
TOPOLOGY = {"h100_sxm": "dgx-h100", "h200_sxm": "hgx-h200", "b200_sxm": "hgx-b200",
            "gb200": "gb200-nvl72"}
#: The rows' ``backend`` -> engine profile.
PROFILE = {"vllm": "vllm-v1", "sglang": "sglang", "trtllm": "trtllm"}
#: The rows' ``model_path`` -> model preset, and which of them are mixtures of experts.
MODEL = {"deepseek-ai/DeepSeek-V3": "deepseek-v3", "Qwen/Qwen3-32B": "qwen3-32b"}
MOE_MODELS = ("deepseek-v3",)
#: The runs' GEMM precision -> the scenario's weight dtype.
WEIGHTS = {"fp8": "fp8", "fp8_block": "fp8", "nvfp4": "fp4", "": "bf16"}
#: (engine, model) pairs whose quantized runs keep an FP8 KV cache.
FP8_KV = (("trtllm", "deepseek-v3"),)
#: The client that measured every aggregated row, its measured requests per unit of
#: concurrency (AIConfigurator's ``MULTI_ROUND``) and its warm-ups per unit of concurrency.
CLIENT, ROUNDS, WARMUP_ROUNDS = "aiperf", 20, 1

Row = Mapping[str, Any]
Refusable = tuple[dict | None, str]


def _value(row: Row, col: str) -> Any:
    v = row.get(col)
    if v is None or (isinstance(v, float) and math.isnan(v)) or v == "":
        return None
    return v


def _int(row: Row, col: str, default: int | None = 1) -> int | None:
    v = _value(row, col)
    return default if v is None else int(v)


def layout(row: Row, moe: bool, prefix: str = "") -> Refusable:
    """The ``[parallel]`` (or pool) layout keys of one engine of the row, and ``""``; or
    ``None`` and why it cannot be expressed. ``prefix`` is ``""``, ``"prefill_"`` or
    ``"decode_"`` (which engine of a disaggregated row)."""
    tp, pp = _int(row, f"{prefix}tp_size"), _int(row, f"{prefix}pp_size")
    dp = _int(row, f"{prefix}attention_dp_size")
    gpus = tp * dp
    if not moe:
        if dp > 1:
            return None, f"{prefix}attention_dp_size {dp}: attention DP on a dense model"
        return {"tp": tp, "pp": pp, "dp": 1}, ""
    etp, ep = _int(row, f"{prefix}moe_tp_size", None), _int(row, f"{prefix}moe_ep_size", None)
    if etp is None and ep is None:
        etp, ep = gpus, 1
    elif etp is None or ep is None:
        ep = ep or gpus // etp
        etp = etp or gpus // ep
    if etp * ep != gpus:
        return None, (f"{prefix}moe_tp_size x {prefix}moe_ep_size = {etp} x {ep} is not the "
                      f"engine's {tp} x {dp} GPUs ({prefix}tp_size x "
                      f"{prefix}attention_dp_size)")
    par: dict = {"tp": gpus, "pp": pp, "dp": 1, "ep": ep}
    if dp > 1:
        par["attention_dp"] = True
        if tp > 1:
            par["attention_tp"] = tp
    return par, ""


def _common(row: Row) -> tuple[str, str, bool, dict] | str:
    """Model preset, node preset, MoE?, ``[model]`` table; or why the row is refused."""
    model = MODEL.get(str(row.get("model_path")))
    if model is None:
        return f"model_path {row.get('model_path')!r}: not one of {', '.join(MODEL)}"
    system = str(row.get("system"))
    if system not in TOPOLOGY:
        return f"system {system!r}: not one of {', '.join(TOPOLOGY)}"
    backend = str(row.get("backend"))
    if backend not in PROFILE:
        return f"backend {backend!r}: not one of {', '.join(PROFILE)}"
    gemm = str(_value(row, "gemm_quant_mode") or "")
    if gemm not in WEIGHTS:
        return f"gemm_quant_mode {gemm!r}: not one of {', '.join(repr(w) for w in WEIGHTS)}"
    spec = {"name": model, "weight_dtype": WEIGHTS[gemm]}
    if gemm and (backend, model) in FP8_KV:
        spec["kv_dtype"] = "fp8"
    return model, TOPOLOGY[system], model in MOE_MODELS, spec


def concurrency(row: Row) -> int:
    """Requests the client keeps in flight: ``concurrency``, else ``batch_size``."""
    return _int(row, "concurrency", None) or _int(row, "batch_size")


def _workload(row: Row, conc: int) -> dict:
    return {"arrival": "closed_loop", "concurrency": conc,
            "num_requests": max(2 * conc, 8), "prompt_tokens": int(row["isl"]),
            "output_tokens": int(row["osl"])}


def agg_engine(row: Row, conc: int) -> dict:
    """The ``[engine]`` of an aggregated row: the engine's profile with the limits
    AIConfigurator's generator gives the deployment it benchmarks
    (``generator/rule_plugin/benchmark/{vllm,sglang,trtllm}.rule``): ``max_batch_size``
    sequences (the row's ``batch_size``) and a token budget of one prompt and 1,500
    tokens more: ``max_batch_size + isl + 1500`` for vLLM's ``max-num-batched-tokens`` and
    TensorRT-LLM's ``max_num_tokens`` (rounded up to its 32-token blocks), ``isl + 1500``
    for SGLang's ``max-prefill-tokens``, which counts the decodes mixed into a prefill
    step (``enable_mixed_chunk = true``)."""
    backend, isl = str(row["backend"]), int(row["isl"])
    seqs = _int(row, "batch_size", None) or conc
    budget = isl + 1500 if backend == "sglang" else seqs + isl + 1500
    if backend == "trtllm":
        budget = -(-budget // 32) * 32
    return {"profile": PROFILE[backend], "max_num_seqs": max(seqs, 1),
            "max_num_batched_tokens": budget}


def agg_workload(row: Row, conc: int) -> dict:
    """The ``[workload]`` of an aggregated row: AIPerf at concurrency ``conc``,
    ``ROUNDS x conc`` measured requests after ``WARMUP_ROUNDS x conc`` warm-ups."""
    return {"arrival": "closed_loop", "client": CLIENT, "concurrency": conc,
            "warmup_requests": WARMUP_ROUNDS * conc, "num_requests": ROUNDS * conc,
            "prompt_tokens": int(row["isl"]), "output_tokens": int(row["osl"])}


def _name(row: Row, model: str, conc: int) -> str:
    mode = "" if row.get("mode", "agg") == "agg" else "-disagg"
    return (f"{model}-{row['system']}-{row['backend']}{mode}-{int(row['isl'])}x"
            f"{int(row['osl'])}-c{conc}")


def agg_scenario(row: Row) -> Refusable:
    """The scenario of an aggregated row: one replica of the row's layout (``None`` and
    why, when it cannot be expressed)."""
    common = _common(row)
    if isinstance(common, str):
        return None, common
    model, topology, moe, spec = common
    par, why = layout(row, moe)
    if par is None:
        return None, why
    conc = concurrency(row)
    per_node = load_node(topology).gpus_per_node
    return {"name": _name(row, model, conc), "seed": 0, "model": spec,
            "cluster": {"topology": topology,
                        "nodes": max(1, -(-par["tp"] * par["pp"] // per_node))},
            "parallel": par,
            "engine": agg_engine(row, conc),
            "workload": agg_workload(row, conc),
            "output": {"steps": False, "trace": False}}, ""


def disagg_scenario(row: Row) -> Refusable:
    """The scenario of a disaggregated row: a ``prefill`` pool of ``prefill_num_workers``
    engines and a ``decode`` pool of ``decode_num_workers`` engines, each with its own
    layout (``None`` and why, when it cannot be expressed).

    Each decode engine takes ``decode_batch_size`` sequences per attention group (the
    row's ``concurrency`` is ``decode_batch_size x decode_attention_dp_size x
    decode_num_workers``), each prefill engine ``prefill_batch_size`` prompts per
    attention group and step. The pools sit on nodes of their own, except on an NVL72
    rack, where both share one NVLink domain when they fit in it.
    """
    common = _common(row)
    if isinstance(common, str):
        return None, common
    model, topology, moe, spec = common
    pools, gpus = [], {}
    for role in ("prefill", "decode"):
        workers = _int(row, f"{role}_num_workers", None)
        if workers is None:
            return None, f"{role}_num_workers: missing (the run's worker count is unknown)"
        par, why = layout(row, moe, f"{role}_")
        if par is None:
            return None, why
        per_group = _int(row, f"{role}_batch_size")
        groups = par["tp"] // par.get("attention_tp", 1) if par.get("attention_dp") else 1
        engine = {"max_num_seqs": per_group * groups}
        pool = {"name": role, "role": role, **par, "dp": workers, "engine": engine}
        if role == "prefill":
            engine["max_num_batched_tokens"] = max(per_group * groups * int(row["isl"]), 1)
            # Dynamo's front end streams every token from the decode worker.
            pool["first_token"] = "decode"
        pools.append(pool)
        gpus[role] = par["tp"] * par["pp"] * workers
    per_node = load_node(topology).gpus_per_node
    if per_node > 8 and sum(gpus.values()) <= per_node:
        pools[0]["nodes"] = 1
        pools[1]["same_nodes_as"] = "prefill"
    else:
        for pool in pools:
            pool["nodes"] = max(1, -(-gpus[pool["role"]] // per_node))
    conc = concurrency(row)
    return {"name": _name(row, model, conc), "seed": 0, "model": spec,
            "cluster": {"topology": topology},
            "engine": {"profile": PROFILE[str(row["backend"])]},
            "pools": pools,
            "workload": _workload(row, conc),
            "output": {"steps": False, "trace": False}}, ""


def scenario(row: Row) -> Refusable:
    """The scenario that reproduces one measured row (its ``mode`` decides which), or
    ``None`` and why it cannot be expressed."""
    mode = row.get("mode") or "agg"
    if mode == "agg":
        return agg_scenario(row)
    if mode == "disagg":
        return disagg_scenario(row)
    return None, f"mode {mode!r}: not one of 'agg', 'disagg'"


__all__ = ["CLIENT", "ROUNDS", "WARMUP_ROUNDS", "agg_engine", "agg_scenario", "agg_workload",
           "concurrency", "disagg_scenario", "layout", "scenario"]
