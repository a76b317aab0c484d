"""Bias check of the per-engine kernel fits on the held-back half of AIConfigurator's tables.

    python benchmarks/kernel_bias.py [--data ../shared/calibration/aic] [--rows 4000]

Prints, per (GPU, engine, family), the rows checked, the median |error| % and the median
signed error % (bias) of the shipped fits on half 1 of each table (they were fitted on
half 0; simulator/calibration/aic.py), and how many rows the fit prices faster than their
roofline (must be 0). docs/cost-model.md ("Per-engine kernels") quotes these figures.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from simulator.calibration import aic, bias  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(aic.default_root()),
                    help="AIConfigurator database (default <repo>/../shared/calibration/aic)")
    ap.add_argument("--rows", type=int, default=aic.FIT_ROWS,
                    help="rows per family and kernel variant checked (seeded sample)")
    args = ap.parse_args()
    if not Path(args.data).is_dir():
        print(f"--data: {args.data!r} not found", file=sys.stderr)
        return 2
    print(f"{'gpu':<10}{'engine':<8}{'family':<24}{'rows':>7}{'median |err| %':>16}"
          f"{'bias %':>9}{'below roofline':>16}")
    for gpu, engine in bias.fitted_pairs():
        table = bias.held_out(gpu, engine, args.data, args.rows)
        for r in table.itertuples():
            print(f"{gpu:<10}{engine:<8}{r.family:<24}{r.rows:>7}"
                  f"{r.median_abs_error_pct:>16.1f}{r.bias_pct:>+9.1f}{r.below_floor:>16}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
