"""Fit the Gated DeltaNet and DSA kernel forms to AIConfigurator's measured tables.

    python benchmarks/docs/fit_linear_attention.py [AIC_DIR]

AIC_DIR defaults to ``<repo>/../shared/calibration/aic`` (NVIDIA AIConfigurator's kernel
database, Apache-2.0). For each GPU (h100_sxm: hopper, b200_sxm: blackwell) and phase it
fits :func:`simulator.calibration.attention_kinds.fit_form` on the even rows and prints the
parameters (as shipped in ``GDN_FIT`` / ``DSA_FIT``) with the held-back (odd rows) median
and p90 absolute relative errors, and those of the shipped parameters.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from simulator.calibration import attention_kinds as ak  # noqa: E402
from simulator.hardware.specs import load_gpu  # noqa: E402
from simulator.model.fitted import DSA_FIT, GDN_FIT  # noqa: E402


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parents[2]
    aic = Path(argv[0]) if argv else root.parent / "shared" / "calibration" / "aic"
    for system, (preset, gen) in ak.SYSTEMS.items():
        gpu = load_gpu(preset)
        peak, bw = gpu.peak("bf16"), gpu.hbm_bandwidth_Bps
        for family, table, shipped in (("gdn", ak.gdn_table, GDN_FIT),
                                       ("dsa", ak.dsa_table, DSA_FIT)):
            for phase in ("decode", "prefill"):
                f, b, t = table(aic, system, phase)
                p = ak.fit_form(f, b, t, peak, bw)
                err = ak.held_back_error(p, f, b, t, peak, bw)
                ship = ak.held_back_error(shipped[gen][phase], f, b, t, peak, bw)
                print(f"{gen} {family} {phase}: fitted ({p[0]:.3g}, {p[1]:.3g}, {p[2]:.3g}); "
                      f"held-back {err.size} rows: median |err| {np.median(err):.1%}, p90 "
                      f"{np.quantile(err, 0.9):.1%}; shipped: median {np.median(ship):.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
