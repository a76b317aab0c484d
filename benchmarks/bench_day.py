"""Benchmark: a 24-hour synthetic day (workloads/day-70b-diurnal.toml: 2 to 18 req/s, a
mean of 10, about 864,000 requests) on Llama-3.1-70B TP4 over 16 x DGX H100, autoscaled
between 2 and 32 replicas by the load policy. Prints wall time, peak memory, events per
simulated hour and what the day cost.

Run: PYTHONPATH=. python benchmarks/bench_day.py [--hours H] [--policy load|sla|none]
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

import simulator  # run from the checkout: PYTHONPATH=. python benchmarks/bench_day.py

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hours", type=float, default=24.0, help="simulated hours (default 24)")
    ap.add_argument("--policy", default="load", choices=("none", "load", "sla"))
    args = ap.parse_args()
    sets = [f"workload.duration_s={args.hours * 3600}", "cluster.nodes=16",
            "parallel.dp=32", "output.steps=false", f"autoscale.policy={args.policy}",
            "autoscale.min_replicas=2", "autoscale.max_replicas=32",
            "autoscale.interval_s=60", "autoscale.target=16"]  # sla: the cost model's capacity
    s = simulator.load_scenario(ROOT / "workloads" / "day-70b-diurnal.toml", overrides=sets)
    t0 = time.perf_counter()
    r = simulator.run(s, progress=True)
    wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    sm = r.summary
    hours = sm["simulated_time_s"] / 3600
    print(f"{len(r.requests):,} requests over {hours:.1f} simulated hours, policy {args.policy}")
    print(f"  wall {wall:.1f} s, peak RSS {rss:.2f} GiB, "
          f"{sm['simpy_events'] / hours:,.0f} events per simulated hour")
    print(f"  replicas mean {sm['autoscale_replicas_mean']:.1f} (min "
          f"{sm['autoscale_replicas_min']}, max {sm['autoscale_replicas_max']}), "
          f"{sm['autoscale_scale_ups']} scale-ups, GPU-hours {sm['autoscale_gpu_hours']:.0f}, "
          f"cost ${sm['autoscale_cost_usd']:,.0f}")
    print(f"  TTFT p99 {sm['ttft_p99_s']:.2f} s, TPOT p99 {sm['tpot_p99_s'] * 1e3:.1f} ms, "
          f"SLO attainment {sm['slo_attainment']:.3f}")


if __name__ == "__main__":
    main()
