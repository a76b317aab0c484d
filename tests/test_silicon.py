"""Measured rows as scenarios (simulator/io/silicon.py), on hand-written rows: each layout
spelling, worker counts, the closed loop, lengths, KV precision and every refusal."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import simulator
from simulator.calibration import engines
from simulator.hardware.specs import load_gpu
from simulator.io.silicon import agg_scenario, disagg_scenario, layout, scenario
from simulator.model.moe_cost import expert_time, mla_decode
from simulator.model.spec import load_model

NAN = math.nan
REPO = Path(__file__).resolve().parent.parent


def _moe(**kw) -> dict:
    row = {"model_path": "deepseek-ai/DeepSeek-V3", "system": "h200_sxm", "backend": "trtllm",
           "mode": "agg", "gemm_quant_mode": "fp8", "moe_quant_mode": "fp8", "isl": 1024,
           "osl": 256, "batch_size": NAN, "concurrency": 16.0, "tp_size": 8.0,
           "pp_size": 1.0, "attention_dp_size": 1.0, "moe_tp_size": 1.0, "moe_ep_size": 8.0}
    row.update(kw)
    return row


def _disagg(**kw) -> dict:
    row = _moe(mode="disagg", tp_size=NAN, pp_size=NAN, attention_dp_size=NAN,
               moe_tp_size=NAN, moe_ep_size=NAN, isl=8192, osl=1024, concurrency=96.0,
               prefill_batch_size=1.0, prefill_num_workers=2.0, prefill_tp_size=8.0,
               prefill_pp_size=1.0, prefill_attention_dp_size=1.0, prefill_moe_tp_size=1.0,
               prefill_moe_ep_size=8.0, decode_batch_size=4.0, decode_num_workers=3.0,
               decode_tp_size=1.0, decode_pp_size=1.0, decode_attention_dp_size=8.0,
               decode_moe_tp_size=1.0, decode_moe_ep_size=8.0)
    row.update(kw)
    return row


@pytest.mark.parametrize("cols, want", [
    # attention TP8, EP8
    ((8, 1, 1, 8), {"tp": 8, "pp": 1, "dp": 1, "ep": 8}),
    # attention TP8, MoE-TP8
    ((8, 1, 8, 1), {"tp": 8, "pp": 1, "dp": 1, "ep": 1}),
    # attention DP8, EP8 (one engine of 8 GPUs)
    ((1, 8, 1, 8), {"tp": 8, "pp": 1, "dp": 1, "ep": 8, "attention_dp": True}),
    # attention DP8 over TP-sliced experts
    ((1, 8, 8, 1), {"tp": 8, "pp": 1, "dp": 1, "ep": 1, "attention_dp": True}),
    # attention TP2 in each of 4 DP groups, EP8
    ((2, 4, 1, 8), {"tp": 8, "pp": 1, "dp": 1, "ep": 8, "attention_dp": True,
                    "attention_tp": 2}),
    # attention TP16 with MoE-TP4 x EP4
    ((16, 1, 4, 4), {"tp": 16, "pp": 1, "dp": 1, "ep": 4}),
])
def test_the_layout_columns_in_the_simulators_spelling(cols, want):
    tp, dp, etp, ep = cols
    row = _moe(tp_size=float(tp), attention_dp_size=float(dp), moe_tp_size=float(etp),
               moe_ep_size=float(ep))
    assert layout(row, moe=True) == (want, "")


def test_a_moe_group_that_does_not_cover_the_engine_is_refused_with_the_columns():
    par, why = layout(_moe(tp_size=1.0, attention_dp_size=8.0, moe_tp_size=2.0,
                           moe_ep_size=2.0), moe=True)
    assert par is None
    assert why == ("moe_tp_size x moe_ep_size = 2 x 2 is not the engine's 1 x 8 GPUs "
                   "(tp_size x attention_dp_size)")


def test_attention_dp_on_a_dense_model_is_refused():
    row = {"model_path": "Qwen/Qwen3-32B", "system": "h100_sxm", "backend": "vllm",
           "gemm_quant_mode": "", "isl": 512, "osl": 64, "batch_size": 4.0, "tp_size": 2.0,
           "pp_size": 1.0, "attention_dp_size": 2.0}
    assert scenario(row) == (None, "attention_dp_size 2: attention DP on a dense model")


def test_an_aggregated_dense_row():
    row = {"model_path": "Qwen/Qwen3-32B", "system": "h100_sxm", "backend": "vllm",
           "precision": NAN, "gemm_quant_mode": NAN, "isl": 4096.0, "osl": 128.0,
           "batch_size": 32.0, "tp_size": 4.0, "pp_size": 1.0}
    s, why = scenario(row)
    assert why == ""
    assert s["name"] == "qwen3-32b-h100_sxm-vllm-4096x128-c32"
    assert s["model"] == {"name": "qwen3-32b", "weight_dtype": "bf16"}  # 16-bit KV
    assert s["parallel"] == {"tp": 4, "pp": 1, "dp": 1}
    assert s["cluster"] == {"topology": "dgx-h100", "nodes": 1}
    # AIConfigurator's generator: max-num-seqs = batch size, max-num-batched-tokens =
    # batch size + ISL + 1500
    assert s["engine"] == {"profile": "vllm-v1", "max_num_seqs": 32,
                           "max_num_batched_tokens": 32 + 4096 + 1500}
    # no concurrency column: the batch size is the client's concurrency; AIPerf as
    # AIConfigurator runs it: 20 x C measured requests after C warm-ups
    assert s["workload"] == {"arrival": "closed_loop", "client": "aiperf", "concurrency": 32,
                             "warmup_requests": 32, "num_requests": 640,
                             "prompt_tokens": 4096, "output_tokens": 128}
    simulator.load_scenario(s)


@pytest.mark.parametrize("backend, budget", [
    ("vllm", 24 + 1000 + 1500),  # max-num-batched-tokens: batch size + ISL + 1500
    ("sglang", 1000 + 1500),  # max-prefill-tokens: ISL + 1500, decodes mixed in
    ("trtllm", 2528),  # max_num_tokens: 24 + 1000 + 1500 = 2524, up to 32-token blocks
])
def test_the_engine_limits_are_those_aiconfigurator_deploys(backend, budget):
    row = {"model_path": "Qwen/Qwen3-32B", "system": "h100_sxm", "backend": backend,
           "isl": 1000.0, "osl": 100.0, "batch_size": 24.0, "concurrency": 24.0,
           "tp_size": 2.0, "pp_size": 1.0}
    s, _ = scenario(row)
    assert (s["engine"]["max_num_seqs"], s["engine"]["max_num_batched_tokens"]) == (24, budget)


@pytest.mark.parametrize("backend", ["vllm", "sglang", "trtllm"])
def test_every_aggregated_row_is_aiperf_with_twenty_rounds_after_one_warm_up_round(backend):
    row = {"model_path": "Qwen/Qwen3-32B", "system": "h100_sxm", "backend": backend,
           "isl": 1024.0, "osl": 128.0, "batch_size": 4.0, "tp_size": 2.0, "pp_size": 1.0}
    s, _ = scenario(row)
    w = s["workload"]
    assert (w["client"], w["concurrency"], w["warmup_requests"], w["num_requests"]) == (
        "aiperf", 4, 4, 80)
    r = simulator.run(simulator.load_scenario(s))
    # the 4 warm-ups are served and left out: 80 measured requests, each through the API
    # front end, and the measured run starts after the warm-ups' last token
    assert len(r.requests) == 80
    assert r.requests["arrival_s"].min() > 0.0
    first = r.requests.nsmallest(4, "arrival_s")["arrival_s"]
    assert first.max() == first.min()  # the first 4 measured requests are sent together


def test_an_aggregated_moe_row_over_two_nodes_with_fp8_kv_on_trtllm():
    s, why = agg_scenario(_moe(tp_size=1.0, attention_dp_size=16.0, moe_tp_size=1.0,
                               moe_ep_size=16.0, concurrency=2.0))
    assert why == ""
    assert s["model"] == {"name": "deepseek-v3", "weight_dtype": "fp8", "kv_dtype": "fp8"}
    assert s["parallel"] == {"tp": 16, "pp": 1, "dp": 1, "ep": 16, "attention_dp": True}
    assert s["cluster"] == {"topology": "hgx-h200", "nodes": 2}
    assert s["workload"]["concurrency"] == 2 and s["workload"]["num_requests"] == 40
    # SGLang keeps the 16-bit cache; NVFP4 weights are fp4
    s, _ = agg_scenario(_moe(backend="sglang", system="b200_sxm", gemm_quant_mode="nvfp4"))
    assert s["model"] == {"name": "deepseek-v3", "weight_dtype": "fp4"}
    assert s["engine"]["profile"] == "sglang"
    assert s["cluster"]["topology"] == "hgx-b200"


def test_a_disaggregated_row_is_a_prefill_and_a_decode_pool():
    s, why = scenario(_disagg())
    assert why == ""
    assert s["name"] == "deepseek-v3-h200_sxm-trtllm-disagg-8192x1024-c96"
    prefill, decode = s["pools"]
    # Dynamo streams from the decode worker: the client's first token comes with the KV
    assert prefill == {"name": "prefill", "role": "prefill", "tp": 8, "pp": 1, "dp": 2,
                       "ep": 8, "nodes": 2, "first_token": "decode",
                       "engine": {"max_num_seqs": 1, "max_num_batched_tokens": 8192}}
    # 4 sequences on each of the 8 attention groups of each of the 3 engines: 96
    assert decode == {"name": "decode", "role": "decode", "tp": 8, "pp": 1, "dp": 3,
                      "ep": 8, "attention_dp": True, "nodes": 3,
                      "engine": {"max_num_seqs": 32}}
    assert 4 * 8 * 3 == s["workload"]["concurrency"] == 96
    assert s["workload"]["prompt_tokens"] == 8192 and s["workload"]["output_tokens"] == 1024
    assert s["engine"] == {"profile": "trtllm"}
    assert s["model"]["kv_dtype"] == "fp8"
    loaded = simulator.load_scenario(s)
    assert [p.role for p in loaded.pools] == ["prefill", "decode"]


def test_a_disaggregated_prefill_with_attention_dp_takes_one_prompt_per_group():
    s, _ = disagg_scenario(_disagg(prefill_tp_size=1.0, prefill_attention_dp_size=4.0,
                                   prefill_moe_ep_size=4.0, prefill_num_workers=1.0,
                                   isl=1024))
    assert s["pools"][0]["engine"] == {"max_num_seqs": 4, "max_num_batched_tokens": 4096}
    assert s["pools"][0]["nodes"] == 1


def test_both_pools_share_one_nvl72_rack_when_they_fit():
    s, _ = disagg_scenario(_disagg(system="gb200"))
    prefill, decode = s["pools"]
    assert prefill["nodes"] == 1 and "same_nodes_as" not in prefill
    assert decode["same_nodes_as"] == "prefill" and "nodes" not in decode
    assert s["cluster"] == {"topology": "gb200-nvl72"}
    simulator.load_scenario(s)
    # 16 + 8 x 8 = 80 GPUs do not fit in one 72-GPU rack: a rack each
    s, _ = disagg_scenario(_disagg(system="gb200", decode_num_workers=8.0))
    assert [p.get("nodes") for p in s["pools"]] == [1, 1]
    assert "same_nodes_as" not in s["pools"][1]


@pytest.mark.parametrize("change, why", [
    ({"decode_num_workers": NAN},
     "decode_num_workers: missing (the run's worker count is unknown)"),
    ({"prefill_moe_ep_size": 4.0},
     "prefill_moe_tp_size x prefill_moe_ep_size = 1 x 4 is not the engine's 8 x 1 GPUs "
     "(prefill_tp_size x prefill_attention_dp_size)"),
    ({"system": "a100_sxm"}, "system 'a100_sxm': not one of h100_sxm, h200_sxm, b200_sxm, "
                             "gb200"),
    ({"backend": "lmdeploy"}, "backend 'lmdeploy': not one of vllm, sglang, trtllm"),
    ({"model_path": "x/y"}, "model_path 'x/y': not one of deepseek-ai/DeepSeek-V3, "
                            "Qwen/Qwen3-32B"),
    ({"mode": "colocated"}, "mode 'colocated': not one of 'agg', 'disagg'"),
])
def test_rows_that_cannot_be_expressed_are_refused_with_the_reason(change, why):
    assert scenario(_disagg(**change)) == (None, why)


def test_a_measured_b200_disaggregated_run_by_hand():
    # B200 TensorRT-LLM FP8, 8192/1024 at concurrency 1: one prefill engine of attention
    # DP 8 with EP 8, one decode engine of attention TP 8 with MoE-TP 8 (the data's row
    # dsr1_b200_trtllm_fp8_disagg_8192x1024_c1). The prompt's FP8 MLA latent (61 layers x
    # 576 values x 1 byte per token) lives on one prefill rank; each of the 8 TP decode
    # ranks needs all of it, so 8 copies leave through that rank's 400 Gb/s NIC.
    row = _disagg(system="b200_sxm", isl=8192, osl=1024, concurrency=1.0,
                  prefill_num_workers=1.0, prefill_tp_size=1.0,
                  prefill_attention_dp_size=8.0, decode_batch_size=1.0,
                  decode_num_workers=1.0, decode_tp_size=8.0, decode_attention_dp_size=1.0,
                  decode_moe_tp_size=8.0, decode_moe_ep_size=1.0)
    s, _ = scenario(row)
    s["output"] = {"steps": True, "trace": False}
    r = simulator.run(s)
    q = r.requests
    assert (q["kv_bytes"] == 8 * 8192 * 61 * 576).all()
    transfer = 8 * 8192 * 61 * 576 / (50e9 * 0.75) + 3.6e-6
    assert transfer == pytest.approx(61.41e-3, abs=1e-5)
    assert np.allclose(q["kv_transfer_s"], transfer, atol=1e-6)
    # the client's first token arrives with the KV: TTFT = the prefill step + the transfer
    prefill = r.steps[r.steps["replica"] == 0]
    assert round(prefill["end_s"].iloc[0] * 1e3) == 98  # the first prompt's one step
    assert q["ttft_s"].iloc[0] == pytest.approx(prefill["end_s"].iloc[0] + transfer,
                                                abs=1e-6)
    # the decode step at one sequence (docs/disaggregation.md quotes these)
    decode = r.steps[r.steps["replica"] == 1]
    assert round(decode["compute_s"].median() * 1e3, 1) == 12.4
    assert round(decode["comm_s"].median() * 1e3, 2) == 0.65
    assert round(r.summary["tpot_mean_s"] * 1e3, 1) == 13.1


@pytest.mark.slow
@pytest.mark.skipif(not (REPO.parent / "shared" / "validation").is_dir(),
                    reason="../shared/validation absent")
def test_the_disaggregated_table_the_docs_quote():
    script = REPO / "benchmarks" / "validation" / "validation_e2e.py"
    out = subprocess.run([sys.executable, str(script),
                          "--mode", "disagg", "--per-group", "100", "--max-concurrency",
                          "1024"], capture_output=True, text=True, check=True,
                         timeout=3000).stdout
    rows = [line for line in out.splitlines()
            if line.startswith("| ") and line.split("|")[3].strip() == "disagg"]
    doc = (REPO / "docs" / "disaggregation.md").read_text()
    assert len(rows) >= 5 and all(r in doc for r in rows), rows
    assert sum(line.startswith("skip ") for line in out.splitlines()) == 3
    assert sum(" ms vs " in line for line in out.splitlines()) == 140


AIC_B200 = REPO.parent / "shared" / "calibration" / "aic" / "b200_sxm"


def test_the_b200_decode_kernels_the_docs_quote():
    # The simulated MLA module of one decode layer at 16 heads per GPU, one sequence, 8k
    # context (TensorRT-LLM's B200 fit), and, when the tables are here, what
    # AIConfigurator's B200 TensorRT-LLM tables measured for it and for the FP8
    # block-scale MoE-TP8 kernel at one token.
    gpu = engines.engine_gpu(load_gpu("b200"), "trtllm")
    mla = float(mla_decode(load_model("deepseek-v3"), gpu, 16, 1, 8192, "fp8", "fp8"))
    assert round(mla * 1e6, 1) == 52.5
    if not AIC_B200.is_dir():
        return
    df = pd.read_parquet(AIC_B200 / "mla" / "trtllm" / "1.3.0rc20"
                         / "mla_generation_module_perf.parquet")
    row = df[(df.batch_size == 1) & (df.step == 8192) & (df.num_heads == 16)
             & (df.kv_cache_dtype == "fp8") & (df.gemm_type == "fp8_block")]
    assert row["latency"].round(4).tolist() == [0.0500]  # ms
    moe = pd.read_parquet(AIC_B200 / "moe" / "trtllm" / "1.3.0rc20" / "moe_perf.parquet")
    one = moe[(moe.hidden_size == 7168) & (moe.inter_size == 2048) & (moe.topk == 8)
              & (moe.num_experts == 256) & (moe.num_tokens == 1) & (moe.moe_tp_size == 8)
              & (moe.moe_ep_size == 1) & (moe.moe_dtype == "fp8_block")]
    assert set(one["kernel_source"]) == {"deepgemm"}
    assert round(one["latency"].min() * 1e3) == 98  # us


def _sglang_row(**cols):
    row = {"model_path": "Qwen/Qwen3-32B", "system": "h100_sxm", "backend": "sglang",
           "isl": 4096.0, "osl": 128.0, "batch_size": 64.0, "tp_size": 4.0, "pp_size": 1.0}
    return {**row, **cols}


@pytest.mark.parametrize("row, mixed, prefill_first", [
    # Qwen3-32B, H100 TP4, 4096 / 128 at concurrency 64 (measured 4,684 ms / 53.2 ms)
    (_sglang_row(), (614, 75.8), (4416, 48.3)),
    # DeepSeek-V3 FP8, H200 TP8, 8192 / 1024 at concurrency 32, SGLang 0.5.9 (measured
    # 994 ms / 32.0 ms)
    (_sglang_row(model_path="deepseek-ai/DeepSeek-V3", system="h200_sxm", isl=8192.0,
                 osl=1024.0, batch_size=32.0, tp_size=8.0, gemm_quant_mode="fp8",
                 moe_quant_mode="fp8", attention_dp_size=1.0, moe_tp_size=8.0,
                 moe_ep_size=1.0), (848, 34.0), (4867, 30.5)),
])
def test_sglang_prefill_priority_on_two_measured_runs(row, mixed, prefill_first):
    # The figures docs/cost-model.md quotes: the "sglang" profile's mixed chunked prefill,
    # and SGLang's own prefill-first, never-mixed steps (scheduler = "sglang"), under which
    # the fixed-length closed loop locks into waves: every prompt of a wave is prefilled
    # before any of them decodes, so all finish at the same step and return together.
    s, _ = scenario(row)
    got = []
    for sched in (None, "sglang"):
        if sched:
            s["engine"]["scheduler"] = sched
        m = simulator.run(simulator.load_scenario(s)).summary
        got.append((round(m["ttft_mean_s"] * 1e3), round(m["tpot_mean_s"] * 1e3, 1)))
    assert got == [mixed, prefill_first]


@pytest.mark.skipif(not (REPO.parent / "shared" / "validation").is_dir(),
                    reason="../shared/validation absent")
def test_the_measured_sglang_059_ttft_grows_as_docs_quote():
    # H200 TP8 DeepSeek-V3 FP8 under SGLang 0.5.9, 1024 / 1024: 160 ms more TTFT from
    # concurrency 4 to 64, where a wave's prefill would add about a second
    df = pd.read_csv(REPO.parent / "shared" / "validation" / "silicon_moe_deepseek_v3.csv")
    runs = df[(df["mode"] == "agg") & (df["backend"] == "sglang") & (df["system"] == "h200_sxm")
              & (df["isl"] == 1024) & (df["osl"] == 1024)
              & (df["backend_version"].astype(str) == "0.5.9")].set_index("concurrency")
    assert round(runs.loc[64.0, "silicon_ttft_ms"] - runs.loc[4.0, "silicon_ttft_ms"],
                 -1) == 160


def test_the_b200_trtllm_fp8_experts_the_docs_quote():
    # DeepSeek-V3 FP8 on B200, MoE-TP8 (8 ranks, 256-wide expert slices), decode at 1 and
    # 4 tokens (8 distinct experts per token): the routed experts of one layer under the
    # TensorRT-LLM and the SGLang fits, and the MLA module at 4 sequences of 1,536 tokens
    # (16 heads per GPU). 58 MoE layers and 61 MLA layers per step.
    m = load_model("deepseek-v3")
    got = {}
    for prof in ("trtllm", "sglang"):
        gpu = engines.engine_gpu(load_gpu("b200"), prof)
        for n in (1, 4):
            counts = np.zeros((1, 256))
            counts[0, :8 * n] = 1
            got[prof, n] = round(float(expert_time(counts, m, 2048 // 8, gpu, "fp8", 1)[0])
                                 * 1e6, 1)
    assert got == {("trtllm", 1): 108.9, ("trtllm", 4): 131.3,
                   ("sglang", 1): 34.1, ("sglang", 4): 58.5}
    assert round(58 * got["trtllm", 4] / 1e3, 2) == 7.62
    gpu = engines.engine_gpu(load_gpu("b200"), "trtllm")
    mla = float(mla_decode(m, gpu, 16, 4, 4 * 1536, "fp8", "fp8"))
    assert round(61 * mla * 1e3, 2) == 3.20
    if not AIC_B200.is_dir():
        return
    # the kernels AIConfigurator's B200 tables time for FP8 block-scale MoE-TP8
    def table(engine, version):
        moe = pd.read_parquet(AIC_B200 / "moe" / engine / version / "moe_perf.parquet")
        one = moe[(moe.hidden_size == 7168) & (moe.inter_size == 2048) & (moe.topk == 8)
                  & (moe.num_experts == 256) & (moe.moe_tp_size == 8)
                  & (moe.moe_ep_size == 1) & (moe.moe_dtype == "fp8_block")
                  & moe.num_tokens.isin([1, 4])]
        return {(k, int(n)): round(v * 1e3, 1) for (k, n), v in
                one.groupby(["kernel_source", "num_tokens"])["latency"].min().items()}
    assert table("trtllm", "1.3.0rc20") == {("deepgemm", 1): 97.7, ("deepgemm", 4): 133.2}
    assert table("sglang", "0.5.14") == {("sglang_flashinfer_trtllm_moe", 1): 35.3,
                                         ("sglang_flashinfer_trtllm_moe", 4): 41.7}


@pytest.mark.parametrize("cols, deployed, defaults", [
    # Qwen3-32B on H100 under SGLang 0.5.1.post1 (measured 2,857 / 33.8 ms and 528 / 10.1)
    ({"isl": 2048.0, "batch_size": 128.0, "tp_size": 8.0}, (322, 49.8), (2691, 31.1)),
    ({"isl": 1024.0, "osl": 256.0, "batch_size": 16.0}, (146, 10.6), (377, 9.7)),
])
def test_the_qwen3_sglang_rows_behave_as_sglangs_defaults(cols, deployed, defaults):
    # TTFT / TPOT (ms) of the mixed steps with AIConfigurator's limits (the mapping) and of
    # SGLang's own defaults: prefill first, never mixed, chunked_prefill_size 8192
    s, _ = scenario(_sglang_row(**cols))
    got = []
    for engine in ({}, {"scheduler": "sglang", "max_num_batched_tokens": 8192}):
        s["engine"].update(engine)
        m = simulator.run(simulator.load_scenario(s)).summary
        got.append((round(m["ttft_mean_s"] * 1e3), round(m["tpot_mean_s"] * 1e3, 1)))
    assert got == [deployed, defaults]


@pytest.mark.parametrize("cols, hidden, inline", [
    # Qwen3-32B on H100 under vLLM 0.12.0 (measured TPOT 8.66 ms and 18.52 ms)
    ({"osl": 128.0, "batch_size": 8.0, "tp_size": 8.0}, 6.85, 10.30),
    ({"isl": 1024.0, "osl": 512.0, "batch_size": 64.0}, 15.09, 21.67),
])
def test_the_vllm_012_tpot_between_hidden_and_inline_host_work(cols, hidden, inline):
    # TPOT (ms) with the vllm-v1 profile's host work hidden behind the GPU step (async
    # scheduling) and with it in line (cpu_overlap = false)
    s, _ = scenario({**_sglang_row(backend="vllm", isl=1024.0), **cols})
    got = []
    for overlap in (True, False):
        s["engine"]["cpu_overlap"] = overlap
        got.append(round(simulator.run(simulator.load_scenario(s)).summary["tpot_mean_s"]
                         * 1e3, 2))
    assert got == [hidden, inline]
