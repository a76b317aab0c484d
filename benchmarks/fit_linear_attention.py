"""Fit the Gated DeltaNet and DSA kernel forms to AIConfigurator's measured tables.

    python benchmarks/fit_linear_attention.py [AIC_DIR]

AIC_DIR defaults to ``<repo>/../shared/calibration/aic`` (NVIDIA AIConfigurator's kernel
database, Apache-2.0). For each GPU (h100_sxm: hopper, b200_sxm: blackwell) and phase, the
layer time (sum of the kernels the vLLM 0.24.0 path runs) is fitted by
``floor + max(F / (e_f P), B / (e_b BW))`` (:func:`simulator.model.linear_attention.layer_time`)
on the even rows, in log-time least squares, and checked on the odd rows. Prints the fitted
parameters (to paste into ``GDN_FIT`` / ``DSA_FIT``) and the held-back median and p90
absolute relative errors.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulator.hardware.specs import load_gpu  # noqa: E402
from simulator.model import linear_attention as la  # noqa: E402
from simulator.model import sparse_attention as sa  # noqa: E402

#: AIConfigurator system folder -> (GPU preset, generation).
GPUS = {"h100_sxm": ("h100_sxm", "hopper"), "b200_sxm": ("b200", "blackwell")}


def gdn_rows(aic: Path, gpu: str) -> pd.DataFrame:
    """One row per measured layer call: the phase's kernels summed."""
    d = pd.read_parquet(aic / gpu / "linear_attention/vllm/0.24.0/gdn_perf.parquet")
    keys = ["phase", "batch_size", "seq_len", "d_model", "d_conv", "num_k_heads",
            "head_k_dim", "num_v_heads", "head_v_dim"]
    return d.groupby(keys, as_index=False)["latency"].sum().sort_values(keys).reset_index(
        drop=True)


def gdn_work(r) -> tuple[float, float]:
    spec = la.LinearAttentionSpec(int(r.num_k_heads), int(r.head_k_dim), int(r.num_v_heads),
                                  int(r.head_v_dim), int(r.d_conv), ())
    if r.phase == "generation":
        return la.decode_work(spec, int(r.batch_size), 1)
    return la.prefill_work(spec, int(r.batch_size * r.seq_len), int(r.batch_size), 1)


def dsa_rows(aic: Path, gpu: str, phase: str) -> pd.DataFrame:
    d = pd.read_parquet(aic / gpu / f"sparse_attention/vllm/0.24.0/dsa_{phase}_module_perf"
                                    ".parquet")
    return d[~d.op_name.str.contains("skip")].reset_index(drop=True)


#: DSA dimensions of the two models in the tables (their config.json files).
DSA_MODELS = {
    "deepseek-ai/DeepSeek-V3.2": dict(hidden=7168, q_lora_rank=1536, kv_lora_rank=512,
                                      qk_nope=128, qk_rope=64, v_head=128, heads=128,
                                      index=(64, 128, 2048)),
    "zai-org/GLM-5": dict(hidden=6144, q_lora_rank=2048, kv_lora_rank=512, qk_nope=192,
                          qk_rope=64, v_head=256, heads=64, index=(32, 128, 2048)),
}


def dsa_work(r, phase: str) -> tuple[float, float]:
    """(FLOPs, bytes) of a measured DSA module call (``num_heads`` per GPU)."""
    dims = dict(DSA_MODELS[r.model])
    ix = sa.SparseAttentionSpec(*dims.pop("index"))
    dims["heads"] = int(r.num_heads)
    shape = sa.DSAShape(index=ix, **dims)
    b, x, c = int(r.batch_size), int(r.isl), int(r.step)
    if phase == "generation":  # the sequence holds `step` tokens, the new one included
        keys = np.full(1, max(c, 1))
    else:
        keys = c + np.arange(1, x + 1)
    pairs = b * float(keys.sum())
    selected = b * float(np.minimum(keys, ix.index_topk).sum())
    kv_b = 1 if r.kv_cache_dtype == "fp8" else 2
    w_b = 1 if r.gemm_type == "fp8_block" else 2
    return shape.work(b * len(keys), pairs, selected, kv_b, w_b)


def fit(flops, nbytes, t, peak, bw):
    """(floor, e_f, e_b) minimising log-time residuals; efficiencies kept in (0, 1]."""
    def model(p):
        floor, ef, eb = np.exp(p)
        return floor + np.maximum(flops / (ef * peak), nbytes / (eb * bw))

    res = least_squares(lambda p: np.log(model(p)) - np.log(t),
                        np.log([min(t.min(), 1e-5) / 2, 0.3, 0.5]),
                        bounds=(np.log([1e-8, 1e-4, 1e-3]), np.log([1e-2, 1.0, 1.0])),
                        loss="soft_l1", f_scale=0.1)
    return tuple(float(x) for x in np.exp(res.x)), model


def report(name, flops, nbytes, t, peak, bw):
    even, odd = slice(0, None, 2), slice(1, None, 2)
    params, _ = fit(flops[even], nbytes[even], t[even], peak, bw)
    floor, ef, eb = params
    pred = floor + np.maximum(flops[odd] / (ef * peak), nbytes[odd] / (eb * bw))
    err = np.abs(pred / t[odd] - 1)
    print(f"{name}: floor {floor:.3g} s, eff_flops {ef:.3g}, eff_bw {eb:.3g}; held-back "
          f"{err.size} rows: median |err| {np.median(err):.1%}, p90 {np.quantile(err, 0.9):.1%}")
    return params, float(np.median(err))


def main(argv: list[str]) -> int:
    aic = Path(argv[0]) if argv else Path(__file__).resolve().parents[1] / "../shared/calibration/aic"
    for gpu_name, (preset, gen) in GPUS.items():
        gpu = load_gpu(preset)
        peak, bw = gpu.peak("bf16"), gpu.hbm_bandwidth_Bps
        rows = gdn_rows(aic, gpu_name)
        for phase, key in (("generation", "decode"), ("context", "prefill")):
            r = rows[rows.phase == phase].reset_index(drop=True)
            work = np.array([gdn_work(x) for x in r.itertuples()])
            report(f"{gen} gdn {key}", work[:, 0], work[:, 1], r.latency.to_numpy() / 1e3,
                   peak, bw)
        for phase in ("context", "generation"):
            r = dsa_rows(aic, gpu_name, phase)
            work = np.array([dsa_work(x, phase) for x in r.itertuples()])
            report(f"{gen} dsa {phase}", work[:, 0], work[:, 1], r.latency.to_numpy() / 1e3,
                   peak, bw)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
