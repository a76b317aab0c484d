"""Bias checks of the per-engine kernel fits: errors on the held-back half, roofline floors.

The shipped fits (:mod:`engines`) saw half 0 of every AIConfigurator table
(:func:`aic.halves`); :func:`held_out` prices half 1 with them and reports the median
absolute and signed error per (GPU, engine, family). :func:`floor_violations` counts rows
priced faster than their roofline: every row priced again with :func:`ideal`, the
calibration whose forms reduce to the roofline (efficiencies 1, no latencies, no tiles;
every collective algorithm available at zero launch cost and the full link bandwidth).
``benchmarks/validation/kernel_bias.py`` prints both.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from simulator.calibration import aic, check, engines, forms, moe_forms
from simulator.calibration.params import Calibration, CollectiveParams
from simulator.hardware.specs import GPUSpec, load_gpu

#: Every collective algorithm at its physical floor (``forms.allreduce_times`` with zero
#: latency terms and efficiency 1): the fastest of them bounds any fitted one from below.
IDEAL_COLLECTIVES = CollectiveParams(
    ring_launch_s=0.0, ring_step_s=0.0, ring_eff=1.0, tree_launch_s=0.0, tree_eff=1.0,
    nvls_launch_s=0.0, nvls_eff=1.0, custom_launch_s=0.0, custom_eff=1.0,
    gather_launch_s=0.0, alltoall_launch_s=0.0)


def ideal() -> Calibration:
    """The calibration whose every form is its roofline."""
    return Calibration(collectives=IDEAL_COLLECTIVES, source="roofline")


def engine_spec(gpu_name: str, engine: str) -> GPUSpec:
    """The GPU preset with the engine's kernel calibration (shipped fit or fallback)."""
    return engines.engine_gpu(load_gpu(gpu_name), engines.PROFILE_OF_ENGINE[engine])


def held_out(gpu_name: str, engine: str, root: str | Path, rows: int = aic.FIT_ROWS,
             seed: int = 1) -> pd.DataFrame:
    """Per family of the held-back half: rows, median |error| %, median signed error %
    (bias) and rows priced below their roofline, with the engine's calibration.

    ``rows`` caps the rows per family and kernel variant (a seeded sample of half 1).
    """
    gpu = engine_spec(gpu_name, engine)
    data = aic.sample(aic.half(aic.load(root, gpu_name, engine), 1), rows, seed)
    report = check.check(gpu, data)
    floor = check.check(replace(gpu, calibration=ideal()), data)
    report["below_floor"] = report["predicted_us"].to_numpy() < floor[
        "predicted_us"].to_numpy() * (1 - 1e-9)
    g = report.groupby("family", sort=False)
    out = pd.DataFrame({"rows": g.size(),
                        "median_abs_error_pct": g["error_pct"].apply(
                            lambda e: float(np.median(np.abs(e)))),
                        "bias_pct": g["error_pct"].median(),
                        "below_floor": g["below_floor"].sum()})
    return out.reset_index().assign(gpu=gpu_name, engine=engine)


def fitted_pairs() -> list[tuple[str, str]]:
    """Every (GPU preset, engine) with a fit: shipped files and the GPU files' own."""
    pairs = [tuple(p.stem.rsplit("_", 1)) for p in sorted(engines.FITS.glob("*.toml"))]
    pairs += [(g, e) for g, e in engines.OWN_FIT.items() if (g, e) not in pairs]
    return sorted(pairs)


#: The shapes :func:`figures` prices: Llama-3.1-70B TP4 prefill of 512 tokens (an 8 MiB
#: bf16 all-reduce over 4 GPUs, hidden 8192); a large square GEMM; one MLA decode layer of
#: DeepSeek-V3 at TP4 (32 heads, 1 sequence, 1,024 cached tokens, FP8 KV, block-FP8
#: projections); an EP8 decode step's experts (32 local experts x 4 rows, hidden 7,168,
#: intermediate 2,048).
ALLREDUCE_BYTES, ALLREDUCE_RANKS = 512 * 8192 * 2, 4
GEMM_SIDE = 8192
MOE_LOADS, MOE_HIDDEN, MOE_INTER = (32, 4.0), 7168, 2048


#: (GPU, profile) rows of the figures table: profile none (the calibration before
#: per-engine fits), then each engine's.
FIGURE_ROWS = tuple((g, p) for g in ("h100_sxm", "h200_sxm", "b200", "gb200")
                    for p in ("none", "vllm-v1", "sglang", "trtllm"))


def figures(gpu: GPUSpec) -> dict[str, float]:
    """What a calibration says about the shapes of docs/cost-model.md ("Per-engine
    kernels"): all-reduce bus bandwidth (GB/s), large-GEMM fraction of the bf16 peak, MLA
    decode layer (us), DeepEP low-latency dispatch launch (us), NVFP4 / block-FP8 expert
    time (a ratio; NaN without FP4 tensor cores)."""
    cal, link = gpu.calibration, check.scale_up_for(gpu)
    n, s = ALLREDUCE_RANKS, ALLREDUCE_BYTES
    t_ar = min(float(forms.collective_time(cal.collectives, "all_reduce", n, s,
                                           link.bandwidth_Bps, link.latency_s,
                                           link.in_switch, custom=c)) for c in (False, True))
    g = GEMM_SIDE
    t_gemm = float(forms.gemm_time(g, g, g, cal.gemm_for("bf16"), *check.gemm_args(gpu, "bf16")))
    loads = np.full(MOE_LOADS[0], MOE_LOADS[1])
    fp4 = (moe_forms.expert_time(loads, MOE_HIDDEN, MOE_INTER, "nvfp4", gpu)
           / moe_forms.expert_time(loads, MOE_HIDDEN, MOE_INTER, "fp8_block", gpu, ep=8)
           if "fp4" in gpu.peak_flops else math.nan)
    return {"allreduce_bus_GBps": 2 * (n - 1) / n * s / t_ar / 1e9,
            "gemm_bf16_peak_fraction": 2 * g**3 / t_gemm / gpu.peak("bf16"),
            "mla_decode_layer_us": float(moe_forms.mla_decode_time(
                gpu, 32, 1, 1025, "fp8", "fp8_block")) * 1e6,
            "deepep_ll_dispatch_launch_us": cal.alltoall_for("low_latency", "dispatch")
            .launch_s * 1e6,
            "nvfp4_over_fp8_experts": float(fp4)}
