"""Decode step time against context for the attention kinds: dense GQA, hybrid Gated
DeltaNet, MLA and DeepSeek sparse attention (one stage, 32 sequences).

    python benchmarks/docs/attention_kinds_context.py

Prints the step time (ms) of a decode-only step of 32 sequences at each context length:
Qwen3-32B (GQA) and Qwen3.5-27B (48 of 64 layers Gated DeltaNet) on one H200 in BF16,
DeepSeek-V3 (MLA) and DeepSeek-V3.2 (DSA, top-2048) on 8 H200 in FP8 (MoE-TP). The hybrid
grows with the context on its 16 full-attention layers only; DSA stops growing once the
context passes 2,048 tokens (its indexer's small per-token term remains).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from simulator.hardware.specs import load_gpu  # noqa: E402
from simulator.model.memory import ExpertLayout  # noqa: E402
from simulator.model.moe_stage import MoEStageCost  # noqa: E402
from simulator.model.routing import Routing  # noqa: E402
from simulator.model.spec import load_model  # noqa: E402
from simulator.parallel.collective import AllReduceCost  # noqa: E402

CONTEXTS = (1024, 2048, 4096, 16384, 65536, 131072)
SEQS = 32


def stage(name: str, tp: int, dtype: str) -> MoEStageCost:
    m = load_model(name)
    experts = m.moe.experts if m.moe else 1
    routing = Routing.build(np.ones(experts) / experts, 1, 0, m.moe.top_k if m.moe else 1, 0)
    return MoEStageCost(m, load_gpu("h200_sxm"), tp, 0, m.layers, True, True, dtype, "bf16",
                        AllReduceCost((), 1), ExpertLayout(expert_dtype=dtype), routing, None)


def main() -> int:
    rows = (("qwen3-32b", 1, "bf16"), ("qwen3.5-27b", 1, "bf16"), ("deepseek-v3", 8, "fp8"),
            ("deepseek-v3.2", 8, "fp8"))
    print("decode step of 32 sequences, ms (compute; one stage, no communication)")
    print(f"{'model':16s}" + "".join(f"{c:>10d}" for c in CONTEXTS))
    for name, tp, dtype in rows:
        c = stage(name, tp, dtype)
        times = [c.step(SEQS, 0.0, 0, SEQS * ctx, SEQS)[0] * 1e3 for ctx in CONTEXTS]
        print(f"{name:16s}" + "".join(f"{t:10.2f}" for t in times))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
