"""Regenerate the error tables of docs/cost-model.md (prints markdown).

1. Kernel families on H100: every row of simulator/calibration/data/h100_sxm/ predicted by
   the h100_sxm model (as ``python -m simulator calibrate check``).
2. End to end (REFERENCE.md section 4), never fitted to: Splitwise phase times of
   Llama-2-70B fp16 TP8 on DGX-H100 and DGX-A100 (one step of the simulator: stage cost plus
   the engine's step overhead), and vLLM mean TTFT / TPOT of Llama-3.1-70B bf16 at TP8/TP4/TP2
   replaying the APEX+ traces (custom all-reduce off, output lengths scaled to the tokens the
   real runs generated, LMSYS prompts +20% for the chat template).

Usage: ``python benchmarks/docs/calibration_report.py [--skip-kernels] [--profiles P ...]``
(about a minute per APEX+ table).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

import simulator
from simulator.calibration import check
from simulator.hardware.specs import load_gpu
from simulator.paths import ROOT, WORKLOADS

DATA = ROOT / "simulator" / "calibration" / "data" / "h100_sxm"
#: Splitwise (Patel et al., ISCA 2024): prefill (batch, prompt) and decode batch, ms.
SPLITWISE = {
    "dgx-h100": {"prefill": {(1, 512): 54.5, (1, 2048): 136.9, (1, 8192): 827.1,
                             (16, 512): 811.9},
                 "decode": {1: 29.8, 16: 33.7, 64: 51.0}},
    "dgx-a100": {"prefill": {(1, 512): 94.4, (1, 2048): 274.4, (1, 8192): 1588.2},
                 "decode": {1: 44.8, 16: 50.4, 64: 70.2}},
}
#: Context of each sequence in the Splitwise decode steps (not published; at TP8 with one
#: KV head per GPU the step barely depends on it).
DECODE_CONTEXT = 1024
#: APEX+ vLLM runs: (trace, tp) -> (mean TTFT ms, mean TPOT ms, tokens generated).
APEX = {("lmsys", 8): (38.0, 14.1, 81_287), ("lmsys", 4): (38.2, 20.1, 49_161),
        ("lmsys", 2): (55.2, 32.6, 48_117), ("summarization", 8): (243.7, 15.9, 171_757),
        ("summarization", 4): (170.6, 24.8, 202_882),
        ("summarization", 2): (440.2, 41.2, 201_440)}


def kernel_table() -> str:
    gpu = load_gpu("h100_sxm")
    report = check.check(gpu, check.load_data(DATA))
    table = pd.concat([check.breakdown(report), check.summarize(report)])
    lines = ["| family | rows | median abs error % | p90 abs error % |", "|---|---|---|---|"]
    for name, row in table.iterrows():
        lines.append(f"| {name} | {int(row['rows'])} | {row['median_abs_error_pct']:.1f} | "
                     f"{row['p90_abs_error_pct']:.1f} |")
    return "\n".join(lines)


def _stage(topology: str, model: str, tp: int, **engine):
    sc = {"name": "e2e", "model": {"name": model}, "cluster": {"topology": topology},
          "parallel": {"tp": tp}, "engine": engine,
          "workload": {"arrival": "constant", "rate_per_s": 1.0, "num_requests": 1,
                       "prompt_tokens": 16, "output_tokens": 2}}
    plan = simulator.build_plan(simulator.load_scenario(sc))
    return plan.replicas[0].stages[0], plan.scenario.engine.step_overhead_s


def _row(case: str, predicted: float, measured: float) -> str:
    error = (predicted / measured - 1) * 100
    return f"| {case} | {measured:.1f} | {predicted:.1f} | {error:+.0f}% |"


def splitwise_table() -> str:
    lines = ["| Splitwise, Llama-2-70B fp16 TP8 | measured ms | simulated ms | error |",
             "|---|---|---|---|"]
    for topo, phases in SPLITWISE.items():
        # 2023 vLLM: no custom all-reduce.
        stage, overhead = _stage(topo, "llama-2-70b", 8, profile="none",
                                 custom_allreduce=False)
        for (b, s), ms in phases["prefill"].items():
            t = sum(stage.step(b * s, b * s * (s + 1) / 2, 0, 0, b)) + overhead
            lines.append(_row(f"{topo} prefill {b} x {s}", t * 1e3, ms))
        for b, ms in phases["decode"].items():
            t = sum(stage.step(b, 0, 0, b * (DECODE_CONTEXT + 1), b)) + overhead
            lines.append(_row(f"{topo} decode step, batch {b}", t * 1e3, ms))
    return "\n".join(lines)


def apex_table(profile: str | None = None) -> str:
    """APEX+ cases with no profile (the engine keys' defaults, prefill-first as vLLM 0.6)
    or with an engine profile (its keys, then the runs' own settings on top)."""
    lines = [f"| vLLM, Llama-3.1-70B bf16, 8xH100, profile {profile or '(none)'} | "
             "measured TTFT / TPOT ms | simulated TTFT / TPOT ms | errors |",
             "|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        for (trace, tp), (ttft, tpot, generated) in APEX.items():
            d = pd.read_csv(WORKLOADS / f"apex_llama_{trace}_05.csv")
            scale = generated / d["GeneratedTokens"].sum()
            out = np.maximum(1, np.round(d["GeneratedTokens"] * scale)).astype(int)
            prompt = np.round(d["ContextTokens"] * (1.2 if trace == "lmsys" else 1.0))
            path = Path(tmp) / f"{trace}_{tp}.csv"
            pd.DataFrame({"start_offset_ns": d["start_offset_ns"],
                          "ContextTokens": prompt.astype(int),
                          "GeneratedTokens": out}).to_csv(path, index=False)
            # vLLM 0.6 with max_model_len <= 32k: prefill-first scheduling, whole prompts.
            sc = {"name": f"apex-{trace}-tp{tp}", "model": {"name": "llama-3.1-70b"},
                  "cluster": {"topology": "dgx-h100"}, "parallel": {"tp": tp},
                  "engine": ({"profile": profile, "max_model_len": 8192,
                              "custom_allreduce": False} if profile else
                             {"profile": "none", "scheduler": "vllm_v0", "max_model_len": 8192,
                              "max_num_batched_tokens": 8192, "custom_allreduce": False}),
                  "workload": {"arrival": "trace", "trace": str(path), "rate_per_s": None,
                               "num_requests": None},
                  "output": {"steps": False}}
            s = simulator.run(sc).summary
            t1, t2 = s["ttft_mean_s"] * 1e3, s["tpot_mean_s"] * 1e3
            lines.append(f"| {trace} TP{tp} | {ttft:.1f} / {tpot:.1f} | {t1:.1f} / {t2:.1f} | "
                         f"{(t1 / ttft - 1) * 100:+.0f}% / {(t2 / tpot - 1) * 100:+.0f}% |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--skip-kernels", action="store_true", help="only the end-to-end tables")
    ap.add_argument("--profiles", nargs="*", default=["vllm-v0.6"],
                    help="engine profiles to run the APEX+ cases with, besides none")
    args = ap.parse_args()
    if not args.skip_kernels:
        print("### Kernel families on H100 SXM\n")
        print(kernel_table() + "\n")
    print("### End to end (REFERENCE.md section 4)\n")
    print(splitwise_table() + "\n")
    print(apex_table())
    for profile in args.profiles:
        print()
        print(apex_table(profile))


if __name__ == "__main__":
    main()
