"""The planner's speed targets, timed end to end (search, estimates and the simulated
proofs), 2 worker processes, the default search (colocated and disaggregated in one
ranking), with the simulations each plan spent:

1. DeepSeek-V3 (fp8) over up to 4 x 8 H200 (``hgx-h200``): every TP x PP x DP with EP and
   TP or DP attention, colocated, and every prefill + decode pool pair, in one ranking.
   Target: under 60 s on 2 cores.
2. Llama-3.1-70B (bf16) on one DGX H100 (8 GPUs), dense. Target: under 10 s.

Each case is a ``python -m simulator plan`` command, timed from start to exit; the machine
may be shared, so figures vary: quote them with the machine's load.

Run: python benchmarks/speed/bench_plan.py [--requests N] [--only deepseek|dense]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEEPSEEK = """
name = "bench-plan-deepseek-v3"
seed = 1
[model]
name = "deepseek-v3"
weight_dtype = "fp8"
[cluster]
topology = "hgx-h200"
nodes = {nodes}
[engine]
max_num_seqs = 256
max_num_batched_tokens = 8192
[workload]
arrival = "poisson"
rate_per_s = 8.0
num_requests = 300
prompt_tokens = {{ dist = "lognormal", mean = 1500, sigma = 0.5, max = 8000 }}
output_tokens = {{ dist = "lognormal", mean = 300, sigma = 0.5, max = 2000 }}
[slo]
ttft_s = 3.0
tpot_s = 0.1
"""

DENSE = """
name = "bench-plan-dense-70b"
seed = 1
[model]
name = "llama-3.1-70b"
[cluster]
topology = "dgx-h100"
nodes = 1
[workload]
arrival = "poisson"
rate_per_s = 4.0
num_requests = 300
prompt_tokens = { dist = "lognormal", mean = 1024, sigma = 0.5, max = 4096 }
output_tokens = { dist = "lognormal", mean = 256, sigma = 0.5, max = 1024 }
[slo]
ttft_s = 2.0
tpot_s = 0.1
"""


def timed(args: list[str]) -> tuple[float, str]:
    """Seconds the command took and its first lines of output."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "simulator", *args], capture_output=True,
                         text=True, check=False)
    wall = time.perf_counter() - t0
    text = (out.stdout + out.stderr).strip().splitlines()
    return wall, "\n".join(text[:12])


def simulations(text: str) -> str:
    """The simulations a plan spent, from its ``searched`` line."""
    m = re.search(r"feasible, (\d+) simulated", text)
    return m.group(1) if m else "?"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200, help="requests per simulation")
    ap.add_argument("--only", choices=("deepseek", "dense"))
    a = ap.parse_args()
    env_load = os.getloadavg()[0]
    print(f"machine: {os.cpu_count()} CPUs, load average {env_load:.1f} (shared: figures vary)")
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        common = ["--jobs", "2", "--requests", str(a.requests), "--no-plot"]
        if a.only in (None, "deepseek"):
            (d / "ds.toml").write_text(DEEPSEEK.format(nodes=4))
            total, text1 = timed(["plan", str(d / "ds.toml"), "--top", "4",
                                  "--out", str(d / "ds"), *common])
            print(text1)
            ok &= total < 60
            print(f"deepseek-v3 on up to 4 x hgx-h200, colocated and disaggregated: "
                  f"{total:.1f} s (target < 60 s): {'met' if total < 60 else 'MISSED'}, "
                  f"{simulations(text1)} simulations")
        if a.only in (None, "dense"):
            (d / "dense.toml").write_text(DENSE)
            w, text = timed(["plan", str(d / "dense.toml"), "--out", str(d / "dense"),
                             *common])
            print(text)
            ok &= w < 10
            print(f"llama-3.1-70b on 8 x H100, colocated and disaggregated: {w:.1f} s "
                  f"(target < 10 s): {'met' if w < 10 else 'MISSED'}, "
                  f"{simulations(text)} simulations")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
