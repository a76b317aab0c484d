"""Benchmark: 100,000 synthetic requests on 16 replicas (Llama-3.1-8B, TP1, 2 x DGX H100).

Poisson arrivals at 120 req/s, lognormal prompts (mean 1024) and outputs (mean 256).
Prints wall time, simulated time and simulated requests per wall-second.

Run: python benchmarks/bench_synthetic_100k.py [--requests N]
"""

from __future__ import annotations

import argparse
import time

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
    s = result.summary
    print(f"requests            {s['requests_total']:,} ({s['requests_completed']:,} completed)")
    print(f"replica steps       {s['steps_total']:,}")
    print(f"simulated time      {s['simulated_time_s']:,.1f} s")
    print(f"wall time           {wall:.2f} s")
    print(f"requests per wall-s {s['requests_total'] / wall:,.0f}")
    print(f"steps per wall-s    {s['steps_total'] / wall:,.0f}")
    print(f"TTFT p50/p99        {s['ttft_p50_s']:.3f} / {s['ttft_p99_s']:.3f} s")
    print(f"TPOT p50/p99        {s['tpot_p50_s']:.4f} / {s['tpot_p99_s']:.4f} s")


if __name__ == "__main__":
    main()
