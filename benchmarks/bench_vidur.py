"""Target 1 of the speed issue: Vidur's published workload, end to end through the CLI.

Llama-2-7B fp16 on one A100 (dgx-a100 preset, TP1), Poisson 10 req/s, 50,000 requests,
512 prompt / 128 output tokens, vLLM scheduler, batch cap 128, 4,096 tokens per step.
Vidur needs 49.75 s for this on a 2-core machine; the target is under 5 s including
interpreter start-up and writing requests.csv, steps.csv and summary.json.

Warm cache, as Vidur was measured: the package's byte code is compiled first (a normal
install does it; an editable install under PYTHONDONTWRITEBYTECODE=1, as in this sandbox,
would otherwise recompile every module at each start, ~0.5 s).

Run: python benchmarks/bench_vidur.py [--repeat N] [--phases] [--profile none]

``--phases`` also times, in fresh processes (best of N), the CPU seconds of the imports,
``simulator.run`` with and without step records and ``write_result``: figures that a busy
shared box disturbs less than wall time (docs/performance.md, "Where the time goes").
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import simulator

#: The workload (benchmarks/vidur.toml, also a golden-output case).
SCENARIO = (Path(__file__).resolve().parent / "vidur.toml").read_text()


#: One fresh process: CPU seconds of the imports, run() keeping steps, write_result (both
#: threads), run() without steps.
PHASES = """
import sys, tempfile, time
t = time.process_time()
import simulator, simulator.cli
from simulator.io.writers import write_result
out = [time.process_time() - t]
s = simulator.load_scenario(sys.argv[1])
t = time.process_time(); res = simulator.run(s); out.append(time.process_time() - t)
t = time.process_time(); write_result(res, tempfile.mkdtemp() + "/o")
out.append(time.process_time() - t)
del res
t = time.process_time(); simulator.run(s, keep_steps=False); out.append(time.process_time() - t)
print(" ".join(f"{x:.3f}" for x in out))
"""


def phases(scenario: Path, repeat: int) -> None:
    """Best of ``repeat`` fresh processes for each phase (CPU seconds)."""
    rows = [[float(x) for x in subprocess.run(
        [sys.executable, "-c", PHASES, str(scenario)], check=True, capture_output=True,
        text=True).stdout.split()] for _ in range(repeat)]
    best = [min(col) for col in zip(*rows, strict=True)]
    print(f"CPU by phase (min of {repeat}): imports {best[0]:.2f} s, run() {best[1]:.2f} s, "
          f"write_result {best[2]:.2f} s; run(keep_steps=False) {best[3]:.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--phases", action="store_true", help="also time the phases in-process")
    ap.add_argument("--profile", help='[engine] profile of the scenario (e.g. "none"; '
                    "default: the simulator's default)")
    args = ap.parse_args()
    package = Path(simulator.__file__).parent
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(package)], check=True)
    with tempfile.TemporaryDirectory() as tmp:
        scenario = Path(tmp) / "vidur.toml"
        scenario.write_text(SCENARIO if args.profile is None else SCENARIO.replace(
            "[engine]\n", f'[engine]\nprofile = "{args.profile}"\n'))
        walls, cpus = [], []
        for _ in range(args.repeat):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "simulator", "run", str(scenario), "--out",
                            f"{tmp}/out", "--quiet"], check=True, stdout=subprocess.DEVNULL)
            walls.append(time.perf_counter() - t0)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            # CPU seconds (user + system, both threads): less sensitive than the wall time
            # to other work on a shared box.
            cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        if args.phases:
            phases(scenario, args.repeat)
        s = json.loads((Path(tmp) / "out" / "summary.json").read_text())
        steps_rows = sum(1 for _ in open(Path(tmp) / "out" / "steps.csv")) - 1
    best = min(walls)
    print(f"end-to-end wall (min of {args.repeat}) {best:.2f} s   (all: "
          + ", ".join(f"{w:.2f}" for w in walls) + ")")
    print(f"  of which simulation   {s['wall_time_s']:.2f} s (last run)")
    print(f"CPU time (min of {args.repeat})    {min(cpus):.2f} s   (all: "
          + ", ".join(f"{c:.2f}" for c in cpus) + ")")
    print(f"simulated time          {s['simulated_time_s']:.0f} s")
    print(f"requests                {s['requests_total']:,}")
    print(f"steps                   {s['steps_total']:,} ({steps_rows:,} rows in steps.csv)")
    print(f"simpy events            {s['simpy_events']:,}")
    print(f"steps per wall-s        {s['steps_total'] / s['wall_time_s']:,.0f}")
    print(f"events per wall-s       {s['simpy_events'] / s['wall_time_s']:,.0f}")
    print(f"vs Vidur (49.75 s)      {49.75 / best:.1f}x faster")


if __name__ == "__main__":
    main()
