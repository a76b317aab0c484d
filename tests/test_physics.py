"""Analytic checks: roofline lower bounds, ring all-reduce, pipeline bubbles, memory."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import DATA, toy_scenario

import simulator
from simulator.hardware.specs import load_gpu, load_node
from simulator.metrics.summary import bubble_fraction
from simulator.model.cost import roofline_time
from simulator.model.memory import plan_memory, weight_bytes_per_gpu
from simulator.model.spec import load_model
from simulator.parallel.collective import BANDWIDTH_EFFICIENCY, LAUNCH_S, ring_allreduce
from simulator.parallel.placement import place
from simulator.topology.graph import Paths, build_graph, nvlink_domains

H100 = load_gpu("h100_sxm")


def _single(prompt: int, output: int, tp: int, model="llama-3.1-70b", **engine):
    sc = {"name": "one", "model": {"name": model}, "cluster": {"topology": "dgx-h100"},
          "parallel": {"tp": tp}, "engine": engine,
          "workload": {"arrival": "constant", "rate_per_s": 0.01, "num_requests": 1,
                       "prompt_tokens": prompt, "output_tokens": output}}
    return simulator.run(sc).requests.iloc[0]


@pytest.mark.parametrize("tp", [2, 4, 8])
@pytest.mark.parametrize("prompt", [16, 1024, 8000])
def test_single_request_never_beats_the_roofline(tp, prompt):
    m = load_model("llama-3.1-70b")
    r = _single(prompt, 33, tp)
    # Independent bounds on one GPU of the TP group: every weight byte is read once per step
    # (HBM), and every parameter does 2 FLOPs per token (tensor peak).
    w = weight_bytes_per_gpu(m, tp, m.layers, True, True, "bf16")
    linear_params = m.layers * (m.attn_params_per_layer + m.mlp_params_per_layer) / tp
    ttft_bound = max(w / H100.hbm_bandwidth_Bps, 2 * linear_params * prompt / H100.peak("bf16"))
    tpot_bound = w / H100.hbm_bandwidth_Bps
    assert r["ttft_s"] >= ttft_bound
    assert r["tpot_s"] >= tpot_bound
    # And the full per-step roofline of the package (all operators, no efficiency loss).
    pre = roofline_time(m, H100, tp, "bf16", "bf16", prompt, prompt * (prompt + 1) / 2, 0, 0, 1)
    dec = roofline_time(m, H100, tp, "bf16", "bf16", 1, 0, 0, prompt + 16, 1)
    assert r["ttft_s"] >= pre
    assert r["tpot_s"] >= dec
    # Real kernels land within ~2x of the roofline for big steps (REFERENCE.md section 1).
    assert r["ttft_s"] < 3 * pre + 0.02


def test_tpot_grows_with_context_and_more_tp_is_faster():
    short, long_ = _single(128, 64, 4), _single(32000, 64, 4)
    assert long_["tpot_s"] > short["tpot_s"]
    assert _single(128, 64, 8)["tpot_s"] < short["tpot_s"] < _single(128, 64, 2)["tpot_s"]


def test_ring_allreduce_matches_the_alpha_beta_formula_on_the_graph():
    node = load_node("dgx-h100")
    g = build_graph(node, 2)
    paths = Paths(g)
    group = tuple(f"gpu{i}" for i in range(8))
    cost = ring_allreduce(paths, group)
    a = 2 * 0.4e-6  # GPU -> NVSwitch -> GPU
    s = 64 * 2**20
    expect = LAUNCH_S + 2 * 7 * a + 2 * 7 / 8 * s / (450e9 * BANDWIDTH_EFFICIENCY)
    assert cost.time(s) == pytest.approx(expect, rel=1e-12)
    # Measured on H100 (calibration/nccl.csv): 8 KiB over 8 GPUs, 16.4 us.
    assert cost.time(8192) == pytest.approx(16.4e-6, rel=0.1)
    # A group across nodes is limited by the 50 GB/s NICs: one ring channel per rail (2
    # here), or hierarchical (NVLink inside each node, S/2 per rail across), the faster.
    cross = ring_allreduce(paths, tuple(f"gpu{i}" for i in (0, 1, 8, 9)))
    nic, nv = 50e9 * BANDWIDTH_EFFICIENCY, 450e9 * BANDWIDTH_EFFICIENCY
    assert cross.beta == pytest.approx(min(2 * 3 / 4 / (2 * nic), 1 / nv + 0.5 / nic))
    assert cross.time(s) > 3 * ring_allreduce(paths, group[:4]).time(s)


def test_placement_keeps_tp_in_a_node_and_spreads_replicas():
    domains = nvlink_domains(build_graph(load_node("dgx-h100"), 2))
    assert [len(d) for d in domains] == [8, 8]
    reps = place(domains, tp=4, pp=1, dp=4)
    nodes = [int(r.stages[0][0][3:]) // 8 for r in reps]
    assert nodes == [0, 1, 0, 1]  # round-robin over nodes by free GPUs
    pp = place(domains, tp=8, pp=2, dp=1)[0]
    assert pp.stages[0] == tuple(f"gpu{i}" for i in range(8))
    assert pp.stages[1] == tuple(f"gpu{i}" for i in range(8, 16))
    with pytest.raises(simulator.ScenarioError, match="NVLink domain"):
        place(domains, tp=12, pp=1, dp=1)  # larger than a domain: whole domains only


def test_kv_bytes_and_dtype_effects():
    m = load_model("llama-3.1-70b")
    assert m.kv_bytes_per_token(2) == 327_680  # 320 KiB per token in 16-bit (REFERENCE.md)
    assert m.kv_bytes_per_token(1) == 163_840
    bf16 = weight_bytes_per_gpu(m, 8, m.layers, True, True, "bf16")
    fp8 = weight_bytes_per_gpu(m, 8, m.layers, True, True, "fp8")
    embed = 2 * m.vocab * m.hidden / 8 * 2  # embeddings and LM head stay 16-bit
    assert (fp8 - embed) == pytest.approx((bf16 - embed) / 2, rel=0.01)
    args = dict(model=m, gpu_memory_bytes=H100.memory_bytes, tp=4, pp=1, weight_dtype="bf16",
                block_size=16, utilization=0.9, max_tokens=8192, max_seqs=256,
                reserve_bytes=2**30)
    kv16 = plan_memory(kv_dtype="bf16", **args).kv_blocks
    kv8 = plan_memory(kv_dtype="fp8", **args).kv_blocks
    assert kv8 in (2 * kv16, 2 * kv16 + 1)


def _pipeline_scenario(tmp_path, pp: int, streams: int, n: int) -> dict:
    cfg = json.loads((DATA / "toy_model.json").read_text())
    cfg["num_hidden_layers"] = 4 * pp
    (tmp_path / "model.json").write_text(json.dumps(cfg))
    node = (DATA / "toy_node.toml").read_text().replace("gpus_per_node = 2", "gpus_per_node = 8")
    node = node.replace('gpu = "toy_gpu.toml"', f'gpu = "{DATA / "toy_gpu.toml"}"')
    (tmp_path / "node.toml").write_text(node)
    rows = "\n".join("0.0,2000,1" for _ in range(n))
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n" + rows + "\n")
    return toy_scenario(
        model={"name": str(tmp_path / "model.json")},
        cluster={"topology": str(tmp_path / "node.toml")},
        parallel={"pp": pp},
        engine={"max_inflight_microbatches": streams, "step_overhead_s": 0.0,
                "max_num_batched_tokens": 2048},
        workload={"arrival": "trace", "trace": str(tmp_path / "t.csv"), "rate_per_s": None,
                  "num_requests": None})


@pytest.mark.parametrize("pp", [2, 4])
def test_one_microbatch_in_flight_idles_all_but_one_stage(tmp_path, pp):
    res = simulator.run(_pipeline_scenario(tmp_path, pp, streams=1, n=3))
    assert res.summary["pp_bubble_fraction"] == pytest.approx((pp - 1) / pp, rel=1e-9)


@pytest.mark.parametrize("pp,m", [(2, 2), (4, 4), (4, 2), (2, 6)])
def test_equal_microbatches_follow_the_gpipe_bubble(tmp_path, pp, m):
    """M equal micro-batches through P stages: bubble = (P-1)/(M+P-1) of the busy span."""
    res = simulator.run(_pipeline_scenario(tmp_path, pp, streams=m, n=m))
    expect = (pp - 1) / (m + pp - 1)
    # The streaming totals give the bubble that the step table's intervals give.
    assert res.summary["pp_bubble_fraction"] == pytest.approx(bubble_fraction(res.steps, pp),
                                                              rel=1e-6)
    # Stage 0 embeds and the last stage runs the LM head, and hand-offs take ~1% of a stage:
    # the stages are equal to about 2%.
    assert res.summary["pp_bubble_fraction"] == pytest.approx(expect, abs=0.02)
    steps = res.steps
    assert (steps.groupby("stage").size() == m).all()
    # Micro-batches overlap: stage 1 starts its first while stage 0 runs its second.
    s0 = steps[steps.stage == 0].sort_values("start_s")
    s1 = steps[steps.stage == 1].sort_values("start_s")
    assert s1["start_s"].iloc[0] < s0["end_s"].iloc[1]


def test_stage_work_counts_every_parameter_twice_per_token_and_the_ring_bytes():
    """A dense stage's own work (what GPU utilization sums): per token 2 FLOPs per linear
    parameter on the GPU (plus 4 * heads * d per attention pair), the LM head over the
    sampled rows on the last stage, and two ring all-reduces of ``T * h * 2`` bytes per
    layer, each sending ``2(n-1)/n`` of them per GPU; no NIC bytes of its own."""
    m = load_model("llama-3.1-8b")
    sc = {"name": "w", "model": {"name": "llama-3.1-8b"}, "cluster": {"topology": "dgx-h100"},
          "parallel": {"tp": 2}, "workload": {"arrival": "constant", "rate_per_s": 1.0,
                                              "num_requests": 1}}
    cost = simulator.build_plan(simulator.load_scenario(sc)).replicas[0].stages[0]
    tokens, pairs = np.array([64.0, 8.0]), np.array([64 * 65 / 2, 0.0])
    kv, sampled = np.array([0.0, 8 * 500.0]), np.array([1.0, 8.0])
    flops, hbm, nvlink, nic = cost.work(tokens, pairs, np.zeros(2), kv, sampled)
    tp, h, d = 2, m.hidden, m.head_dim
    linear = m.layers * (m.attn_params_per_layer + m.mlp_params_per_layer) / tp
    attn = m.layers * 4 * (m.q_heads // tp) * d * (pairs + kv)
    head = 2 * sampled * (m.vocab // tp) * h
    assert flops == pytest.approx(2 * linear * tokens + attn + head, rel=1e-6)
    assert nvlink == pytest.approx(2 * m.layers * 2 * (tp - 1) / tp * tokens * h * 2)
    assert (nic == 0).all() and (hbm > 0).all()
    # What the link metrics lay on the graph: T * h * 2 per message, two per layer.
    assert cost.message_bytes(64) == 64 * h * 2
    assert cost.allreduce_bytes(64) == 2 * m.layers * 64 * h * 2
    assert nvlink[0] == pytest.approx(2 * (tp - 1) / tp * cost.allreduce_bytes(64))
