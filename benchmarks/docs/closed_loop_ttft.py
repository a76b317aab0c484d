"""Steady-state TTFT of a fixed-length closed loop: what the simulator predicts at
concurrency 1 / 8 / 32 and which engine settings break the clients' lockstep.

The held-out vLLM V1 case: Llama-3.1-70B fp8, TP4 on one DGX H100, 1,000-token prompts,
500 output tokens, each client sending its next request when the previous one ends
(`vllm bench serve --max-concurrency C --request-rate inf`). TTFT is averaged over every
request after each client's first five (the steady state). Three tables: per token budget,
per request rate (``rate_per_s`` with ``closed_loop``: ``--request-rate`` with
``--max-concurrency``) and per spread of output lengths; then the plain roofline of one
prefill step that holds the prompts of C lockstep clients, a lower bound for every TTFT of
a lockstep group whatever the engine does. A few seconds.

    python benchmarks/docs/closed_loop_ttft.py
"""

from __future__ import annotations

import simulator
from simulator.hardware.specs import load_gpu
from simulator.model.cost import roofline_time
from simulator.model.spec import load_model

PROMPT, OUTPUT, TP, PER_CLIENT, SKIP = 1000, 500, 4, 20, 5

#: (label, [engine] keys on top of the default vllm-v1 profile). The second is vLLM V1's
#: API-server default before the GPU-dependent defaults (vllm/engine/arg_utils.py
#: `_set_default_args_v1`, v0.8: 2048 tokens on every GPU).
SETTINGS = [("vllm-v1 (budget 8192)", {}),
            ("vllm-v1, budget 4096", {"max_num_batched_tokens": 4096}),
            ("vllm-v1, budget 2048", {"max_num_batched_tokens": 2048})]


#: vllm bench serve --request-rate R with --max-concurrency C: request i is released at a
#: Poisson time and sent when a client is free (``rate_per_s`` with ``closed_loop``).
RATES = [None, 100.0, 10.0]


#: Output lengths drawn uniformly around 500 (``--random-range-ratio``), and exact.
SPREADS = [None, (495, 505), (450, 550)]


def scenario(concurrency: int, rate: float | None = None, output: object = OUTPUT,
             **engine) -> dict:
    return {"name": "closed-loop-ttft", "seed": 0,
            "model": {"name": "llama-3.1-70b", "weight_dtype": "fp8"},
            "cluster": {"topology": "dgx-h100"}, "parallel": {"tp": TP}, "engine": engine,
            "workload": {"arrival": "closed_loop", "concurrency": concurrency,
                         "num_requests": concurrency * PER_CLIENT, "prompt_tokens": PROMPT,
                         "output_tokens": output,
                         **({"rate_per_s": rate} if rate is not None else {})},
            "output": {"steps": False}}


def steady_ttft_ms(concurrency: int, rate: float | None = None, output: object = OUTPUT,
                   **engine) -> tuple[float, float]:
    """Mean and median TTFT (ms) of the requests after each client's first SKIP."""
    req = simulator.run(scenario(concurrency, rate, output, **engine)).requests.sort_values(
        "arrival_s")
    ttft = req["ttft_s"].iloc[concurrency * SKIP:] * 1e3
    return float(ttft.mean()), float(ttft.median())


def group_roofline_ms(concurrency: int) -> float:
    """Plain roofline of one step prefilling ``concurrency`` whole prompts, ms."""
    t = concurrency * PROMPT
    pairs = concurrency * PROMPT * (PROMPT + 1) / 2
    return 1e3 * roofline_time(load_model("llama-3.1-70b"), load_gpu("h100_sxm"), TP, "fp8",
                               "bf16", t, pairs, 0.0, 0.0, concurrency)


def row(label: str, **kw) -> str:
    """One table row: mean / median steady-state TTFT (ms) at 1, 8 and 32 clients."""
    cells = [f"{m:.0f} / {md:.0f}" for m, md in (steady_ttft_ms(c, **kw) for c in (1, 8, 32))]
    return f"| {label} | " + " | ".join(cells) + " |"


def main() -> None:
    print("| setting | TTFT mean / median ms, C = 1 | C = 8 | C = 32 |")
    print("|---|---|---|---|")
    for label, engine in SETTINGS:
        print(row(label, **engine))
    print()
    print("| --request-rate (budget 8192) | C = 1 | C = 8 | C = 32 |")
    print("|---|---|---|---|")
    for rate in RATES:
        print(row("inf" if rate is None else f"{rate:g} req/s", rate=rate))
    print()
    print("| output tokens (budget 8192) | C = 1 | C = 8 | C = 32 |")
    print("|---|---|---|---|")
    for spread in SPREADS:
        out = OUTPUT if spread is None else {"dist": "uniform", "min": spread[0],
                                             "max": spread[1]}
        print(row("500" if spread is None else f"{spread[0]}-{spread[1]}", rate=None,
                  output=out))
    print()
    for c in (1, 8):
        print(f"roofline of one step prefilling {c} x {PROMPT} tokens: "
              f"{group_roofline_ms(c):.1f} ms")


if __name__ == "__main__":
    main()
