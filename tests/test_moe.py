"""Mixture-of-experts and MLA models: parameters, KV size, memory fit, routing, all-to-all
bytes, step cost invariants, fast-forward identity, and dense results unchanged."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from simulator import run
from simulator.calibration import moe_forms
from simulator.cli import main
from simulator.cluster.pools import build_plan
from simulator.default_scenario import DEFAULT_SCENARIO
from simulator.errors import ScenarioError
from simulator.io.scenario import load_scenario, to_dict
from simulator.model.moe_cost import dispatch_bytes_per_peer, kernel_dtype
from simulator.model.moe_stage import MoETable
from simulator.model.routing import Routing, imbalance, placement, popularity, step_index
from simulator.model.spec import from_config, load_model


@pytest.mark.parametrize("name, total, active", [
    ("deepseek-v3", 671e9, 37e9), ("qwen3-235b-a22b", 235e9, 22e9),
    ("mixtral-8x7b", 46.7e9, 12.9e9)])
def test_parameter_counts_match_published(name, total, active):
    m = load_model(name)
    assert m.total_params == pytest.approx(total, rel=0.005)
    # Published active counts are rounded down to the billion (DeepSeek: 37.6 -> 37).
    assert m.active_params == pytest.approx(active, rel=0.02)


def test_mla_kv_per_token_is_latent_plus_rope():
    ds = load_model("deepseek-v3")
    assert ds.kv_bytes_per_token(2) == (512 + 64) * 61 * 2 == 70272  # 70 KB in BF16
    assert ds.kv_bytes_per_token(2, tp=8) == 70272  # no heads: replicated under TP
    assert load_model("llama-3.1-70b").kv_bytes_per_token(2) == 2 * 80 * 8 * 128 * 2


def test_layer_patterns():
    assert load_model("deepseek-v3").moe.layers == tuple(range(3, 61))
    assert load_model("llama-4-maverick").moe.layers == tuple(range(1, 48, 2))
    assert len(load_model("qwen3-30b-a3b").moe.layers) == 48
    oss = load_model("gpt-oss-120b")
    assert oss.moe.expert_dtype == "fp4" and oss.window_layers == tuple(range(0, 36, 2))


def test_validate_reports_moe_and_mla(tmp_path, capsys):
    f = tmp_path / "ds.toml"
    f.write_text('[model]\nname = "deepseek-v3"\nweight_dtype = "fp8"\n'
                 '[cluster]\ntopology = "hgx-h200"\n[parallel]\ntp = 8\nep = 8\n'
                 '[workload]\nrate_per_s = 1.0\nnum_requests = 4\n')
    assert main(["validate", str(f)]) == 0
    out = capsys.readouterr().out
    assert "671.0 B params (37.6 B active)" in out and "256 experts" in out and "MLA" in out


@pytest.mark.parametrize("field, value", [("num_attention_heads", 0), ("hidden_size", -1),
                                          ("num_hidden_layers", "x"), ("vocab_size", 1.5)])
def test_bad_numeric_field_is_named(field, value):
    config = json.loads((load_model.__globals__["MODEL_CONFIGS"] / "qwen3-32b.json")
                        .read_text())
    config[field] = value
    with pytest.raises(ScenarioError, match=field):
        from_config(config, "x")


def test_unsupported_quantization_is_named():
    config = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
              "intermediate_size": 128, "vocab_size": 100,
              "quantization_config": {"quant_method": "awq"}}
    with pytest.raises(ScenarioError, match="quant_method"):
        from_config(config, "x")


@pytest.mark.parametrize("name", ["../x", "../configs/qwen3-32b", "configs/../llama-2-7b"])
def test_catalog_name_cannot_escape(name, tmp_path):
    with pytest.raises(ScenarioError, match="model.name"):
        load_model(name, tmp_path)


def _ds(topology, **parallel):
    return {"model": {"name": "deepseek-v3", "weight_dtype": "fp8"},
            "cluster": {"topology": topology},
            "parallel": {"tp": 8, "ep": 8, **parallel},
            "workload": {"rate_per_s": 1.0, "num_requests": 4}}


def test_deepseek_fp8_fits_h200_not_h100():
    with pytest.raises(ScenarioError, match=r"short by \d+\.\d GiB"):
        build_plan(load_scenario(_ds("dgx-h100")))
    plan = build_plan(load_scenario(_ds("hgx-h200")))
    assert plan.memory.kv_blocks > 0


def test_attention_dp_multiplies_mla_cache():
    tp_plan = build_plan(load_scenario(_ds("hgx-h200")))
    dp_plan = build_plan(load_scenario(_ds("hgx-h200", attention_dp=True)))
    # Under TP every rank holds every request's latent; under DP each rank its own.
    assert dp_plan.memory.kv_tokens > 4 * tp_plan.memory.kv_tokens


def test_all_to_all_bytes_by_hand():
    # 8 uniform experts on 2 ranks, top-2: a token hits a rank with 1 - (1/2)^2 = 3/4.
    r = Routing.build(popularity(8), 2, 0, 2, seed=0)
    h, b, t = 1000, 2, 10
    assert dispatch_bytes_per_peer(t, r, h, b, "normal") == pytest.approx(
        t * 2 * 0.75 / 2 * h * b)
    # low_latency: one slot per (token, expert): k/2 of the k copies go to the peer.
    assert dispatch_bytes_per_peer(t, r, h, b, "low_latency") == pytest.approx(t * 1 * h * b)


@pytest.mark.parametrize("redundant", [0, 16])
def test_tokens_conserved_through_dispatch_and_combine(redundant):
    p = popularity(64, "zipf", 1.2, seed=3)
    r = Routing.build(p, 8, redundant, 4, seed=1)
    np.testing.assert_allclose(r.share.sum(axis=0), 1.0)  # each expert's tokens all handled
    loads = r.rank_loads(300)
    np.testing.assert_allclose(loads.sum(axis=1), 300 * 4)  # T k routed tokens per step
    assert (r.share > 0).sum() == 64 + redundant


def test_redundant_experts_lower_zipf_imbalance():
    p = popularity(256, "zipf", 1.2, seed=1)
    plain = imbalance(Routing.build(p, 16, 0, 8, 0).rank_loads(512)).mean()
    eplb = imbalance(Routing.build(p, 16, 32, 8, 0).rank_loads(512)).mean()
    uniform = imbalance(Routing.build(popularity(256), 16, 0, 8, 0).rank_loads(512)).mean()
    assert eplb < 1.2 < 2 * uniform < plain  # EPLB packs even better than blocks
    assert placement(popularity(8), 2)[0].tolist() == [1, 1, 1, 1, 0, 0, 0, 0]


def _qwen(**routing_parallel):
    routing = routing_parallel.pop("routing", None)
    model = {"name": "qwen3-30b-a3b", **({"routing": routing} if routing else {})}
    return load_scenario({"model": model, "cluster": {"topology": "dgx-h100"},
                          "parallel": {"tp": 8, "ep": 8, "attention_dp": True,
                                       **routing_parallel},
                          # the GPU's step: no host floor above it at 4096 sequences
                          "engine": {"host_seq_s": 0.0},
                          "workload": {"rate_per_s": 1.0, "num_requests": 4}})


def _decode_time(s, n=512, kv=512 * 1000):
    return build_plan(s).replicas[0].stages[0].step(n, 0.0, 0, kv, n)[0]


def test_skew_raises_step_time_and_redundancy_lowers_it():
    # A large batch, where expert compute follows the hottest rank's tokens (in small
    # decode batches weight reads dominate and extra replicas cost their reads).
    zipf = {"distribution": "zipf", "skew": 1.2}
    n, kv = 4096, 4096 * 1000
    uniform = _decode_time(_qwen(), n, kv)
    skewed = _decode_time(_qwen(routing=zipf), n, kv)
    eplb = _decode_time(_qwen(routing=zipf, redundant_experts=16), n, kv)
    assert eplb < skewed and uniform < skewed
    assert skewed > 1.15 * uniform


def test_step_never_beats_roofline():
    s = _qwen()
    plan = build_plan(s)
    cost, m, gpu = plan.replicas[0].stages[0], plan.model, plan.node.gpu
    for n in (1, 64, 512, 4096):
        t = cost.step(n, 0.0, 0, n * 2000, n)[0]
        # The busiest rank runs at least T k / ep routed tokens through 3 h I_e weights,
        # and reads at least its attention weights every layer.
        flops = 2 * n * m.moe.top_k / 8 * m.moe.expert_params(m.hidden) * m.layers
        assert t >= flops / gpu.peak("bf16")
        assert t >= cost.attn_param_bytes * 2 * m.layers / gpu.hbm_bandwidth_Bps


def test_fast_forward_matches_steps_exactly():
    cost = build_plan(_qwen(routing={"distribution": "zipf", "skew": 1.2})
                      ).replicas[0].stages[0]
    n, kv0, k = 37, 12345, 50
    run_times, comm = cost.decode_run(n, kv0, k)
    kv = kv0 + n * np.arange(1, k + 1)
    vec, comm2 = cost.decode_steps(n, kv)
    steps = [cost.step(n, 0.0, 0, int(x), n) for x in kv]
    assert run_times == [c for c, _ in steps] == vec.tolist()
    assert comm == comm2 == steps[0][1]
    assert len(set(run_times)) > 1  # routing draws differ from step to step


def test_moe_run_records_columns_and_summary():
    s = _qwen()
    result = run(load_scenario({**to_dict(s), "workload": {
        "arrival": "constant", "rate_per_s": 20.0, "num_requests": 20, "prompt_tokens": 256,
        "output_tokens": 32}}))
    steps = result.steps
    assert {"a2a_s", "imbalance"} <= set(steps.columns)
    assert (steps["imbalance"] >= 1).all() and (steps["a2a_s"] > 0).all()
    assert (steps["a2a_s"] < steps["compute_s"]).all()  # a part of the step's time
    assert 0 < result.summary["moe_a2a_share"] < 1
    assert result.summary["moe_imbalance_mean"] >= 1
    # GPU utilization from the MoE stage's own work: within capacity; the all-to-all of
    # one node runs on NVLink only.
    gpu = result.gpu_timeseries
    for col in ("compute_util", "hbm_util", "nvlink_util"):
        assert gpu[col].between(0, 1).all() and gpu[col].max() > 0
    assert (gpu["nic_util"] == 0).all()


def test_dense_default_scenario_summary_unchanged():
    """Summary of the default scenario before MoE support (commit a270df2), with
    ``profile = "none"``: the engine the default scenario ran on before vllm-v1 became the
    default profile. The p99 figures come from ``python -m simulator run`` (no argument)
    at commit ff5a9c1, the last one before the flip; the others were already asserted."""
    sc = {**DEFAULT_SCENARIO, "engine": {**DEFAULT_SCENARIO["engine"], "profile": "none"}}
    s = run(sc).summary
    assert s["ttft_p99_s"] == 0.2444335765764117
    assert s["tpot_p99_s"] == 0.024421923513356078
    assert s["steps_total"] == 92731
    assert s["simpy_events"] == 622781
    assert s["kv_blocks_per_replica"] == 87240
    assert s["simulated_time_s"] == 502.13316810224205
    assert s["ttft_mean_s"] == 0.08811389230098575
    assert s["tpot_mean_s"] == 0.02156514890491717
    assert s["throughput_tok_per_s"] == 1006.3105718016772
    assert "moe_a2a_share" not in s


def test_ep_needs_moe_model():
    with pytest.raises(ScenarioError, match="parallel.ep"):
        build_plan(load_scenario({"model": {"name": "llama-3.1-8b"},
                                  "parallel": {"tp": 2, "ep": 2},
                                  "workload": {"rate_per_s": 1.0, "num_requests": 4}}))


def test_two_batch_overlap_hides_all_to_all():
    # EP16 over two H200 nodes: the all-to-all crosses the NICs.
    base = _ds("hgx-h200", attention_dp=True)
    base["parallel"].update(tp=16, ep=16)
    base["cluster"]["nodes"] = 2
    plain = build_plan(load_scenario(base)).replicas[0].stages[0]
    tbo = build_plan(load_scenario({**base, "model": {**base["model"],
                                                      "two_batch_overlap": True}})
                     ).replicas[0].stages[0]
    tokens, pairs = 8192, 8 * 1024 * 1025 / 2  # eight 1024-token prompts
    t_plain, t_tbo = plain.step(tokens, pairs, 0, 0, 8)[0], tbo.step(tokens, pairs, 0, 0, 8)[0]
    a2a = plain.moe_columns(np.array([tokens]), np.array([pairs]), np.array([0]))[0][0]
    assert 0 < a2a < t_plain
    assert t_tbo < t_plain  # the all-to-all hides under the other half's compute
    assert t_tbo >= t_plain - a2a  # but splitting the batch saves no compute
    # Small decode batches: two halves read every expert's weights twice.
    assert tbo.step(256, 0.0, 0, 256 * 2000, 256)[0] > plain.step(256, 0.0, 0, 256 * 2000,
                                                                  256)[0]
    with pytest.raises(ScenarioError, match="two_batch_overlap"):
        build_plan(load_scenario({**_ds("hgx-h200"), "model": {**base["model"],
                                                              "two_batch_overlap": True}}))


def test_bad_routing_keys_exit_2(tmp_path, capsys):
    f = tmp_path / "bad.toml"
    f.write_text('[model]\nname = "qwen3-30b-a3b"\n[model.routing]\ndistribution = "pareto"\n'
                 'skew = -1\nwieghts_file = "w.txt"\n[workload]\nrate_per_s = 1.0\n'
                 'num_requests = 4\n')
    assert main(["validate", str(f)]) == 2
    err = capsys.readouterr().err
    assert "model.routing.distribution" in err and "model.routing.skew" in err
    assert "did you mean 'weights_file'" in err


def test_weights_file_routing(tmp_path):
    w = tmp_path / "w.txt"
    w.write_text("\n".join(["10"] + ["1"] * 127))
    s = _qwen(routing={"weights_file": str(w)})
    cost = build_plan(s).replicas[0].stages[0]
    assert cost.routing.p[0] == pytest.approx(10 / 137)
    w.write_text("1 2 3")
    with pytest.raises(ScenarioError, match="weights_file"):
        build_plan(_qwen(routing={"weights_file": str(w)}))


def test_sliding_window_layers_read_at_most_the_window():
    s = load_scenario({"model": {"name": "gpt-oss-20b"}, "cluster": {"topology": "dgx-h100"},
                       "workload": {"rate_per_s": 1.0, "num_requests": 4}})
    cost = build_plan(s).replicas[0].stages[0]
    assert cost.n_window == 12 and cost.window == 128
    n = 16
    # The experts' time varies with each step's routing draw: hold it at one draw's value
    # so that only the attention reads differ between the steps compared.
    tab = cost.table(n, "low_latency")
    cost._tables[(n, "low_latency")] = MoETable(np.full_like(tab.expert_s, tab.expert_s[0]),
                                                tab.a2a_s, tab.imbalance)
    short = cost.step(n, 0.0, 0, n * 100, n)[0]  # contexts inside the window
    long = cost.step(n, 0.0, 0, n * 50_000, n)[0]
    # Past the window only the 12 full-attention layers read more: the growth is that of
    # the full layers alone, so doubling the context adds the same again.
    longer = cost.step(n, 0.0, 0, n * 100_000, n)[0]
    assert short < long < longer
    full = copy.copy(cost)
    full.n_window = 0  # the same stage with every layer reading its whole context
    grow_full = full.step(n, 0.0, 0, n * 100_000, n)[0] - full.step(n, 0.0, 0, n * 50_000,
                                                                     n)[0]
    assert longer - long == pytest.approx(grow_full * 12 / 24, rel=1e-6)
    # MXFP4 experts run weight-only 4-bit on H100 (no fp4 tensor cores).
    assert cost.layout.expert_dtype == "int4"


@pytest.mark.parametrize("topology, nodes, tp, intra_only", [
    ("hgx-h200", 1, 8, True), ("hgx-h200", 2, 16, False), ("gb200-nvl72", 1, 72, True)])
def test_all_to_all_on_graph_paths(topology, nodes, tp, intra_only):
    s = load_scenario({"model": {"name": "deepseek-v3", "weight_dtype": "fp8"},
                       "cluster": {"topology": topology, "nodes": nodes},
                       "parallel": {"tp": tp, "ep": tp, "attention_dp": True},
                       "workload": {"rate_per_s": 1.0, "num_requests": 2}})
    p = build_plan(s).replicas[0].stages[0].paths
    assert p.ranks == tp and (p.inter_s_per_byte == 0) == intra_only
    assert p.intra_peers == (tp - 1 if intra_only else 7)
    # With a non-blocking fabric and one NIC per GPU, the fluid model of all ranks sending
    # at once equals one rank's serialized sends over its own links (NVLink and NIC in
    # parallel): the GPU's ports are the only bottleneck.
    assert p.s_per_byte == pytest.approx(max(p.intra_s_per_byte, p.inter_s_per_byte))


def test_oversubscribed_fabric_slows_cross_node_all_to_all():
    def paths(over):
        s = load_scenario({"model": {"name": "deepseek-v3", "weight_dtype": "fp8"},
                           "cluster": {"topology": "hgx-h200", "nodes": 2,
                                       "fabric": "leaf_spine", "oversubscription": over,
                                       "rail_optimized": False},
                           "parallel": {"tp": 16, "ep": 16, "attention_dp": True},
                           "workload": {"rate_per_s": 1.0, "num_requests": 2}})
        return build_plan(s).replicas[0].stages[0].paths
    assert paths(4.0).s_per_byte > paths(1.0).s_per_byte


def test_moe_run_fast_forward_equals_stepping():
    base = to_dict(_qwen(routing={"distribution": "zipf", "skew": 1.2}))
    base["workload"] = {"arrival": "poisson", "rate_per_s": 10.0, "num_requests": 30,
                        "prompt_tokens": 200, "output_tokens": 60}
    fast = run(load_scenario({**base, "engine": {**base["engine"], "fast_forward": True}}))
    slow = run(load_scenario({**base, "engine": {**base["engine"], "fast_forward": False}}))
    cols = ["replica", "stage", "start_s", "end_s", "compute_s", "comm_s", "a2a_s",
            "imbalance", "decode_kv"]
    assert fast.steps[cols].equals(slow.steps[cols])
    assert fast.requests.equals(slow.requests)
    assert fast.steps["imbalance"].nunique() > 10  # the draws vary step to step


# -- the calibrated forms in the step -------------------------------------------------------

def _dsv3(**parallel):
    par = {"tp": 16, "ep": 16, "attention_dp": True, **parallel}
    return build_plan(load_scenario({
        "model": {"name": "deepseek-v3", "weight_dtype": "fp8"},
        "cluster": {"topology": "hgx-h200", "nodes": 2}, "parallel": par,
        "workload": {"rate_per_s": 1.0, "num_requests": 2}}))


def test_local_counts_are_whole_rows_of_each_ranks_experts():
    # 8 uniform experts on 2 ranks (experts 0-3 on rank 0, 4-7 on rank 1), top-2.
    r = Routing.build(popularity(8), 2, 0, 2, seed=0)
    counts = r.expert_counts(5)
    local = r.local_counts(5)
    assert local.shape == (1024, 2, 4)
    np.testing.assert_array_equal(local[:, 0], counts[:, :4])
    np.testing.assert_array_equal(local[:, 1], counts[:, 4:])
    assert np.all(counts == np.round(counts))
    # Poisson(5 * 2 / 8) rows per expert: the share of empty experts is exp(-1.25).
    assert (counts == 0).mean() == pytest.approx(np.exp(-1.25), abs=0.02)
    assert counts.sum(axis=1).mean() == pytest.approx(10, rel=0.02)


def test_step_expert_time_is_the_calibrated_form_of_the_slowest_rank():
    plan = build_plan(_qwen())
    cost, m, gpu = plan.replicas[0].stages[0], plan.model, plan.node.gpu
    assert cost.layout.ep == 8 and cost.layout.expert_dtype == "bf16"
    n = 48
    tab = cost.table(n, "low_latency")
    local = cost.routing.local_counts(n)  # (draws, 8 ranks, 16 experts)
    for row in (0, 17, 1023):
        by_rank = [moe_forms.expert_time(local[row, r], m.hidden, m.moe.intermediate, "bf16",
                                         gpu, gated=True, ep=8) for r in range(8)]
        assert tab.expert_s[row] == pytest.approx(max(by_rank), rel=1e-12)
        roof = max(float(moe_forms.expert_roofline(local[row, r], m.hidden,
                                                   m.moe.intermediate, "bf16", gpu))
                   for r in range(8))
        assert tab.expert_s[row] >= roof


def test_moe_kernel_dtypes():
    ds = load_model("deepseek-v3")
    assert kernel_dtype(ds, "fp8") == "fp8_block" and kernel_dtype(ds, "bf16") == "bf16"
    assert kernel_dtype(load_model("qwen3-235b-a22b"), "fp8") == "fp8"
    assert kernel_dtype(ds, "fp4") == "w4a16_mxfp4" and kernel_dtype(ds, "int4") == "int4_wo"
    assert _dsv3().replicas[0].stages[0].layout.expert_dtype == "fp8"


def test_mla_decode_is_the_calibrated_module():
    plan = _dsv3()
    cost, m, gpu = plan.replicas[0].stages[0], plan.model, plan.node.gpu
    n, kv = 64, 64 * 3000
    step = cost.step(n, 0.0, 0, kv, n)[0]
    nr, kvr = n // 16, kv / 16  # attention DP: each rank its own sequences, all 128 heads
    mla = moe_forms.mla_decode_time(gpu, 128, nr, kvr, "bf16", "fp8_block")
    idx = step_index(kv)
    tab = cost.table(n, "low_latency")
    by_hand = (cost._fixed_time(n)[0] + m.layers * mla
               + cost.n_moe * (tab.expert_s[idx] + tab.a2a_s[idx]) + cost.head_time(n)[0])
    assert step == pytest.approx(by_hand, rel=1e-12)
    assert mla >= moe_forms.mla_roofline(gpu, 128, nr, nr, kvr - nr, "bf16", "fp8_block",
                                         True)


def test_all_to_all_inside_a_node_beats_across_nodes_and_never_the_roofline():
    per_rank = 32  # tokens each rank sends
    cross = _dsv3().replicas[0].stages[0]
    intra = _dsv3(tp=8, ep=8, dp=2).replicas[0].stages[0]
    m = load_model("deepseek-v3")
    for mode in ("low_latency", "normal"):
        a_cross = cross.table(16 * per_rank, mode)
        a_intra = intra.table(8 * per_rank, mode)
        assert a_intra.a2a_s.mean() < a_cross.a2a_s.mean()
        # Dispatch (FP8 on the wire) and combine (16-bit): the link bandwidths of the
        # topology file (NVLink 450 GB/s, NIC 50 GB/s per GPU), no latency at all.
        for tab, ep, rpn in ((a_intra, 8, None), (a_cross, 16, 8)):
            roof = sum(float(moe_forms.a2a_roofline(
                mode, per_rank, m.hidden, m.moe.top_k, m.moe.experts, ep,
                50e9 if rpn else 450e9, b, rpn, 450e9)) for b in (1.0, 2.0))
            assert tab.a2a_s.min() >= roof


def test_zipf_skew_slows_the_experts_and_redundancy_recovers():
    n = 2048
    uniform = build_plan(_qwen()).replicas[0].stages[0].table(n, "normal").expert_s
    zipf = {"distribution": "zipf", "skew": 1.2}
    skewed = build_plan(_qwen(routing=zipf)).replicas[0].stages[0].table(n, "normal").expert_s
    eplb = build_plan(_qwen(routing=zipf, redundant_experts=16)
                      ).replicas[0].stages[0].table(n, "normal").expert_s
    assert uniform.mean() < eplb.mean() < skewed.mean()


def test_table_rows_do_not_depend_on_which_rows_are_priced_together():
    # Rows are filled when first needed; a row priced alone has the bits of a full table.
    plans = [build_plan(_qwen(routing={"distribution": "zipf", "skew": 1.2},
                              redundant_experts=24)) for _ in range(2)]
    lazy, full = (p.replicas[0].stages[0] for p in plans)
    rows = np.array([5, 700, 3])
    part = lazy.table(300, "normal", rows)
    assert np.isnan(part.expert_s).sum() == part.expert_s.size - 3
    whole = full.table(300, "normal")
    for name in ("expert_s", "a2a_s", "imbalance"):
        np.testing.assert_array_equal(getattr(part, name)[rows], getattr(whole, name)[rows])


def test_verification_steps_use_the_low_latency_all_to_all():
    # A step whose every token is sampled (MTP / draft verification: prefill pairs over the
    # cached KV, no prompt chunk) is a decode batch for DeepEP; a prompt chunk is not.
    cost = _dsv3().replicas[0].stages[0]
    tokens, pairs, ctx = 64, 64 * 3000, 32 * 3000
    verify = cost.step(tokens, pairs, ctx, 0, tokens)[0]
    chunk = cost.step(tokens, pairs, ctx, 0, tokens - 1)[0]
    idx = step_index(cost._key(tokens, pairs, 0))
    low, normal = cost.table(tokens, "low_latency", idx), cost.table(tokens, "normal", idx)
    assert normal.a2a_s[idx] > low.a2a_s[idx]
    assert chunk - verify > 0.5 * cost.n_moe * (normal.a2a_s[idx] - low.a2a_s[idx])
    a2a, _ = cost.moe_columns(np.array([tokens, tokens]), np.array([pairs, pairs]),
                              np.array([0, 0]), np.array([tokens, tokens - 1]))
    assert a2a[0] == cost.n_moe * low.a2a_s[idx] and a2a[1] == cost.n_moe * normal.a2a_s[idx]
