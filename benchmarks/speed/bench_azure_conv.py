"""Benchmark: the full one-hour Azure conversation trace on Llama-3.1-70B, 2 x DGX H100,
TP4 x DP4 (19,366 requests). Prints wall time, simulated time and rates.

Run: python benchmarks/speed/bench_azure_conv.py [--steps] [--profile]
"""

from __future__ import annotations

import argparse
import time

from report import print_run

import simulator

SCENARIO = {
    "name": "bench-azure-conv",
    "seed": 0,
    "model": {"name": "llama-3.1-70b"},
    "cluster": {"topology": "dgx-h100", "nodes": 2},
    "parallel": {"tp": 4, "pp": 1, "dp": 4},
    "router": {"policy": "least_outstanding"},
    "workload": {"arrival": "trace", "trace": "workloads/azure_llm_2023_conv.csv"},
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", action="store_true", help="print a cProfile of the run")
    ap.add_argument("--steps", action="store_true",
                    help="keep per-step records (off, as in workloads/azure-conv-70b.toml)")
    args = ap.parse_args()
    scenario = {**SCENARIO, "output": {"steps": args.steps}}
    t0 = time.perf_counter()
    if args.profile:
        import cProfile
        import pstats

        with cProfile.Profile() as prof:
            result = simulator.run(scenario)
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    else:
        result = simulator.run(scenario)
    wall = time.perf_counter() - t0
    print_run(result.summary, wall)

if __name__ == "__main__":
    main()
