"""Which kernel calibration an engine profile runs on a GPU.

vLLM, SGLang and TensorRT-LLM run different GEMM, attention, MLA and MoE kernels and
different all-reduces, so each (GPU, engine) has its own fit. The fits shipped in
``simulator/calibration/data/fits/<gpu>_<engine>.toml`` were made by ``python -m simulator
calibrate fit --gpu <gpu> --engine <engine> --data ../shared/calibration/aic`` from NVIDIA
AIConfigurator's measured tables (Apache-2.0; attribution in that folder's README). The
H100 SXM vLLM fit is the GPU file's own ``[calibration]`` (``topologies/gpus/h100_sxm.toml``,
fitted on the same vLLM 0.24.0 tables).

A GPU or engine without a fit falls back by documented physics (docs/cost-model.md, "Per-
engine kernels"): the GPU file's own ``[calibration]`` where it has one (a user's fit,
which also wins over a shipped fit of a preset of the same name),
else the same engine's fit of the nearest fitted GPU along the generations' chain
(``generations.NEAREST``: Hopper's from H100 SXM, Blackwell's from B200), carried by
:func:`~simulator.calibration.generations.transfer` (efficiencies and latencies
unchanged, SM-second costs scaled by the clocks; peaks, bandwidths and SM count are the
GPU's own). The calibration's ``source`` says which happened; ``validate`` and ``run``
print it.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

from simulator.calibration.generations import NEAREST, exp_factor, transfer
from simulator.calibration.params import Calibration, from_toml
from simulator.errors import ScenarioError
from simulator.hardware.specs import GPUSpec, load_gpu

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

FITS = Path(__file__).resolve().parent / "data" / "fits"
#: Engine profile -> the engine whose kernels it runs (``none``: no engine, the GPU file's
#: calibration as before profiles existed).
ENGINE_OF_PROFILE = {"vllm-v1": "vllm", "vllm-v0.6": "vllm", "sglang": "sglang",
                     "trtllm": "trtllm"}
#: An engine's profile for commands that name the engine (``calibrate --engine``).
PROFILE_OF_ENGINE = {"vllm": "vllm-v1", "sglang": "sglang", "trtllm": "trtllm"}
#: Sections an engine's tables do not measure, taken from the same GPU's fit of the engine
#: whose kernels it runs there: SGLang's MLA backend on Blackwell is TensorRT-LLM's kernel
#: (its tables name it ``trtllm_mla``) and it has no module table; DeepEP is one library
#: under every engine and only SGLang's tables time it.
BORROW = {"sglang": {"mla_prefill": "trtllm", "mla_decode": "trtllm"},
          "vllm": {"alltoall": "sglang"}, "trtllm": {"alltoall": "sglang"}}
#: GPU files whose own ``[calibration]`` is their fit for one engine.
OWN_FIT = {"h100_sxm": "vllm"}
#: Generations with engine fits, and the GPU preset that holds them. A GPU of another
#: generation follows ``generations.NEAREST`` to the first of these.
ENGINE_FITTED = {"hopper": "h100_sxm", "blackwell": "b200"}
CARRIED = "carried over from"
#: The calibration's per-dtype sections (attribute names of :class:`Calibration`).
SECTIONS_BY_DTYPE = ("gemm", "prefill", "decode", "moe", "mla_prefill", "mla_decode",
                     "alltoall")


def shipped(gpu_name: str, engine: str) -> Calibration | None:
    """The shipped fit of one (GPU preset, engine), or None."""
    return _read_fit(FITS / f"{gpu_name}_{engine}.toml")


@lru_cache(maxsize=32)
def _read_fit(path: Path) -> Calibration | None:
    if not path.exists():
        return None
    with path.open("rb") as fh:
        raw = tomllib.load(fh)
    return from_toml(raw["calibration"], f"{path.name}: calibration")


def fitted(gpu: GPUSpec, engine: str) -> Calibration | None:
    """The fit of ``gpu`` (by preset name) under ``engine``, shipped or its file's own."""
    cal = shipped(gpu.name, engine)
    if cal is None and OWN_FIT.get(gpu.name) == engine:
        cal = gpu.calibration
    return cal


def own_calibration(gpu: GPUSpec) -> bool:
    """Whether the GPU's file carries its own ``[calibration]`` (not one carried over)."""
    return not gpu.calibration.source.startswith(CARRIED)


#: ``(id(gpu), engine) -> (gpu, engine's gpu)``: one selected spec per loaded GPU spec,
#: so every build of a scenario sees the same object (the cost models memoize on it).
#: The entry holds the GPU itself, so its id is not reused while the entry lives.
_SELECTED: dict[tuple[int, str], tuple[GPUSpec, GPUSpec]] = {}


def engine_gpu(gpu: GPUSpec, profile: str | None) -> GPUSpec:
    """``gpu`` with the kernel calibration the profile's engine runs on it.

    ``profile`` None or ``"none"``: unchanged. Otherwise the (GPU, engine) fit; else the
    GPU file's own calibration; else the nearest fitted GPU's fit for the engine carried
    by datasheet transfer (its ``source`` says so).
    """
    engine = ENGINE_OF_PROFILE.get(profile or "none")
    if engine is None:
        return gpu
    hit = _SELECTED.get((id(gpu), engine))
    if hit is None and any(out is gpu and src is not gpu for src, out in _SELECTED.values()):
        return gpu  # already a selection (describe() of a built plan's GPU)
    if hit is None or hit[0] is not gpu:
        if len(_SELECTED) >= 256:
            _SELECTED.clear()
        hit = _SELECTED[(id(gpu), engine)] = (gpu, _select(gpu, engine))
    return hit[1]


def _user_calibrated(gpu: GPUSpec) -> bool:
    """Whether ``gpu`` carries a calibration of its own that is not its preset's (a user's
    fit in a GPU file of the same name): that one wins over every shipped fit."""
    if not own_calibration(gpu):
        return False
    try:
        return load_gpu(gpu.name).calibration != gpu.calibration
    except ScenarioError:  # no preset of that name
        return True


def _select(gpu: GPUSpec, engine: str) -> GPUSpec:
    """:func:`engine_gpu` itself."""
    cal = None if _user_calibrated(gpu) else fitted(gpu, engine)
    if cal is gpu.calibration:
        return gpu
    if cal is not None:
        return replace(gpu, calibration=_complete(cal, gpu, engine))
    if own_calibration(gpu):
        return replace(gpu, calibration=replace(
            gpu.calibration, source=f"no {engine} fit of {gpu.name}: the GPU file's own "
                                    f"calibration; {gpu.calibration.source}"))
    cal = _carried(gpu, engine)
    return gpu if cal is None else replace(gpu, calibration=cal)


def reference(generation: str) -> tuple[str, str]:
    """``(fitted generation, its GPU preset)`` whose engine fits a GPU of ``generation``
    without its own carries: the first of :data:`ENGINE_FITTED` along
    ``generations.NEAREST`` (Hopper for an unnamed or unknown generation)."""
    gen, seen = generation or "hopper", set()
    while gen not in ENGINE_FITTED and gen not in seen:
        seen.add(gen)
        gen = NEAREST.get(gen, "hopper")
    gen = gen if gen in ENGINE_FITTED else "hopper"
    return gen, ENGINE_FITTED[gen]


def _carried(gpu: GPUSpec, engine: str) -> Calibration | None:
    """The nearest fitted GPU's fit for ``engine`` carried to ``gpu`` by transfer; None
    where that is what the GPU file already carries (the H100 vLLM fit)."""
    ref_gen, ref_name = reference(gpu.generation)
    if ref_name == "h100_sxm" and OWN_FIT.get(ref_name) == engine:
        return None
    ref = load_gpu(ref_name)
    ref_cal = ref.calibration
    if ref_name != gpu.name:
        ref_cal = engine_gpu(ref, PROFILE_OF_ENGINE[engine]).calibration
    cal = transfer(ref_cal, ref.boost_clock_hz, gpu.boost_clock_hz,
                   exp=exp_factor(ref_gen, gpu.generation))
    note = (f"no {engine} fit of {gpu.name}: {CARRIED} {ref_name} x {engine} by datasheet "
            f"transfer ({gpu.name}'s own peaks, bandwidth, SMs and links)")
    return replace(cal, source=f"{note}; {cal.source}")


def _complete(cal: Calibration, gpu: GPUSpec, engine: str) -> Calibration:
    """A shipped fit with the sections its engine's tables did not measure filled in: from
    the same GPU's fit of the engine that runs the same kernels there (:data:`BORROW`),
    else from the GPU's calibration without an engine fit (the nearest generation's, by
    transfer). The source names each borrowed section."""
    notes = []
    for section in SECTIONS_BY_DTYPE:
        if getattr(cal, section):
            continue
        donor_engine = BORROW.get(engine, {}).get(section)
        donor = shipped(gpu.name, donor_engine) if donor_engine else None
        if donor is not None and getattr(donor, section):
            cal = replace(cal, **{section: getattr(donor, section)})
            notes.append(f"{section} from {gpu.name} x {donor_engine}")
        else:
            cal = replace(cal, **{section: getattr(gpu.calibration, section)})
            notes.append(f"{section} from {gpu.name}'s file calibration")
    return replace(cal, source=cal.source + "".join(f"; {n}" for n in notes))


def describe(gpu: GPUSpec, profile: str | None) -> str:
    """One line for ``validate`` and ``run``: which kernel calibration the profile's engine
    runs on ``gpu`` (a spec :func:`engine_gpu` selected, or a plain one)."""
    engine = ENGINE_OF_PROFILE.get(profile or "none")
    src = engine_gpu(gpu, profile).calibration.source or "uncalibrated (rooflines)"
    who = f"{gpu.name} x {engine}" if engine else f"{gpu.name}, profile none"
    return f"{who}: {src.split(';')[0]}"
