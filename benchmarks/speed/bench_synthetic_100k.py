"""Benchmark: 100,000 synthetic requests on 16 replicas (Llama-3.1-8B, TP1, 2 x DGX H100).

Poisson arrivals at 120 req/s, lognormal prompts (mean 1024) and outputs (mean 256).
Prints wall time, simulated time and simulated requests per wall-second.

Run: python benchmarks/speed/bench_synthetic_100k.py [--requests N]
"""

from __future__ import annotations

import argparse
import time

from report import print_run

import simulator


def scenario(n: int) -> dict:
    return {
        "name": "bench-synthetic",
        "seed": 0,
        "model": {"name": "llama-3.1-8b"},
        "cluster": {"topology": "dgx-h100", "nodes": 2},
        "parallel": {"tp": 1, "pp": 1, "dp": 16},
        "router": {"policy": "least_outstanding"},
        "workload": {"arrival": "poisson", "rate_per_s": 120.0, "num_requests": n,
                     "prompt_tokens": {"dist": "lognormal", "mean": 1024, "sigma": 0.8,
                                       "max": 16384},
                     "output_tokens": {"dist": "lognormal", "mean": 256, "sigma": 0.8,
                                       "max": 4096}},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=100_000)
    args = ap.parse_args()
    t0 = time.perf_counter()
    result = simulator.run(scenario(args.requests))
    wall = time.perf_counter() - t0
    print_run(result.summary, wall)

if __name__ == "__main__":
    main()
