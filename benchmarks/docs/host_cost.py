"""Host CPU cost per engine: TPOT of a closed loop at 128 sequences per TP degree, with each
profile's per-sequence host work and without it (``host_seq_s = 0``: the constant 3 ms CPU
step of before). Llama-3.1-8B bf16 on one DGX H100, 1,024-token prompts, 512 output
tokens, 128 clients, 256 requests. A few seconds.

    python benchmarks/docs/host_cost.py
"""

from __future__ import annotations

import simulator

TPS = (1, 2, 4, 8)


def scenario(profile: str, tp: int, **engine) -> dict:
    return {"name": "host-cost", "seed": 0, "model": {"name": "llama-3.1-8b"},
            "cluster": {"topology": "dgx-h100"}, "parallel": {"tp": tp},
            "engine": {"profile": profile, **engine},
            "workload": {"arrival": "closed_loop", "concurrency": 128, "num_requests": 256,
                         "prompt_tokens": 1024, "output_tokens": 512},
            "output": {"steps": False}}


def tpot_ms(profile: str, tp: int, **engine) -> float:
    """Mean TPOT (ms) of the closed loop."""
    return simulator.run(scenario(profile, tp, **engine)).summary["tpot_mean_s"] * 1e3


def main() -> None:
    print("| profile | host per step at 128 seqs, ms | " +
          " | ".join(f"TP{tp} TPOT ms (flat 3 ms)" for tp in TPS) + " |")
    print("|---|---|" + "---|" * len(TPS))
    for profile in ("vllm-v1", "sglang", "trtllm", "vllm-v0.6"):
        seq = simulator.load_scenario(scenario(profile, 1)).engine.host_seq_s
        cells = [f"{tpot_ms(profile, tp):.2f} ({tpot_ms(profile, tp, host_seq_s=0.0):.2f})"
                 for tp in TPS]
        print(f"| `{profile}` | {3 + 128 * seq * 1e3:.2f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
