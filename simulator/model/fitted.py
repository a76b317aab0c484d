"""Fitted kernel forms of the attention kinds measured as whole calls: Gated DeltaNet
layers and DeepSeek sparse attention modules.

One form, :func:`fitted_time`: ``floor + max(F / (e_f P), B / (e_b BW))`` over the FLOPs
and bytes of :mod:`simulator.model.linear_attention` / :mod:`simulator.model.sparse_attention`,
with ``P`` the GPU's 16-bit tensor peak and ``BW`` its HBM bandwidth. The parameters below
come from ``python benchmarks/docs/fit_linear_attention.py``
(:mod:`simulator.calibration.attention_kinds`: robust least squares on log time over the
even rows, checked on the odd rows) and carry to other GPUs of a measured generation
(H200 from H100, B300 from B200) with their own peak and bandwidth.
"""

from __future__ import annotations

import numpy as np

from simulator.hardware.specs import GPUSpec

#: Fitted (floor_s, eff_flops, eff_bw) per GPU generation and phase, from
#: ``benchmarks/docs/fit_linear_attention.py`` on AIConfigurator's vLLM 0.24.0 ``gdn_perf``
#: tables (NVIDIA AIConfigurator, Apache-2.0; h100_sxm for hopper, b200_sxm for
#: blackwell), fitted on the even rows of each table and checked on the odd ones (median
#: absolute error 6.4% / 10.6% on hopper decode / prefill, 5.5% / 16.0% on blackwell).
#: Every measured prefill is bound by its bytes under the form, so the tables do not
#: identify the prefill eff_flops: 0.3 is the fit's starting value, left where it was.
GDN_FIT = {
    "hopper": {"decode": (5.34e-06, 0.282, 0.935), "prefill": (1.34e-05, 0.3, 0.575)},
    "blackwell": {"decode": (5.75e-06, 0.836, 0.813), "prefill": (2.3e-05, 0.3, 0.262)},
}

#: Fitted (floor_s, eff_flops, eff_bw) per GPU generation and phase, from
#: ``benchmarks/docs/fit_linear_attention.py`` on AIConfigurator's vLLM 0.24.0
#: ``dsa_{context,generation}_module_perf`` tables (DeepSeek-V3.2 and GLM-5 rows; NVIDIA
#: AIConfigurator, Apache-2.0; h100_sxm: hopper, b200_sxm: blackwell), fitted on the even
#: rows, checked on the odd ones (median absolute error 10.2% decode / 17.7% prefill on
#: hopper, 11.6% / 21.8% on blackwell). The prefill floor is the module's measured
#: one-token time (about a millisecond per layer).
DSA_FIT = {
    "hopper": {"decode": (1.8e-04, 0.264, 0.693), "prefill": (1.42e-03, 0.525, 0.921)},
    "blackwell": {"decode": (1.68e-04, 0.255, 0.634), "prefill": (1.64e-03, 0.487, 0.588)},
}


def fit_for(table: dict, gpu: GPUSpec, what: str) -> dict[str, tuple[float, float, float]]:
    """The parameters in ``table`` (:data:`GDN_FIT`, :data:`DSA_FIT`) of ``gpu``'s
    generation, or a ValueError naming the GPU and ``what`` lacks them."""
    fit = table.get(gpu.generation)
    if fit is None:
        raise ValueError(f"no {what} calibration for {gpu.name} (generation "
                         f"{gpu.generation or 'unset'!r}; measured: {', '.join(table)})")
    return fit


def fitted_time(fit: tuple[float, float, float], flops, nbytes, peak: float,
                bandwidth: float):
    """Seconds of one call: ``floor + max(F / (e_f P), B / (e_b BW))`` (arrays allowed).

    Never below the roofline ``max(F / P, B / BW)``: both efficiencies are <= 1.
    """
    floor, eff_f, eff_b = fit
    return floor + np.maximum(flops / (eff_f * peak), nbytes / (eff_b * bandwidth))
