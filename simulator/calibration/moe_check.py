"""Measured MoE, MLA and all-to-all rows -> inputs of :mod:`moe_forms`; predictions and fits.

``moe.csv`` rows give the tokens entering the layer and the routing distribution; the
tokens each local expert received are rebuilt as the collector drew them (AIConfigurator's
``balanced_logits`` and ``power_law_logits_v3``: a truncated power law over experts, the
most loaded EP group on the measured GPU; one draw per shape with a fixed seed, since the
measured draw is not recorded). ``mla_*.csv`` rows become the step aggregates of the MLA
forms, ``alltoall.csv`` rows the bytes of :func:`moe_forms.a2a_bytes`. :mod:`check` and
:mod:`fit` call the functions here for these families.
"""

from __future__ import annotations

import zlib
from dataclasses import replace
from functools import lru_cache

import numpy as np
import pandas as pd

from simulator.calibration import moe_forms
from simulator.calibration.params import Calibration, with_family
from simulator.files import excerpt
from simulator.hardware.specs import GPUSpec

COLUMNS = {
    "moe": ("moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts",
            "moe_tp_size", "moe_ep_size", "distribution", "latency_us"),
    "mla_context": ("kv_cache_dtype", "gemm_dtype", "num_heads", "batch_size", "q_len",
                    "latency_us"),
    "mla_generation": ("kv_cache_dtype", "gemm_dtype", "num_heads", "batch_size", "seq_len",
                       "latency_us"),
    "alltoall": ("mode", "phase", "ep_size", "hidden_size", "topk", "num_experts",
                 "num_tokens_per_rank", "latency_us"),
}
TEXT = ("moe_dtype", "distribution", "gemm_dtype", "mode", "phase")
#: Row tiles of the grouped GEMMs tried by the fit (Triton picks 16-128 by M).
TILES_M = (16, 32, 64, 128)
KV = {"bfloat16": "bf16", "fp8": "fp8"}
#: vLLM's MLA backend choice for prefill: the absorbed (decode) kernel up to this query
#: length (FLASH_ATTN_MLA with bf16 KV, FLASHMLA with FP8 KV), FlashAttention above.
ABSORBED_MAX_Q = {"bf16": 512.0, "fp8": 128.0}
#: Wire bytes per hidden element the check assumes (the source says "default").
A2A_BYTES = 2.0
#: Shapes (hidden, inter, experts, top-k) of non-gated experts (Nemotron-3: squared ReLU,
#: no gate projection); every other measured shape is gated (SwiGLU).
NON_GATED = {(2688, 1856, 128, 6), (1024, 2688, 512, 22), (2048, 5120, 512, 22)}
A2A_DATA_MODES = {"deepep_ht": "normal", "deepep_ll": "low_latency",
                  "deepep_v2_context": "v2_normal", "deepep_v2_generation": "v2_low_latency"}


# ----------------------------------------------------------------------------- routing

def balanced_counts(tokens: int, experts: int, topk: int) -> np.ndarray:
    """Rows per expert of AIConfigurator's balanced router (token i, slot j -> expert
    ``(i + j stride) mod E``, spread over the stride when there are fewer tokens)."""
    stride = -(-experts // topk)
    i, j = np.arange(tokens)[:, None], np.arange(topk)[None, :]
    if tokens >= stride:
        e = (i + j * stride) % experts
    else:
        e = (i * stride / tokens + j * stride).astype(np.int64) % experts
    return np.bincount(e.ravel(), minlength=experts).astype(float)


def power_law_counts(tokens: int, experts: int, topk: int, ep: int, alpha: float,
                     seed: int) -> np.ndarray:
    """Rows per expert of one draw of AIConfigurator's power-law router, the most loaded
    EP group of ``experts / ep`` experts first."""
    rng = np.random.default_rng(seed)
    lo, hi = (1.0, tokens * 0.8) if tokens * topk > experts else (0.01, 2.0)
    u = rng.random(experts)
    x = ((hi ** (1 - alpha) - lo ** (1 - alpha)) * u + lo ** (1 - alpha)) ** (1 / (1 - alpha))
    target = tokens * topk
    counts = np.round(x / x.sum() * target).astype(np.int64)
    order = np.argsort(-counts, kind="stable")
    delta = target - int(counts.sum())
    if delta > 0:
        np.add.at(counts, order[np.arange(delta) % experts], 1)
    elif delta < 0:
        np.subtract.at(counts, order[::-1][np.arange(-delta) % experts], 1)
        short = -int(counts[counts < 0].sum())
        counts = np.maximum(counts, 0)
        counts[np.argmax(counts)] -= short
    groups = counts.reshape(ep, experts // ep)
    top = int(np.argmax(groups.sum(axis=1)))
    groups[[0, top]] = groups[[top, 0]]
    # A token reaches an expert at most once: the router's top-k keeps distinct experts, so
    # no expert receives more rows than there are tokens (the collector's surplus becomes
    # filler picks elsewhere).
    return np.minimum(groups.ravel(), tokens).astype(float)


@lru_cache(maxsize=4096)
def local_counts(tokens: int, experts: int, topk: int, ep: int, distribution: str):
    """Rows each expert on the measured GPU (EP rank 0) receives."""
    if distribution == "balanced":
        counts = balanced_counts(tokens, experts, topk)
    elif distribution.startswith("power_law_") and tokens * topk <= experts:
        # Fewer rows than experts: the collector's power law rounds every expert to 0 and
        # hands the rows out by a sort of ties, which the data shows landing like the
        # balanced router (equal measured times, e.g. 52 / 52 / 49 us for 1 token at EP 16).
        counts = balanced_counts(tokens, experts, topk)
    elif distribution.startswith("power_law_"):
        alpha = float(distribution.removeprefix("power_law_"))
        seed = zlib.crc32(f"{tokens},{experts},{topk},{ep},{distribution}".encode())
        counts = power_law_counts(tokens, experts, topk, ep, alpha, seed)
    else:
        raise ValueError(f"moe.csv: unknown distribution {excerpt(distribution)} (known: "
                         f"balanced, power_law_<alpha>)")
    return counts[: experts // ep]


def moe_inputs(df: pd.DataFrame) -> pd.DataFrame:
    """Per row: parameter key, dtype numbers, and the routing aggregates per row tile."""
    out = {"key": [], "w": [], "a": [], "peak": [], "rows": [], "active": [],
           **{f"padded_{t}": [] for t in (1, *TILES_M)}}
    cols = ("num_tokens", "num_experts", "topk", "moe_ep_size", "distribution", "moe_dtype")
    marlin = (df["kernel_source"].astype(str).str.contains("marlin").to_numpy()
              if "kernel_source" in df else np.zeros(len(df), bool))
    for t, e, k, ep, dist, dt, mar in zip(*(df[c].to_numpy() for c in cols), marlin,
                                          strict=True):
        dt = "w4a16_mxfp4_marlin" if dt == "w4a16_mxfp4" and mar else str(dt)
        key, w, a, peak = moe_forms.moe_dtype(dt, int(ep))
        local = local_counts(int(t), int(e), int(k), int(ep), str(dist))
        out["key"].append(key)
        out["w"].append(w)
        out["a"].append(a)
        out["peak"].append(peak)
        out["rows"].append(local.sum())
        out["active"].append(float((local > 0).sum()))
        for tm in (1, *TILES_M):
            out[f"padded_{tm}"].append(float(np.ceil(local / tm).sum()))
    return pd.DataFrame(out, index=df.index)


def predict_moe_rows(gpu: GPUSpec, df: pd.DataFrame, inp: pd.DataFrame, p=None):
    """Seconds of MoE rows of one parameter key (``p``: override the GPU's parameters).
    The collector hands every EP rank the whole batch, so the permute scans all
    ``num_tokens x topk`` rows."""
    key = inp["key"].iloc[0]
    p = p or gpu.calibration.moe_for(key)
    pad = inp[f"padded_{p.tile_m}"] if p.tile_m in (1, *TILES_M) else None
    if pad is None:
        raise ValueError(f"moe tile_m {p.tile_m} (the check knows {(1, *TILES_M)})")
    inter = df["inter_size"].to_numpy(float) / df["moe_tp_size"].to_numpy(float)
    peak = moe_forms.moe_peak(gpu, key, inp["peak"].iloc[0])
    shape = zip(*(df[c].to_numpy() for c in ("hidden_size", "inter_size", "num_experts",
                                             "topk")), strict=True)
    gated = np.array([tuple(int(v) for v in s) not in NON_GATED for s in shape])
    return moe_forms.expert_time_agg(
        inp["rows"].to_numpy(), inp["active"].to_numpy(), pad.to_numpy(),
        df["hidden_size"].to_numpy(float), inter, p, peak, gpu.hbm_bandwidth_Bps,
        gpu.sm_count, inp["w"].iloc[0], inp["a"].iloc[0], gated,
        df["num_experts"].to_numpy(float) / df["moe_ep_size"].to_numpy(float),
        df["num_tokens"].to_numpy(float) * df["topk"].to_numpy(float))


def predict_moe(gpu: GPUSpec, df: pd.DataFrame) -> np.ndarray:
    inp = moe_inputs(df)
    out = np.empty(len(df))
    for key in inp["key"].unique():
        rows = (inp["key"] == key).to_numpy()
        out[rows] = predict_moe_rows(gpu, df[rows], inp[rows])
    return out


# ----------------------------------------------------------------------------- MLA

def mla_aggregates(df: pd.DataFrame, family: str):
    """``(kv dtype, heads, tokens, pairs, ctx, seqs, gemm dtype)`` arrays of MLA rows."""
    kv = df["kv_cache_dtype"].map(KV).to_numpy()
    gemm = df["gemm_dtype"].to_numpy().astype(str)
    bad_kv = pd.isna(kv)
    bad_gemm = ~np.isin(gemm, ("bfloat16", "bf16", "fp8", "fp8_block", "nvfp4"))
    if bad_kv.any() or bad_gemm.any():
        col, v = (("kv_cache_dtype", df["kv_cache_dtype"].to_numpy()[bad_kv][0]) if bad_kv.any()
                  else ("gemm_dtype", gemm[bad_gemm][0]))
        raise ValueError(f"column {col} has unknown dtype {excerpt(v)} (known: bfloat16, fp8"
                         f"{', fp8_block, nvfp4' if col == 'gemm_dtype' else ''})")
    n, b = df["num_heads"].to_numpy(float), df["batch_size"].to_numpy(float)
    if family == "mla_context":
        q = df["q_len"].to_numpy(float)
        return kv, n, b * q, b * q * (q + 1) / 2, 0.0 * b, b, gemm
    s = df["seq_len"].to_numpy(float)
    return kv, n, b, b * s, b * (s - 1), b, gemm


def predict_mla(gpu: GPUSpec, df: pd.DataFrame, family: str) -> np.ndarray:
    kv, n, tokens, pairs, ctx, seqs, gemm = mla_aggregates(df, family)
    out = np.empty(len(df))
    for k in np.unique(kv):
        for g in np.unique(gemm):
            r = (kv == k) & (gemm == g)
            if not r.any():
                continue
            if family == "mla_context":
                out[r] = moe_forms.mla_prefill_time(gpu, n[r], tokens[r], pairs[r], ctx[r],
                                                    seqs[r], k, g)
            else:
                out[r] = moe_forms.mla_decode_time(gpu, n[r], seqs[r], pairs[r], k, g)
    return out


# ----------------------------------------------------------------------------- all-to-all

def predict_alltoall(gpu: GPUSpec, df: pd.DataFrame, link_Bps: float) -> np.ndarray:
    out = np.empty(len(df))
    for (mode, phase), sub in df.groupby(["mode", "phase"], sort=False):
        m = A2A_DATA_MODES.get(mode)
        if m is None:
            raise ValueError(f"alltoall.csv: unknown mode {excerpt(mode)} (known: "
                             f"{', '.join(A2A_DATA_MODES)})")
        for (h, k, e, ep), rows in sub.groupby(["hidden_size", "topk", "num_experts",
                                                 "ep_size"]):
            out[df.index.get_indexer(rows.index)] = moe_forms.a2a_time(
                m, phase, rows["num_tokens_per_rank"].to_numpy(float), int(h), int(k), int(e),
                int(ep), link_Bps, gpu, A2A_BYTES)
    return out


def with_mla_rule(cal: Calibration) -> Calibration:
    """Set vLLM's absorbed-path threshold and FlashAttention's query tile on the prefill
    parameters (not fitted)."""
    for kv, cut in ABSORBED_MAX_Q.items():
        cal = with_family(cal, "mla_prefill", kv,
                          replace(cal.mla_for("prefill", kv), absorbed_max_q_len=cut,
                                  block_q=128))
    return cal
