"""Target 3 of the speed issue: 1,000,000 requests on 128 replicas (1,024 GPUs).

Llama-3.1-70B, TP8 per replica, 128 x DGX H100, least-outstanding routing, Poisson arrivals
at 1.5 req/s per replica, lognormal prompts (mean 1,024) and outputs (mean 256). Per-step
records are off (steps.csv would hold tens of millions of rows); request records are packed
into columnar chunks as they complete. Prints wall time, simulated time, rates and the
peak resident memory.

Run: python benchmarks/speed/bench_million.py [--requests N]
"""

from __future__ import annotations

import argparse
import resource
import time

from report import print_run

import simulator


def scenario(n: int, replicas: int = 128) -> dict:
    return {
        "name": "bench-million",
        "seed": 0,
        "model": {"name": "llama-3.1-70b"},
        "cluster": {"topology": "dgx-h100", "nodes": replicas},
        "parallel": {"tp": 8, "pp": 1, "dp": replicas},
        "router": {"policy": "least_outstanding"},
        "workload": {"arrival": "poisson", "rate_per_s": 1.5 * replicas, "num_requests": n,
                     "prompt_tokens": {"dist": "lognormal", "mean": 1024, "sigma": 0.8,
                                       "max": 16384},
                     "output_tokens": {"dist": "lognormal", "mean": 256, "sigma": 0.8,
                                       "max": 4096}},
        "output": {"steps": False},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--replicas", type=int, default=128)
    args = ap.parse_args()
    t0 = time.perf_counter()
    result = simulator.run(scenario(args.requests, args.replicas), progress=True)
    wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print_run(result.summary, wall, {"replicas / GPUs": f"{args.replicas} / "
                                                      f"{result.summary['gpus']}",
                                     "peak RSS": f"{rss:,.0f} MiB"})

if __name__ == "__main__":
    main()
