"""The search space of the planner: layouts (tp, pp, dp), engine limits, the workload
figures the estimate needs, the "useful KV cache" floor and the rule-of-thumb layout.

Only shape rules live here (tp divides the attention heads, pp <= layers, GPUs suffice);
whether a layout places and fits is the cluster build's call (:func:`simulator.build_plan`),
so a rule that changes there (TP groups across NVLink domains, say) changes the plan too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from simulator.engine.schedulers import SCHEDULERS
from simulator.errors import ScenarioError
from simulator.io.schema import Scenario
from simulator.model.memory import GIB, ExpertLayout, plan_memory, plan_moe_memory
from simulator.model.spec import ModelSpec

#: Engine limits searched (docs/planner.md): running sequences per stream and token budget
#: per step (the chunk size for the sarathi scheduler). The scenario's own values join them.
MAX_NUM_SEQS = (64, 128, 256)
TOKEN_BUDGETS = (2048, 8192)
#: ``max_num_seqs`` of a disaggregated prefill pool searched (the scenario's own joins them;
#: :mod:`simulator.planner.poolaxes`): the most prompts a prefill step batches, which caps
#: the step a prompt joins below the budget.
PREFILL_SEQS = (1, 2, 4, 8)
#: A useful KV cache holds at least this many requests of the workload's mean length
#: (and at least its longest request) per micro-batch stream.
MIN_KV_REQUESTS = 8


@dataclass(frozen=True, order=True)
class Layout:
    """A parallel layout: ``tp * pp`` GPUs per replica, ``dp`` replicas."""

    tp: int
    pp: int
    dp: int
    ep: int = 1  # MoE models: divides tp (each expert sliced over tp / ep GPUs)
    attention_dp: bool = False

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    def __str__(self) -> str:
        return f"TP{self.tp} PP{self.pp} DP{self.dp}" + moe_label(self.ep, self.attention_dp)


def moe_label(ep, attention_dp) -> str:
    """`` EP8``, `` EP8 DP-attn`` or nothing (ep = 1, TP attention)."""
    ep = 1 if ep is None or ep != ep else int(ep)
    return (f" EP{ep}" if ep > 1 else "") + (" DP-attn" if attention_dp is True
                                                 or attention_dp == 1.0 else "")


def layout_label(row) -> str:
    """``TP8 PP1 DP1`` (plus the MoE part) of a candidate or plan row; a disaggregated one
    is ``prefill TP4 PP1 DP1 + decode TP4 PP1 DP1`` (then `` (prefill budget 16384)`` where
    the row has the prefill pool's budget, `` (prefill budget 4096, max_num_seqs 2)`` where
    its ``max_num_seqs`` is one of :data:`PREFILL_SEQS`: any other value is the scenario's),
    a speculative one ends in ``spec k=3``."""
    kind = row.get("node")  # multi-kind plans (simulator.planner.kinds)
    own = (f"TP{int(row['tp'])} PP{int(row['pp'])} DP{int(row['dp'])}"
           + moe_label(row.get("ep"), row.get("attention_dp")))
    dec = cross_kind(row)  # each pool names its kind (simulator.planner.hetero)
    mix = row.get("mix_node")  # colocated DP on two kinds (simulator.planner.mixdp)
    if isinstance(mix, str):
        shape = f"TP{int(row['tp'])} PP{int(row['pp'])} DP"
        moe, n_b = moe_label(row.get("ep"), row.get("attention_dp")), int(row["mix_dp"])
        return f"{kind} {shape}{int(row['dp']) - n_b}{moe} + {mix} {shape}{n_b}{moe}"
    if row.get("kind") == "disaggregated":
        own = (f"prefill {kind + ' ' if dec and isinstance(kind, str) else ''}"
               f"TP{int(row['prefill_tp'])} PP{int(row['prefill_pp'])} "
               f"DP{int(row['prefill_dp'])}"
               + moe_label(row.get("prefill_ep"), row.get("prefill_attention_dp"))
               + f" + decode {dec + ' ' if dec else ''}{own}")
        kind = None if dec else kind
        budget = row.get("prefill_max_num_batched_tokens")
        if budget is not None and budget == budget:
            seqs = row.get("prefill_max_num_seqs")
            shown = seqs is not None and seqs == seqs and int(seqs) in PREFILL_SEQS
            own += (f" (prefill budget {int(budget)}, max_num_seqs {int(seqs)})" if shown
                    else f" (prefill budget {int(budget)})")
    if speculating(row):
        own += f" spec k={int(row['spec_k'])}"
    return (f"{kind} " if isinstance(kind, str) else "") + own


@dataclass(frozen=True, order=True)
class Limits:
    """Engine limits of a candidate. ``chunk_size`` is set for the sarathi scheduler only
    (its fixed token budget per step); ``max_num_batched_tokens`` is vLLM's budget."""

    max_num_seqs: int
    max_num_batched_tokens: int
    chunk_size: int | None = None

    @property
    def budget(self) -> int:
        """Tokens a step may hold (what the scheduler uses)."""
        if self.chunk_size is None:
            return self.max_num_batched_tokens
        return max(self.chunk_size, self.max_num_seqs)

    def overrides(self) -> dict:
        """Dotted scenario keys that set these limits."""
        out = {"engine.max_num_seqs": self.max_num_seqs,
               "engine.max_num_batched_tokens": self.max_num_batched_tokens}
        if self.chunk_size is not None:
            out["engine.scheduler_args"] = {"chunk_size": self.chunk_size}
        return out

    @classmethod
    def of_row(cls, row) -> Limits:
        """The engine limits of a candidate row (``chunk_size`` missing, None or NaN:
        not sarathi)."""
        chunk = row.get("chunk_size")
        return cls(int(row["max_num_seqs"]), int(row["max_num_batched_tokens"]),
                   None if chunk is None or pd.isna(chunk) else int(chunk))


@dataclass(frozen=True)
class WorkloadStats:
    """What the estimate needs from the workload (requests as ``check`` draws them).

    ``rate_per_s`` is the offered rate, ``(n - 1) / (last arrival - first arrival)``;
    ``concurrency`` is set instead for closed-loop workloads.
    """

    rate_per_s: float | None
    concurrency: int | None
    prompt_mean: float
    prompt_p99: float
    output_mean: float
    longest: int  # prompt + output of the longest request
    requests: int
    output_cv2: float = 1.0  # squared coefficient of variation of the output lengths


def workload_stats(s: Scenario, requests: pd.DataFrame | None) -> WorkloadStats:
    """Workload figures from the requests ``check`` drew (open loop) or, for a closed loop,
    from the length distributions' means."""
    if requests is None or requests.empty:
        w = s.workload
        prompt, output = _length_mean(w.prompt_tokens), _length_mean(w.output_tokens)
        return WorkloadStats(None, w.concurrency, prompt, prompt, output,
                             int(_length_max(w.prompt_tokens) + _length_max(w.output_tokens)),
                             int(w.num_requests or 0))
    p = requests["prompt_tokens"].to_numpy(dtype=float)
    o = requests["output_tokens"].to_numpy(dtype=float)
    t = requests["arrival_s"].to_numpy(dtype=float)
    span = float(t.max() - t.min())
    rate = (len(t) - 1) / span if len(t) > 1 and span > 0 else float("inf")
    return WorkloadStats(rate, None, float(p.mean()), float(np.percentile(p, 99)),
                         float(o.mean()), int((p + o).max()), len(t),
                         float(o.var() / o.mean() ** 2) if o.mean() > 0 else 0.0)


def _length_mean(spec) -> float:
    if isinstance(spec, int):
        return float(spec)
    if spec["dist"] == "constant":
        return float(spec["value"])
    if spec["dist"] == "uniform":
        return (spec["min"] + spec["max"]) / 2
    return float(spec["mean"])


def _length_max(spec) -> float:
    if isinstance(spec, int):
        return float(spec)
    if spec["dist"] == "constant":
        return float(spec["value"])
    return float(spec.get("max", 4 * _length_mean(spec)))


def useful_kv_tokens(stats: WorkloadStats, max_model_len: int) -> int:
    """KV tokens per micro-batch stream below which a layout is not worth running.

    ``max(min(longest request, max_model_len), MIN_KV_REQUESTS * (prompt mean + output
    mean))``: the longest request must fit, and a handful of mean requests must share the
    cache, or the batch (hence throughput) collapses.
    """
    mean = stats.prompt_mean + stats.output_mean
    return int(max(min(stats.longest, max_model_len), math.ceil(MIN_KV_REQUESTS * mean)))


def legal_tps(model: ModelSpec, gpus: int) -> list[int]:
    """TP degrees up to ``gpus`` that divide the attention heads (the build checks the KV
    head rule and the NVLink domain)."""
    return [t for t in range(1, gpus + 1) if model.q_heads % t == 0]


def layouts(model: ModelSpec, gpus: int) -> list[Layout]:
    """Every (tp, pp, dp) with tp dividing the heads, pp <= layers and tp*pp*dp <= gpus,
    in a stable order (GPUs, then tp, pp, dp). For a MoE model each layout with tp > 1
    also comes with expert parallelism (ep = tp) under TP and under DP attention, and with
    MoE-TP under DP attention (ep = 1: all-gather / reduce-scatter around the experts);
    with tp >= 4 also with EP x MoE-TP2 (ep = tp / 2) under TP attention."""
    out = [Layout(tp, pp, dp)
           for tp in legal_tps(model, gpus)
           for pp in range(1, min(model.layers, gpus // tp) + 1)
           for dp in range(1, gpus // (tp * pp) + 1)]
    if model.moe is not None:
        out += [Layout(lay.tp, lay.pp, lay.dp, ep, adp) for lay in out if lay.tp > 1
                for ep, adp in ((lay.tp, False), (lay.tp, True), (1, True),
                                (lay.tp // 2, False))
                if ep > 1 or adp]  # tp = 2: ep = tp / 2 is MoE-TP under TP attention
    return sorted(out, key=lambda lay: (lay.gpus, lay.tp, lay.pp, lay.dp, lay.ep,
                                        lay.attention_dp))


def engine_limits(s: Scenario) -> list[Limits]:
    """The engine limits searched: ``MAX_NUM_SEQS x TOKEN_BUDGETS`` plus the scenario's own
    values. For the sarathi scheduler the budgets are its chunk sizes; for schedulers that
    do not split prompts, budgets below the scenario's are dropped (a prompt runs whole)."""
    e = s.engine
    seqs = sorted({*MAX_NUM_SEQS, e.max_num_seqs})
    if e.scheduler == "sarathi":
        own = (e.scheduler_args or {}).get("chunk_size", SCHEDULERS["sarathi"].PARAMS[
            "chunk_size"])
        chunks = sorted({*(b // 4 for b in TOKEN_BUDGETS), own})
        return [Limits(n, max(e.max_num_batched_tokens, n), c) for n in seqs for c in chunks]
    budgets = sorted({*TOKEN_BUDGETS, e.max_num_batched_tokens})
    if not SCHEDULERS[e.scheduler].CHUNKED:
        budgets = [b for b in budgets if b >= e.max_num_batched_tokens]
    return [Limits(n, b) for n in seqs for b in budgets if b >= n]


def rule_of_thumb(s: Scenario, model: ModelSpec, gpu_memory_bytes: float, node_gpus: int,
                  gpus: int, stats: WorkloadStats, domain: str = "NVLink"
                  ) -> tuple[Layout, str]:
    """The practitioners' layout and how it was reached (docs/planner.md).

    TP = the largest TP degree that divides the heads (and obeys the KV-head rule) within
    one NVLink domain, one node's ``node_gpus`` (an NVL72 rack is one node), and ``gpus``;
    PP = the fewest stages with which the weights plus a useful KV cache
    (:func:`useful_kv_tokens`) fit at the scenario's engine limits; DP = the remaining
    GPUs, ``gpus // (tp * pp)``. ``domain`` names the scale-up domain in the explanation
    (``"NVLink"``, or ``"PCIe"`` for a node without NVLink).

    Raises
    ------
    ScenarioError
        When no PP degree makes the model fit within ``gpus``.
    """
    e = s.engine
    tp = max(t for t in legal_tps(model, min(gpus, node_gpus))
             if t <= model.kv_heads or t % model.kv_heads == 0)
    short = ""
    for pp in range(1, min(model.layers, gpus // tp) + 1):
        try:
            if model.layer_plan:  # vLLM's default: MoE-TP
                expert = (model.moe.expert_dtype if model.moe and model.moe.expert_dtype
                          else s.model.weight_dtype)
                mem = plan_moe_memory(model, gpu_memory_bytes, tp, pp,
                                      ExpertLayout(expert_dtype=expert), s.model.weight_dtype,
                                      s.model.kv_dtype, e.block_size, e.gpu_memory_utilization,
                                      e.max_num_batched_tokens, e.max_num_seqs,
                                      e.runtime_reserve_gib * GIB)
            else:
                mem = plan_memory(model, gpu_memory_bytes, tp, pp, s.model.weight_dtype,
                                  s.model.kv_dtype, e.block_size, e.gpu_memory_utilization,
                                  e.max_num_batched_tokens, e.max_num_seqs,
                                  e.runtime_reserve_gib * GIB)
        except ScenarioError as exc:
            short = exc.problems[0]
            continue
        streams = e.max_inflight_microbatches or pp
        need = useful_kv_tokens(stats, model.max_position_embeddings)
        if mem.kv_tokens // streams >= need:
            fills = (f"TP{tp} fills the {domain} domain ({node_gpus} GPUs)" if tp == node_gpus
                     else f"TP{tp} is the largest TP dividing the {model.q_heads} heads within "
                          f"{min(gpus, node_gpus)} GPUs of one {domain} domain")
            why = (f"{fills}; "
                   + ("one stage holds the model and a useful KV cache"
                      if pp == 1 else f"PP{pp} is the fewest stages that hold the model and "
                                      f"{need} KV tokens per stream")
                   + f"; DP{gpus // (tp * pp)} uses the remaining GPUs")
            return Layout(tp, pp, gpus // (tp * pp)), why
        short = (f"tp={tp}, pp={pp} leaves {mem.kv_tokens // streams} KV tokens per stream, "
                 f"under the useful {need}")
    raise ScenarioError(f"rule of thumb: no PP degree fits {model.name} with TP{tp} on "
                        f"{gpus} GPUs ({short})")


def cross_kind(row) -> str | None:
    """The decode pool's node kind of a cross-kind disaggregated row (its
    ``decode_node`` differs from its ``node``; simulator.planner.hetero), else None."""
    dec = row.get("decode_node")
    return dec if isinstance(dec, str) and dec != row.get("node") else None


def speculating(row) -> bool:
    """Whether a candidate row speculates: its ``spec_k`` is set (not None, not nan) and
    above 0."""
    k = row.get("spec_k")
    return k is not None and k == k and int(k) > 0
