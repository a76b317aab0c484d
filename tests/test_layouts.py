"""Parallel layouts the engines run: MoE-TP x EP, attention DP with MoE-TP, attention TP x
DP hybrids, each engine's flags translated to one layout, KV-head replication and the
engines' refusals (docs/moe.md, "Layouts")."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from simulator import run
from simulator.cli import main
from simulator.cluster.pools import build_plan
from simulator.errors import ScenarioError
from simulator.io.scenario import load_scenario
from simulator.model.memory import ExpertLayout, moe_weight_bytes_per_gpu
from simulator.model.moe_cost import a2a_time, expert_time
from simulator.model.spec import load_model
from simulator.planner.space import Layout, layouts

QWEN = "qwen3-235b-a22b"  # 64 query heads, 4 KV heads, 128 experts, top-8, h = 4096


def _scenario(parallel: dict, model: str = QWEN, **engine) -> dict:
    return {"model": {"name": model, "weight_dtype": "fp8"},
            "cluster": {"topology": "hgx-h200"}, "parallel": parallel,
            "engine": engine, "workload": {"rate_per_s": 1.0, "num_requests": 4}}


def _par(parallel: dict, model: str = QWEN):
    """The layout in the simulator's spelling (without the engine whose head rule applies,
    which the convention records)."""
    par = load_scenario(_scenario(parallel, model)).parallel
    assert par.heads_rule == parallel.get("convention")
    return dataclasses.replace(par, heads_rule=None)


# -- each engine's flags map to the same layout ----------------------------------------------
SIM = {"tp": 8, "ep": 8, "attention_dp": True}


@pytest.mark.parametrize("flags", [
    {"convention": "vllm", "tp": 1, "dp": 8, "ep": 8},   # --data-parallel-size 8 --enable-ep
    {"convention": "sglang", "tp": 8, "dp": 8, "ep": 8, "attention_dp": True},
    {"convention": "trtllm", "tp": 8, "ep": 8, "attention_dp": True},
])
def test_each_engines_dp_ep_flags_map_to_one_engine(flags):
    # One engine of 8 GPUs with one EP8 group over the attention-DP ranks, not 8 replicas.
    assert _par(flags) == _par(SIM)
    assert _par(flags).dp == 1


@pytest.mark.parametrize("flags", [
    {"convention": "vllm", "tp": 2, "dp": 4, "ep": 8},
    {"convention": "sglang", "tp": 8, "dp": 4, "ep": 8, "attention_dp": True},
])
def test_attention_tp_within_dp_flags_map_to_one_layout(flags):
    assert _par(flags) == _par({"tp": 8, "ep": 8, "attention_dp": True, "attention_tp": 2})


@pytest.mark.parametrize("flags", [
    {"convention": "trtllm", "tp": 8, "ep": 4, "moe_tp": 2},
    {"convention": "trtllm", "tp": 8, "ep": 4},  # moe_tp derived: tp / ep
    {"convention": "trtllm", "tp": 8, "moe_tp": 2},  # ep derived: tp / moe_tp
    {"convention": "sglang", "tp": 8, "ep": 4},
])
def test_moe_tp_by_ep_flags_map_to_one_layout(flags):
    assert _par(flags) == _par({"tp": 8, "ep": 4})


def test_vllm_dp_of_a_dense_model_is_replicas_and_replicas_multiply():
    assert _par({"convention": "vllm", "tp": 2, "dp": 4}, "llama-3.1-8b") == _par(
        {"tp": 2, "dp": 4}, "llama-3.1-8b")
    assert _par({"convention": "vllm", "tp": 2, "dp": 4, "ep": 8, "replicas": 2}) == _par(
        {"tp": 8, "ep": 8, "attention_dp": True, "attention_tp": 2, "dp": 2})


# -- what each layout costs, by hand ---------------------------------------------------------
def _stage(parallel: dict):
    plan = build_plan(load_scenario(_scenario(parallel)))
    return plan, plan.replicas[0].stages[0]


def test_hybrid_per_rank_tokens_kv_and_all_to_all_by_hand():
    plan, c = _stage({"tp": 8, "ep": 8, "attention_dp": True, "attention_tp": 2})
    m = plan.model
    # Attention TP2 within DP4: 4 groups of 2 GPUs, each with 1000 / 4 tokens, 64 / 2 query
    # heads and 4 / 2 KV heads per GPU.
    assert (c.split, c._rank_tokens(1000), c.heads) == (4, 250, 32)
    assert plan.memory.block_bytes_per_gpu[0] == 16 * 2 * 94 * 2 * 128 * 2
    # Each group caches its own requests: the replica holds 4 groups' blocks.
    assert plan.memory.kv_blocks % 4 == 0
    # All-to-all over the 8 EP ranks, T / 8 tokens each; uniform routing, top-8 over 8
    # ranks of 16 experts: a token reaches a given rank with 1 - (7/8)^8, so each rank
    # sends every peer T/8 (1 - (7/8)^8) h b bytes (b = 1: fp8 dispatch, 2 for combine).
    t, h = 1000, m.hidden
    hit = 1 - (7 / 8) ** 8
    out, back = t / 8 * hit * h * 1, t / 8 * hit * h * 2
    tab = c.table(t, "normal", [0])
    imb = tab.imbalance[0]
    want = (a2a_time(out * imb, t / 8, c.paths, "normal", "dispatch", plan.node.gpu)
            + a2a_time(back * imb, t / 8, c.paths, "normal", "combine", plan.node.gpu))
    assert tab.a2a_s[0] == pytest.approx(want, rel=1e-12)
    # The attention group's two all-reduces per layer on its 250 tokens, no TP8 all-reduce.
    assert c.comm.attention.ranks == 2
    assert c._comm(t, 0) == pytest.approx(2 * 94 * c.comm.attention.time(250 * h * 2))


def test_attention_dp_with_moe_tp_gathers_every_token():
    plan, c = _stage({"tp": 8, "ep": 1, "attention_dp": True})
    _, tp = _stage({"tp": 8, "ep": 1})
    t, h, n_moe = 1000, plan.model.hidden, 94
    # Each rank runs attention on 125 tokens with all 64 heads, then every expert's I / 8
    # slice on all 1000 tokens, exactly as MoE-TP under TP attention does.
    assert (c.split, c._rank_tokens(t), c.heads, c.a2a) == (8, 125, 64, False)
    assert c.table(t, "normal", [3]).expert_s[3] == tp.table(t, "normal", [3]).expert_s[3]
    # Around the experts an all-gather and a reduce-scatter of T h b bytes over the 8 GPUs
    # replace the two TP8 all-reduces (single-GPU attention: nothing else).
    g = c.comm
    assert c._comm(t, 0) == pytest.approx(n_moe * (g.gather.time(t * h * 2)
                                                   + g.scatter.time(t * h * 2)))
    # Each moves 7/8 of the buffer through a GPU's NVLink ports at best.
    bw = max(d["bandwidth_Bps"] for _, _, d in plan.graph.edges(data=True)
             if d["kind"] == "nvlink")
    assert g.gather.time(t * h * 2) >= 7 / 8 * t * h * 2 / bw


def test_moe_tp_by_ep_slices_each_rank_experts_by_hand():
    plan, c = _stage({"tp": 8, "ep": 4})
    m = plan.model
    # EP4 x MoE-TP2: 128 / 4 = 32 experts per rank, each sliced over 2 GPUs: the same
    # expert bytes per GPU as EP8's 16 whole experts.
    ep4 = ExpertLayout(4, expert_dtype="fp8")
    ep8 = ExpertLayout(8, expert_dtype="fp8")
    args = (m, 8)
    rest = (0, m.layers, True, True, "fp8")
    assert moe_weight_bytes_per_gpu(*args, ep4, *rest) == pytest.approx(
        moe_weight_bytes_per_gpu(*args, ep8, *rest))
    # Its experts run I / 2 columns on the rows routed to the rank's 32 experts.
    rows = [5]
    want = expert_time(c.routing.local_counts(1000, rows), m, m.moe.intermediate // 2,
                       plan.node.gpu, "fp8", 4).max(axis=1)
    assert c.table(1000, "normal", rows).expert_s[5] == want[0]
    assert c.moe_tp == 2 and c.comm is None  # TP attention: the TP8 all-reduces


# -- KV heads the engines replicate, and their refusals -------------------------------------
def _gqa_40_8(tmp_path):
    """A Qwen3-14B-shaped model: 40 query heads, 8 KV heads, 40 layers, head_dim 128."""
    f = tmp_path / "q14.json"
    f.write_text(json.dumps({"hidden_size": 5120, "num_attention_heads": 40,
                             "num_key_value_heads": 8, "num_hidden_layers": 40,
                             "head_dim": 128, "intermediate_size": 17408,
                             "vocab_size": 151936, "max_position_embeddings": 40960}))
    return str(f)


def test_trtllm_replicates_kv_heads_where_vllm_refuses(tmp_path, capsys):
    name = _gqa_40_8(tmp_path)
    # TP5: 40 / 5 = 8 query heads per GPU; 8 KV heads over 5 GPUs: TensorRT-LLM gives each
    # ceil(8 / 5) = 2 (10 stored for 8: 25 % more KV than the heads need).
    s = _scenario({"convention": "trtllm", "tp": 5}, name)
    s["model"]["weight_dtype"] = "bf16"
    plan = build_plan(load_scenario(s))
    assert plan.memory.block_bytes_per_gpu[0] == 16 * 2 * 40 * 2 * 128 * 2
    # vLLM (the default profile) and SGLang refuse: 5 neither divides nor is a multiple of 8.
    f = tmp_path / "v.toml"
    f.write_text(f'[model]\nname = "{name}"\n[cluster]\ntopology = "hgx-h200"\n'
                 f'[parallel]\ntp = 5\n[workload]\nrate_per_s = 1.0\nnum_requests = 4\n')
    assert main(["validate", str(f)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "parallel.tp: 5 is neither a divisor nor a multiple of the 8 KV" \
        in err[0] and "vllm refuses" in err[0]
    s = _scenario({"convention": "sglang", "tp": 5}, name)
    with pytest.raises(ScenarioError, match="sglang refuses"):
        build_plan(load_scenario(s))
    # Query heads must divide in every engine.
    with pytest.raises(ScenarioError, match="does not divide the 40 attention heads"):
        build_plan(load_scenario(_scenario({"convention": "trtllm", "tp": 3}, name)))


@pytest.mark.parametrize("parallel, key", [
    ({"convention": "vllm", "tp": 2, "dp": 4, "ep": 4}, "parallel.ep: 4 is not what vLLM"),
    ({"convention": "vllm", "tp": 8, "attention_dp": True}, "parallel.attention_dp: not a vllm"),
    ({"convention": "sglang", "tp": 8, "ep": 3}, "parallel.ep: 3 does not divide tp = 8"),
    ({"convention": "sglang", "tp": 8, "dp": 3, "attention_dp": True},
     "parallel.dp: 3 does not divide tp = 8"),
    ({"convention": "trtllm", "tp": 8, "ep": 4, "moe_tp": 4}, "parallel.moe_tp: 4 x ep 4"),
    ({"tp": 8, "moe_tp": 2}, "parallel.moe_tp: 2 is an engine's flag"),
    ({"tp": 8, "attention_tp": 2}, "parallel.attention_tp: 2 needs parallel.attention_dp"),
    ({"tp": 8, "ep": 3}, "parallel.ep: 3 does not divide parallel.tp"),
    ({"tp": 8, "ep": 8, "attention_dp": True, "attention_tp": 3}, "parallel.attention_dp"),
    ({"tp": 8, "ep": 8, "attention_dp": True, "attention_tp": 8}, "parallel.attention_dp"),
    ({"tp": 8, "ep": 8, "attention_dp": True, "attention_tp": 16}, "parallel.attention_dp"),
])
def test_layouts_the_engines_refuse_exit_2_with_one_line(tmp_path, capsys, parallel, key):
    lines = "\n".join(f"{k} = {json.dumps(v)}" for k, v in parallel.items())
    f = tmp_path / "s.toml"
    f.write_text(f'[model]\nname = "{QWEN}"\nweight_dtype = "fp8"\n[cluster]\n'
                 f'topology = "hgx-h200"\n[parallel]\n{lines}\n'
                 f'[workload]\nrate_per_s = 1.0\nnum_requests = 4\n')
    assert main(["validate", str(f)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and key in err[0], err


def test_two_batch_overlap_needs_the_all_to_all():
    s = _scenario({"tp": 8, "ep": 1, "attention_dp": True})
    s["model"]["two_batch_overlap"] = True
    with pytest.raises(ScenarioError, match="ep = tp"):
        build_plan(load_scenario(s))


# -- the planner searches them ---------------------------------------------------------------
def test_planner_searches_the_new_moe_layouts_and_not_for_dense_models():
    moe = layouts(load_model(QWEN), 8)
    assert Layout(8, 1, 1, 1, True) in moe  # attention DP with MoE-TP
    assert Layout(8, 1, 1, 4, False) in moe  # EP4 x MoE-TP2
    assert Layout(2, 1, 1, 1, False) in moe and Layout(2, 1, 1, 1, True) in moe
    assert len(moe) == len(set(moe))
    dense = layouts(load_model("llama-3.1-8b"), 8)
    assert all(lay.ep == 1 and not lay.attention_dp for lay in dense)
    assert len(dense) == len({dataclasses.astuple(x)[:3] for x in dense})


# -- docs/moe.md, "Worked example: the layouts of one node" ------------------------------------
WORKED = "workloads/moe-qwen3-235b-8xh100.toml"
ROWS = [  # overrides, TTFT s, TPOT ms, tok/s, KV tokens, as the table quotes them
    ([], 0.124, 33.7, 898, 338480),
    (['parallel.convention="trtllm"', "parallel.ep=4", "parallel.moe_tp=2"],
     0.124, 33.2, 910, 335696),
    (['parallel.convention="vllm"', "parallel.tp=1", "parallel.dp=8", "parallel.ep=8"],
     0.168, 48.9, 790, 197760),
    (['parallel.convention="sglang"', "parallel.dp=4", "parallel.attention_dp=true"],
     0.168, 47.9, 799, 478208),
    (['parallel.convention="trtllm"', "parallel.ep=1", "parallel.attention_dp=true"],
     0.133, 37.4, 874, 158720),
]


@pytest.mark.parametrize("overrides, ttft, tpot, tok, kv", ROWS)
def test_docs_worked_layouts_table(overrides, ttft, tpot, tok, kv):
    path = Path(__file__).resolve().parents[1] / WORKED
    s = load_scenario(str(path), overrides)
    assert build_plan(s).memory.kv_tokens == kv
    summary = run(s).summary
    assert round(summary["ttft_mean_s"], 3) == ttft
    assert round(summary["tpot_mean_s"] * 1e3, 1) == tpot
    assert round(summary["throughput_tok_per_s"]) == tok


def test_docs_worked_validate_lines(capsys):
    path = Path(__file__).resolve().parents[1] / WORKED
    assert main(["validate", str(path), "--set", 'parallel.convention="sglang"', "--set",
                 "parallel.dp=4", "--set", "parallel.attention_dp=true"]) == 0
    out = capsys.readouterr().out
    for line in ("tp all-reduce  none over the stage: attention DP (each group of 2 GPUs "
                 "runs attention for its own requests; the MoE layers exchange tokens by "
                 "all-to-all)",
                 "weights 59.5 GiB per GPU, KV cache 29888 blocks = 478208 tokens per replica",
                 "attention DP4 x TP2: each group of 2 GPUs caches its own requests' KV"):
        assert line in out


def test_vllm_dp_ep_over_two_nodes_is_one_ep16_engine():
    # --data-parallel-size 16 --enable-expert-parallel on 2 x 8 H200: one engine whose EP16
    # group spans both nodes, each GPU caching its own requests' latents.
    path = Path(__file__).resolve().parents[1] / "workloads/moe-deepseek-v3-2xh200.toml"
    vllm = load_scenario(str(path), ['parallel.convention="vllm"', "parallel.tp=1",
                                     "parallel.dp=16", "parallel.ep=16",
                                     "parallel.attention_dp=false"])
    own = load_scenario(str(path))
    assert dataclasses.replace(vllm.parallel, heads_rule=None) == own.parallel
    assert build_plan(vllm).memory.kv_tokens == build_plan(own).memory.kv_tokens == 17646336
