"""Bias checks of the per-engine kernel fits: errors on the held-back half, roofline floors.

The shipped fits (:mod:`engines`) saw half 0 of every AIConfigurator table
(:func:`aic.halves`); :func:`held_out` prices half 1 with them and reports the median
absolute and signed error per (GPU, engine, family). :func:`floor_violations` counts rows
priced faster than their roofline: every row priced again with :func:`ideal`, the
calibration whose forms reduce to the roofline (efficiencies 1, no latencies, no tiles;
every collective algorithm available at zero launch cost and the full link bandwidth).
``benchmarks/kernel_bias.py`` prints both.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from simulator.calibration import aic, check, engines
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
