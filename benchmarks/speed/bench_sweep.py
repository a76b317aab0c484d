"""Target 4 of the speed issue: a 50-point sweep of the Vidur workload (target 1) on 2
workers, against 25 of those points run serially by one worker.

With no hidden serial bottleneck the ratio is close to 1 (each worker does 25 runs); the
target is under 2. Every point is a different seed of the same scenario.

Run: python benchmarks/speed/bench_sweep.py [--points 50] [--requests 50000]
"""

from __future__ import annotations

import argparse
import time

import simulator


def scenario(requests: int) -> dict:
    return {
        "name": "bench-sweep",
        "model": {"name": "llama-2-7b", "weight_dtype": "fp16", "kv_dtype": "fp16"},
        "cluster": {"topology": "dgx-a100"},
        "engine": {"max_num_seqs": 128, "max_num_batched_tokens": 4096},
        "workload": {"arrival": "poisson", "rate_per_s": 10.0, "num_requests": requests,
                     "prompt_tokens": 512, "output_tokens": 128},
        "output": {"steps": False},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", type=int, default=50)
    ap.add_argument("--requests", type=int, default=50_000)
    args = ap.parse_args()
    sc = scenario(args.requests)
    grid = {"engine.max_num_seqs": [128]}
    t0 = time.perf_counter()
    serial = simulator.sweep(sc, grid, seeds=args.points // 2, jobs=1)
    t_serial = time.perf_counter() - t0
    t0 = time.perf_counter()
    both = simulator.sweep(sc, grid, seeds=args.points, jobs=2)
    t_pool = time.perf_counter() - t0
    assert (serial["status"] == "ok").all() and (both["status"] == "ok").all()
    print(f"{args.points // 2} points, 1 worker      {t_serial:7.1f} s")
    print(f"{args.points} points, 2 workers     {t_pool:7.1f} s")
    print(f"ratio                     {t_pool / t_serial:7.2f}  (target < 2; 1.0 = no overhead)")


if __name__ == "__main__":
    main()
