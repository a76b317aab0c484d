"""Fit and check the Gated DeltaNet and DeepSeek-sparse-attention forms on measured tables.

The tables are AIConfigurator's (NVIDIA, Apache-2.0; ``<repo>/../shared/calibration/aic``,
see its README): ``linear_attention/vllm/0.24.0/gdn_perf`` (one row per kernel: a layer
call is the sum of the kernels of its phase, ``causal_conv1d_*`` plus the gated delta
rule) and ``sparse_attention/vllm/0.24.0/dsa_{context,generation}_module_perf`` (the whole
DSA attention module of DeepSeek-V3.2 and GLM-5; the ``*_skip_indexer`` rows of GLM-5.2
are left out). Each row's FLOPs and bytes come from the same work functions the stage
cost uses (:mod:`simulator.model.linear_attention`, :mod:`simulator.model.sparse_attention`);
:func:`fit_form` fits ``floor + max(F / (e_f P), B / (e_b BW))`` on the even rows (robust
``soft_l1`` least squares on log time, efficiencies in (0, 1]) and :func:`held_back_error`
scores parameters on the odd rows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from simulator.model import linear_attention as la
from simulator.model import sparse_attention as sa
from simulator.model.fitted import fitted_time

#: AIConfigurator system folder -> (GPU preset, generation).
SYSTEMS = {"h100_sxm": ("h100_sxm", "hopper"), "b200_sxm": ("b200", "blackwell")}
#: DSA dimensions of the two models in the tables (their config.json files).
DSA_MODELS = {
    "deepseek-ai/DeepSeek-V3.2": dict(hidden=7168, q_lora_rank=1536, kv_lora_rank=512,
                                      qk_nope=128, qk_rope=64, v_head=128,
                                      index=(64, 128, 2048)),
    "zai-org/GLM-5": dict(hidden=6144, q_lora_rank=2048, kv_lora_rank=512, qk_nope=192,
                          qk_rope=64, v_head=256, index=(32, 128, 2048)),
}


def gdn_table(aic: Path, system: str, phase: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(FLOPs, bytes, seconds) of each measured GDN layer call of ``phase``
    (``"decode"`` or ``"prefill"``), head counts per GPU as measured."""
    d = pd.read_parquet(aic / system / "linear_attention/vllm/0.24.0/gdn_perf.parquet")
    d = d[d.phase == ("generation" if phase == "decode" else "context")]
    keys = ["batch_size", "seq_len", "d_model", "d_conv", "num_k_heads", "head_k_dim",
            "num_v_heads", "head_v_dim"]
    rows = d.groupby(keys, as_index=False)["latency"].sum().sort_values(keys)
    work = []
    for r in rows.itertuples():
        spec = la.LinearAttentionSpec(r.num_k_heads, r.head_k_dim, r.num_v_heads,
                                      r.head_v_dim, r.d_conv, ())
        work.append(la.decode_work(spec, r.batch_size, 1) if phase == "decode" else
                    la.prefill_work(spec, r.batch_size * r.seq_len, r.batch_size, 1))
    w = np.array(work)
    return w[:, 0], w[:, 1], rows.latency.to_numpy() / 1e3  # ms -> s


def dsa_table(aic: Path, system: str, phase: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(FLOPs, bytes, seconds) of each measured DSA module call of ``phase``."""
    name = "generation" if phase == "decode" else "context"
    d = pd.read_parquet(aic / system / f"sparse_attention/vllm/0.24.0/dsa_{name}_module_perf"
                                       f".parquet")
    d = d[~d.op_name.str.contains("skip")]
    work = []
    for r in d.itertuples():
        dims = dict(DSA_MODELS[r.model])
        ix = sa.SparseAttentionSpec(*dims.pop("index"))
        shape = sa.DSAShape(heads=int(r.num_heads), index=ix, **dims)
        b, x, c = int(r.batch_size), int(r.isl), int(r.step)
        # generation: the sequence holds `step` tokens, the new one included
        keys = np.full(1, max(c, 1)) if phase == "decode" else c + np.arange(1, x + 1)
        work.append(shape.work(b * len(keys), b * float(keys.sum()),
                               b * float(np.minimum(keys, ix.index_topk).sum()),
                               1 if r.kv_cache_dtype == "fp8" else 2,
                               1 if r.gemm_type == "fp8_block" else 2))
    w = np.array(work)
    return w[:, 0], w[:, 1], d.latency.to_numpy() / 1e3


def fit_form(flops, nbytes, seconds, peak: float, bw: float) -> tuple[float, float, float]:
    """(floor_s, eff_flops, eff_bw) of the even rows."""
    f, b, t = flops[::2], nbytes[::2], seconds[::2]

    def residual(p):
        return np.log(fitted_time(tuple(np.exp(p)), f, b, peak, bw)) - np.log(t)

    res = least_squares(residual, np.log([min(t.min(), 1e-5) / 2, 0.3, 0.5]),
                        bounds=(np.log([1e-8, 1e-4, 1e-3]), np.log([1e-2, 1.0, 1.0])),
                        loss="soft_l1", f_scale=0.1)
    return tuple(float(x) for x in np.exp(res.x))


def held_back_error(params, flops, nbytes, seconds, peak: float, bw: float) -> np.ndarray:
    """|predicted / measured - 1| on the odd rows."""
    pred = fitted_time(params, flops[1::2], nbytes[1::2], peak, bw)
    return np.abs(pred / seconds[1::2] - 1)
