"""Check that a speed change leaves every output file byte-identical between two checkouts.

Runs a fixed set of cases through the CLI of one source tree and writes their outputs under
one folder; a second call compares two such folders file by file: the CSVs, scenario.toml,
the decompressed trace.json.gz and summary.json less ``wall_time_s`` and ``simpy_events``.
The cases cover the Vidur workload, the default scenario (pp 2), a capped Azure trace, a
faulted run and a prefix-caching run, each with ``[engine] profile`` unset and "vllm-v1",
with ``fast_forward`` on and off.

Run:
    python benchmarks/identical_outputs.py run SRC OUT [--only NAME]   # SRC: a checkout
    python benchmarks/identical_outputs.py compare OUT_A OUT_B
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

# The Vidur workload that benchmarks/bench_vidur.py runs.
VIDUR = (HERE / "benchmarks" / "vidur.toml").read_text()

FAULTED = """
name = "faulted"
seed = 3
[model]
name = "llama-3.1-8b"
[cluster]
topology = "dgx-h100"
[parallel]
tp = 2
dp = 4
[workload]
arrival = "poisson"
rate_per_s = 20.0
num_requests = 3000
prompt_tokens = { dist = "lognormal", mean = 800, sigma = 0.6, max = 8192 }
output_tokens = { dist = "lognormal", mean = 200, sigma = 0.5, max = 2048 }
[[faults]]
at_s = 30.0
target = "gpu:1"
duration_s = 40.0
[[faults]]
at_s = 60.0
target = "gpu:6"
"""

SESSIONS = """
name = "sessions"
seed = 2
[model]
name = "llama-3.1-8b"
[cluster]
topology = "dgx-h100"
[parallel]
dp = 2
[router]
policy = "prefix_aware"
[workload]
arrival = "sessions"
rate_per_s = 4.0
num_requests = 1500
shared_prefix_tokens = 1024
prefix_groups = 3
prompt_tokens = 300
output_tokens = { dist = "lognormal", mean = 150, sigma = 0.5, max = 1024 }
"""


def cases(workdir: Path) -> dict[str, list[str]]:
    """Case name -> CLI arguments after ``run``."""
    files = {"vidur": VIDUR, "faulted": FAULTED, "sessions": SESSIONS}
    for name, text in files.items():
        (workdir / f"{name}.toml").write_text(text)
    base = {
        "vidur": [str(workdir / "vidur.toml")],
        "vidur10k": [str(workdir / "vidur.toml"), "--set", "workload.num_requests=10000"],
        "default": [],
        "azure": [str(HERE / "workloads" / "azure-conv-70b.toml"), "--set",
                  "workload.duration_s=300", "--set", "output.steps=true"],
        "faulted": [str(workdir / "faulted.toml")],
        "sessions": [str(workdir / "sessions.toml")],
        "mooncake": [str(HERE / "workloads" / "mooncake-70b.toml"), "--set",
                     "workload.duration_s=120", "--set", "output.steps=true"],
    }
    out = {}
    for name, args in base.items():
        for prof in ("none", "vllm-v1"):
            pargs = [] if prof == "none" else ["--set", f"engine.profile={prof}"]
            for ff in ("on", "off"):
                if name == "vidur" and ff == "off":
                    continue  # vidur10k covers it at a fifth of the cost
                if name == "vidur10k" and ff == "on":
                    continue
                fargs = [] if ff == "on" else ["--set", "engine.fast_forward=false"]
                out[f"{name}-{prof}-ff{ff}"] = args + pargs + fargs
    return out


def run_all(src: Path, out: Path, only: str | None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    env_py = f"import sys; sys.path.insert(0, {str(src)!r}); import runpy; " \
             "runpy.run_module('simulator', run_name='__main__')"
    for name, args in cases(out).items():
        if only and only not in name:
            continue
        cmd = [sys.executable, "-c", env_py, "run", *args, "--out", str(out / name), "--quiet"]
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=src)
        print(f"{name}: rc {r.returncode}", flush=True)
        if r.returncode:
            print(r.stderr[-2000:])


def _content(path: Path) -> bytes:
    if path.name == "summary.json":
        s = json.loads(path.read_text())
        s.pop("wall_time_s", None)
        s.pop("simpy_events", None)
        return json.dumps(s, sort_keys=True).encode()
    if path.suffix == ".gz":
        return gzip.decompress(path.read_bytes())
    return path.read_bytes()


def compare(a: Path, b: Path) -> int:
    bad = 0
    for case in sorted(p for p in a.iterdir() if p.is_dir()):
        other = b / case.name
        names = sorted(p.name for p in case.iterdir())
        if not other.is_dir():
            print(f"{case.name}: missing in {b}")
            bad += 1
            continue
        if names != sorted(p.name for p in other.iterdir()):
            print(f"{case.name}: different files")
            bad += 1
        diffs = [n for n in names if (other / n).exists()
                 and _content(case / n) != _content(other / n)]
        bad += bool(diffs)
        print(f"{case.name}: {len(names)} files, " + (f"DIFFER: {diffs}" if diffs else "same"))
    print("ALL IDENTICAL" if not bad else f"{bad} cases differ")
    return int(bool(bad))


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("src", type=Path)
    r.add_argument("out", type=Path)
    r.add_argument("--only")
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = ap.parse_args()
    if args.cmd == "run":
        run_all(args.src.resolve(), args.out.resolve(), args.only)
        return 0
    return compare(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
