"""TTFT of a fixed-concurrency benchmark against the shared validation runs: Qwen3-32B on
one DGX H100, fixed lengths, each case driven by the named client of its engine
(``vllm-bench`` for vLLM, ``trtllm-bench`` for TensorRT-LLM). Prints, per case, the
measured mean TTFT (../shared/validation, when present), the simulated one, the number of
prompts the steady state's prefill steps hold, and the plain roofline of one step holding
all C prompts (the floor of any TTFT of a lockstep group, whatever the kernels). A few
seconds; used to find wrong behaviour, nothing is fitted to it.

    python benchmarks/validation/client_ttft.py
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

import simulator
from simulator.hardware.specs import load_gpu
from simulator.model.cost import roofline_time
from simulator.model.spec import load_model

VALIDATION = (Path(__file__).resolve().parents[2].parent / "shared" / "validation"
              / "silicon_dense_qwen3_32b.csv")

#: (profile, client, weight dtype, validation backend, precision label, ISL, OSL, TP, C)
CASES = [("vllm-v1", "vllm-bench", "bf16", "vllm", None, 1024, 512, 4, 8),
         ("vllm-v1", "vllm-bench", "bf16", "vllm", None, 1024, 512, 4, 32),
         ("trtllm", "trtllm-bench", "fp8", "trtllm", "fp8", 1024, 256, 4, 8),
         ("trtllm", "trtllm-bench", "fp8", "trtllm", "fp8", 1024, 256, 4, 32)]
CYCLES = 10


def scenario(profile: str, client: str, dtype: str, isl: int, osl: int, tp: int,
             c: int, **engine) -> dict:
    return {"name": "client-ttft", "seed": 0,
            "model": {"name": "qwen3-32b", "weight_dtype": dtype},
            "cluster": {"topology": "dgx-h100"}, "parallel": {"tp": tp},
            "engine": {"profile": profile, **engine},
            "workload": {"arrival": "closed_loop", "client": client, "concurrency": c,
                         "num_requests": c * CYCLES, "prompt_tokens": isl,
                         "output_tokens": osl}}


def simulated(profile, client, dtype, isl, osl, tp, c, **engine) -> tuple[float, list[int]]:
    """Mean TTFT (ms) and the prompt counts of the last cycle's prefill steps."""
    res = simulator.run(scenario(profile, client, dtype, isl, osl, tp, c, **engine))
    steps = res.steps[res.steps["prefill_tokens"] > 0]
    groups = (steps["prefill_tokens"] // isl).tail(c).tolist()
    return float(res.requests["ttft_s"].mean() * 1e3), groups


def group_roofline_ms(dtype: str, isl: int, tp: int, c: int) -> float:
    """Plain roofline of one step prefilling ``c`` whole prompts, ms."""
    t = c * isl
    return 1e3 * roofline_time(load_model("qwen3-32b"), load_gpu("h100_sxm"), tp, dtype,
                               "bf16", t, c * isl * (isl + 1) / 2, 0.0, 0.0, c)


def measured(backend: str, precision: str | None, isl: int, osl: int, tp: int,
             c: int) -> float | None:
    if not VALIDATION.exists():
        return None
    df = pd.read_csv(VALIDATION)
    rows = df[(df["system"] == "h100_sxm") & (df["backend"] == backend)
              & (df["isl"] == isl) & (df["osl"] == osl) & (df["tp_size"] == tp)
              & (df["batch_size"] == c)
              & (df["precision"].isna() if precision is None
                 else df["precision"] == precision)]
    return float(rows["silicon_ttft_ms"].mean()) if len(rows) else None


def main() -> None:
    print("| case | measured TTFT ms | simulated | prompts per prefill step | "
          "C-prompt step roofline ms |")
    print("|---|---|---|---|---|")
    for profile, client, dtype, backend, prec, isl, osl, tp, c in CASES:
        meas = measured(backend, prec, isl, osl, tp, c)
        ttft, groups = simulated(profile, client, dtype, isl, osl, tp, c)
        roof = group_roofline_ms(dtype, isl, tp, c)
        label = f"`{client}`, {dtype}, {isl}/{osl}, TP{tp}, C = {c}"
        m = f"{meas:.0f}" if meas is not None else "-"
        print(f"| {label} | {m} | {ttft:.0f} | {sorted(set(groups))} | {roof:.0f} |")


if __name__ == "__main__":
    main()
