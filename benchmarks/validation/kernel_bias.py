"""Bias check of the per-engine kernel fits on the held-back half of AIConfigurator's tables.

    python benchmarks/validation/kernel_bias.py [--data ../shared/calibration/aic] [--rows 4000]

Prints, per (GPU, engine, family), the rows checked, the median |error| % and the median
signed error % (bias) of the shipped fits on half 1 of each table (they were fitted on
half 0; simulator/calibration/aic.py), and how many rows the fit prices faster than their
roofline (must be 0); then what each calibration says about a few shapes
(``bias.figures``), beside the calibration a GPU had before per-engine fits (profile
none). docs/cost-model.md ("Per-engine kernels") quotes these figures.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from simulator.calibration import aic, bias, engines  # noqa: E402
from simulator.hardware.specs import load_gpu  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(aic.default_root()),
                    help="AIConfigurator database (default <repo>/../shared/calibration/aic)")
    ap.add_argument("--rows", type=int, default=aic.FIT_ROWS,
                    help="rows per family and kernel variant checked (seeded sample)")
    ap.add_argument("--figures-only", action="store_true",
                    help="only the figures table (no held-back half; seconds)")
    args = ap.parse_args()
    if not Path(args.data).is_dir():
        print(f"--data: {args.data!r} not found", file=sys.stderr)
        return 2
    if not args.figures_only:
        held_out_table(args)
    print(f"\n{'gpu':<10}{'profile':<9}{'all-reduce bus GB/s':>20}{'GEMM bf16 / peak':>17}"
          f"{'MLA decode us':>14}{'DeepEP LL us':>13}{'NVFP4 / FP8 MoE':>16}")
    for gpu, profile in bias.FIGURE_ROWS:
        f = bias.figures(engines.engine_gpu(load_gpu(gpu), profile))
        print(f"{gpu:<10}{profile:<9}{f['allreduce_bus_GBps']:>20.0f}"
              f"{f['gemm_bf16_peak_fraction']:>17.2f}{f['mla_decode_layer_us']:>14.1f}"
              f"{f['deepep_ll_dispatch_launch_us']:>13.1f}{f['nvfp4_over_fp8_experts']:>16.2f}")
    return 0


def held_out_table(args) -> None:
    print(f"{'gpu':<10}{'engine':<8}{'family':<24}{'rows':>7}{'median |err| %':>16}"
          f"{'bias %':>9}{'below roofline':>16}")
    for gpu, engine in bias.fitted_pairs():
        table = bias.held_out(gpu, engine, args.data, args.rows)
        for r in table.itertuples():
            print(f"{gpu:<10}{engine:<8}{r.family:<24}{r.rows:>7}"
                  f"{r.median_abs_error_pct:>16.1f}{r.bias_pct:>+9.1f}{r.below_floor:>16}")


if __name__ == "__main__":
    sys.exit(main())
