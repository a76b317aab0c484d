"""The AIConfigurator comparison's scenario files (benchmarks/validation/aiconfigurator) load,
validate, and ask the same question as the AIConfigurator arguments beside them.
AIConfigurator itself is never imported or run here."""

import importlib.util
import sys
from pathlib import Path

import pytest

from simulator import build_plan, load_scenario

HERE = Path(__file__).resolve().parents[1] / "benchmarks" / "validation" / "aiconfigurator"
spec = importlib.util.spec_from_file_location("aic_compare", HERE / "compare.py")
compare = importlib.util.module_from_spec(spec)
sys.modules["aic_compare"] = compare  # dataclasses look their module up
spec.loader.exec_module(compare)


@pytest.mark.parametrize("q", compare.QUESTIONS, ids=lambda q: q.key)
def test_scenario_matches_question(q):
    s = load_scenario(str(HERE / q.toml))
    assert s.workload.arrival == "closed_loop"
    assert (s.workload.prompt_tokens, s.workload.output_tokens) == (q.isl, q.osl)
    assert (s.slo.ttft_s, s.slo.tpot_s) == (q.ttft_ms / 1e3, q.tpot_ms / 1e3)
    # the same GPUs: AIConfigurator's system is the GPU of the scenario's node kind
    assert s.cluster.nodes * 8 == q.gpus
    assert s.cluster.topology == {"h200_sxm": "hgx-h200", "h100_sxm": "dgx-h100"}[q.system]
    # the simulator's catalog model is the one AIConfigurator is asked about
    assert q.hf_model.split("/")[1].lower().replace("meta-", "").startswith(
        s.model.name.split("-a22b")[0])
    build_plan(s)  # the scenario's own layout builds (fits in memory)


def test_aic_layout_mapping():
    """AIConfigurator's layout names map to ours as docs/moe.md defines them."""
    import pandas as pd
    dense = pd.Series({"tp": 4, "pp": 1, "dp": 1, "moe_tp": 1, "moe_ep": 1, "replicas": 2,
                       "global_bs": 128, "concurrency": 256})
    assert compare.aic_to_ours(dense, moe=False) == {
        "parallel.tp": 4, "parallel.pp": 1, "parallel.dp": 2, "engine.max_num_seqs": 128,
        "workload.concurrency": 256}
    adp_ep = dense.copy()
    adp_ep.update({"tp": 1, "dp": 8, "moe_ep": 8, "replicas": 1, "concurrency": 128})
    point = compare.aic_to_ours(adp_ep, moe=True)
    assert (point["parallel.tp"], point["parallel.ep"], point["parallel.attention_dp"]) == \
        (8, 8, True)
    adp_etp = adp_ep.copy()
    adp_etp.update({"moe_tp": 8, "moe_ep": 1})
    point = compare.aic_to_ours(adp_etp, moe=True)  # DP attention with MoE-TP
    assert (point["parallel.tp"], point["parallel.ep"], point["parallel.attention_dp"]) == \
        (8, 1, True)
    hybrid = adp_ep.copy()
    hybrid.update({"tp": 2, "dp": 4, "moe_tp": 2, "moe_ep": 4})  # attention TP2 x DP4
    point = compare.aic_to_ours(hybrid, moe=True)
    assert (point["parallel.tp"], point["parallel.ep"], point["parallel.attention_tp"]) == \
        (8, 4, 2)
    hybrid.update({"moe_tp": 1, "moe_ep": 4})  # 4 expert GPUs for 8 attention GPUs
    assert compare.aic_to_ours(hybrid, moe=True) is None
