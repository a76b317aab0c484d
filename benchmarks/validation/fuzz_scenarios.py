"""Fuzz the scenario reader and the run: N hostile or valid scenario dicts, one contract.

Each scenario (tests/scenario_fuzz.py draws them) must exit 0 with the run's invariants or
exit 2 with clean lines naming the file; a failure prints the scenario that broke it.

Run:
    python benchmarks/validation/fuzz_scenarios.py [--examples 500] [--seed 0]
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(HERE), str(HERE / "tests")]

from hypothesis import HealthCheck, given, settings  # noqa: E402
from scenario_fuzz import check, scenarios  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    outcomes: collections.Counter = collections.Counter()

    @settings(max_examples=args.examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(data=scenarios())
    def fuzz(data):
        with tempfile.TemporaryDirectory() as tmp:
            outcomes[check(data, Path(tmp))] += 1

    start = time.perf_counter()
    fuzz._hypothesis_internal_use_seed = args.seed
    fuzz()
    took = time.perf_counter() - start
    total = sum(outcomes.values())
    print(f"{total} scenarios in {took:.1f} s: " + ", ".join(
        f"{n} {what}" for what, n in sorted(outcomes.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
