"""What differs between GPU generations, and how a calibration carries from one to another.

A GPU file names its generation (``generation = "hopper"``) and its SM boost clock
(``boost_clock_hz``). :data:`GENERATIONS` holds the public facts of each generation that the
cost model's parameters depend on: the attention kernel the engines run on it, the
tensor-core instruction, L2, NVLink and NVSwitch generation (and so whether NCCL's NVLS
in-switch reduction exists), and the HBM generation. They are data for docs and checks;
the transfer rule that changes numbers is :func:`transfer`.

Transfer rule (docs/cost-model.md, "Other GPUs"): efficiencies and latencies carry over;
SM-second costs (``*_sm_s``: work of one SM per unit) are per SM *cycle* costs of the same
kernel design, so they scale with the clock: ``x_target = x_ref * f_ref / f_target`` (the
division by the SM count happens where they are used). Without a clock on either file
nothing scales (the previous behaviour).
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass, replace

from simulator.calibration.params import Calibration

#: Public facts per generation (whitepapers, datasheets, the engines' backend selection).
GENERATIONS: dict[str, dict[str, object]] = {
    "ampere": {  # A100 (sm_80)
        "attention_kernel": "FlashAttention 2 (vLLM's default backend on sm_80)",
        "tensor_core": "mma.sync, warp-level; cp.async (no TMA)",
        "nvlink": 3, "nvswitch": 2, "nvls": False, "hbm": "HBM2e", "sfu_exp": 16},
    "ada": {  # L40S (sm_89)
        "attention_kernel": "FlashAttention 2",
        "tensor_core": "mma.sync, warp-level (FP8)", "nvlink": None, "nvswitch": None,
        "nvls": False, "hbm": "GDDR6", "sfu_exp": 16},
    "hopper": {  # H100, H200 (sm_90)
        "attention_kernel": "FlashAttention 3 (wgmma, TMA, warp specialization)",
        "tensor_core": "wgmma, warpgroup-level, 64 x N x 16", "nvlink": 4, "nvswitch": 3,
        "nvls": True, "hbm": "HBM3 (H100), HBM3e (H200)", "sfu_exp": 16},
    "blackwell": {  # B200, GB200 (sm_100)
        "attention_kernel": "FlashInfer / TRT-LLM Blackwell kernels (tcgen05), cuDNN",
        "tensor_core": "tcgen05 UMMA, tensor memory, 2-CTA 256 x N", "nvlink": 5,
        "nvswitch": 4, "nvls": True, "hbm": "HBM3e", "sfu_exp": 16},
    # B300, GB300 (sm_103): Blackwell's SM with twice the SFU exponential rate for
    # attention softmax, 1.5x dense FP4, INT8 and FP64 cut (NVIDIA, "Inside NVIDIA
    # Blackwell Ultra", 2025); same NVLink 5 and NVSwitch.
    "blackwell_ultra": {
        "attention_kernel": "FlashInfer / TRT-LLM Blackwell kernels (tcgen05), cuDNN",
        "tensor_core": "tcgen05 UMMA (sm_103), 2x SFU exp, NVFP4 1.5x sm_100",
        "nvlink": 5, "nvswitch": 4, "nvls": True, "hbm": "HBM3e 12-high", "sfu_exp": 32},
    # AMD Instinct: GPUs of a node joined point to point by Infinity Fabric (xGMI) links,
    # no switch, so no in-switch reduction; "the collective routines are implemented using
    # Ring and Tree algorithms" over xGMI inside a node (RCCL documentation,
    # rocm.docs.amd.com/projects/rccl, "What is RCCL?"). FP8 formats differ:
    # CDNA3 computes the FNUZ variants (e4m3fnuz, e5m2fnuz), CDNA4 the OCP ones (e4m3fn,
    # e5m2) and OCP MX FP6 / FP4 (AMD CDNA 3 and CDNA 4 architecture white papers).
    "cdna3": {  # MI300X, MI325X (gfx942)
        "attention_kernel": "CK / AITER FlashAttention (ROCm), Triton",
        "tensor_core": "MFMA matrix cores, FP8 FNUZ (e4m3fnuz, e5m2fnuz)",
        "nvlink": None, "nvswitch": None, "nvls": False, "xgmi": "Infinity Fabric 4",
        "hbm": "HBM3 (MI300X), HBM3E (MI325X)"},
    "cdna4": {  # MI350X, MI355X (gfx950)
        "attention_kernel": "AITER / CK FlashAttention (ROCm), Triton",
        "tensor_core": "MFMA matrix cores, OCP FP8 (e4m3fn, e5m2), MXFP6, MXFP4",
        "nvlink": None, "nvswitch": None, "nvls": False, "xgmi": "Infinity Fabric 4",
        "hbm": "HBM3E"},
}

# "sfu_exp": MUFU.EX2 results per SM per clock, the softmax exponential of attention (CUDA
# C++ Programming Guide, arithmetic instruction throughput: 16 for compute capability 8.x,
# 9.0 and 10.0); Blackwell Ultra doubles it (NVIDIA, "Inside NVIDIA Blackwell Ultra", 2025:
# 10.7 against B200's 5 tera-exponentials/s). Not published per CU for CDNA: left out, so
# the exponential cost carries unscaled there.

#: The generation whose kernels a generation without a fit borrows: the nearest one in
#: kernel design (tensor-core width per cycle, attention kernel family). Followed until a
#: generation in :data:`FITTED`. CDNA3 (MFMA, 2,048 BF16 FLOP per CU per cycle, FA-style
#: attention) sits nearest Hopper; CDNA4 (4,096, FP4/FP6) nearest Blackwell.
NEAREST: dict[str, str] = {"ampere": "hopper", "ada": "hopper", "blackwell": "hopper",
                           "blackwell_ultra": "blackwell", "cdna3": "hopper",
                           "cdna4": "blackwell"}
#: Generations with a measured (fitted) calibration, and the GPU file that holds it.
FITTED: dict[str, str] = {"hopper": "h100_sxm"}


def transfer_chain(generation: str) -> list[str]:
    """``generation`` and the generations :data:`NEAREST` leads it through, ending at a
    fitted one (an unnamed generation: Hopper)."""
    chain = [generation or "hopper"]
    while chain[-1] not in FITTED:
        chain.append(NEAREST.get(chain[-1], "hopper"))
    return chain


def fitted_reference(generation: str) -> str:
    """The GPU whose fitted calibration a GPU of ``generation`` inherits: the fitted
    generation at the end of :func:`transfer_chain`."""
    return FITTED[transfer_chain(generation)[-1]]


def _scale_sm(p: object, factor: float, exp_factor: float = 1.0) -> object:
    """``p`` (a parameter dataclass) with every ``*_sm_s`` field multiplied by ``factor``,
    the softmax exponential's (``exp_sm_s``) by ``exp_factor`` too."""
    changes = {f.name: getattr(p, f.name) * factor * (exp_factor if f.name == "exp_sm_s"
                                                      else 1.0)
               for f in fields(p) if f.name.endswith("_sm_s")}
    return replace(p, **changes) if changes else p


def exp_factor(ref_generation: str, generation: str) -> float:
    """How a per-SM softmax exponential cost scales from ``ref_generation`` to
    ``generation``: the ratio of their SFU exponential rates per SM per clock (1 where
    either is unknown)."""
    ref = GENERATIONS.get(ref_generation, {}).get("sfu_exp")
    mine = GENERATIONS.get(generation, {}).get("sfu_exp")
    return ref / mine if ref and mine else 1.0


def transfer(cal: Calibration, ref_clock_hz: float | None, clock_hz: float | None,
             note: str = "", exp: float = 1.0) -> Calibration:
    """A reference GPU's calibration carried to a GPU with SM clock ``clock_hz``.

    Parameters
    ----------
    cal : Calibration
        The reference GPU's fitted parameters.
    ref_clock_hz, clock_hz : float or None
        SM boost clocks (Hz) of the reference and the target; None on either: unchanged.
    exp : float
        Extra factor on the softmax exponential's SM-second cost (:func:`exp_factor`).

    Notes
    -----
    An SM does a fixed number of operations per cycle for a kernel of a given design, so a
    per-SM cost in seconds scales as ``1 / clock``. Efficiencies (fractions of the target's
    own peak and bandwidth, which already include its clock) and latencies (driver, DRAM
    round trips) carry over unchanged.
    """
    clocked = bool(ref_clock_hz and clock_hz and ref_clock_hz != clock_hz)
    if not clocked and exp == 1.0:
        return cal
    factor = ref_clock_hz / clock_hz if clocked else 1.0
    out = {}
    for f in fields(cal):
        v = getattr(cal, f.name)
        if isinstance(v, dict):
            out[f.name] = {k: _scale_sm(p, factor, exp) for k, p in v.items()}
        elif is_dataclass(v):
            out[f.name] = _scale_sm(v, factor, exp)
    how = (f"; SM-second costs x {factor:.3f} (clock {ref_clock_hz / 1e9:.2f} -> "
           f"{clock_hz / 1e9:.2f} GHz)" if clocked else "")
    how += f"; softmax exponentials x {exp:.3f} (SFU rate per SM)" if exp != 1.0 else ""
    return replace(cal, **out, source=f"{cal.source}{how}{note}")
