"""2026 architectures: hybrid Gated DeltaNet, DeepSeek sparse attention, quantized releases.

Parameter counts by hand against the published totals, state and KV bytes by hand, a
hybrid decode step's dependence on the context by hand, DSA's cost flat beyond
``index_topk``, quantized weight bytes per class, and the refusals."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import simpy

from simulator import run
from simulator.cli import main
from simulator.cluster.pools import build_plan
from simulator.cluster.transfer import KVTransfers
from simulator.errors import ScenarioError
from simulator.hardware.specs import load_gpu
from simulator.io.scenario import load_scenario
from simulator.model import linear_attention as la
from simulator.model.fitted import DSA_FIT, GDN_FIT
from simulator.model.hybrid_cost import DSACost, GDNCost
from simulator.model.memory import (
    ExpertLayout,
    hybrid_block_tokens,
    moe_weight_bytes_per_gpu,
    plan_moe_memory,
    weight_classes,
)
from simulator.model.moe_stage import MoEStageCost
from simulator.model.routing import Routing
from simulator.model.spec import from_config, load_model
from simulator.parallel.collective import AllReduceCost
from simulator.paths import MODEL_CONFIGS

H200 = load_gpu("h200_sxm")
#: The project's shared data beside the repository (skipped where absent).
SHARED = Path(__file__).resolve().parents[1].parent / "shared"


def _hand_params_qwen35_27b() -> int:
    """Qwen3.5-27B by hand from its config.json (h 5120, 64 layers of which every fourth
    is full attention, 24 q / 4 kv heads of 256 with output gate and q/k norms, Gated
    DeltaNet 16 key / 48 value heads of 128, conv 4, MLP 17408, vocab 248320)."""
    h, d, nq, nkv, inter, vocab = 5120, 256, 24, 4, 17408, 248320
    full = h * (2 * nq + 2 * nkv) * d + nq * d * h + 2 * d
    kd, vd, nv = 16 * 128, 48 * 128, 48
    lin = (h * (2 * kd + 2 * vd) + h * 2 * nv + (2 * kd + vd) * 4 + 2 * nv + 128
           + vd * h)
    per_layer_rest = 3 * h * inter + 2 * h
    return 16 * full + 48 * lin + 64 * per_layer_rest + 2 * vocab * h + h


def test_qwen35_parameter_counts_by_hand_and_published():
    m = load_model("qwen3.5-27b")
    assert m.total_params == _hand_params_qwen35_27b()
    assert m.total_params == pytest.approx(27e9, rel=0.01)  # published: 27B (text)
    assert m.linear.layers == tuple(i for i in range(64) if (i + 1) % 4)
    big = load_model("qwen3.5-397b-a17b")
    assert big.total_params == pytest.approx(397e9, rel=0.005)  # published: 397B / 17B
    assert big.active_params == pytest.approx(17e9, rel=0.03)
    assert load_model("qwen3.5-122b-a10b").total_params == pytest.approx(122e9, rel=0.005)
    assert load_model("qwen3.5-35b-a3b").total_params == pytest.approx(35e9, rel=0.015)


def test_dsa_parameter_counts_by_hand_and_published():
    v32, v3 = load_model("deepseek-v3.2"), load_model("deepseek-v3")
    # the indexer per layer: wq_b (1536 x 64*128), wk (7168 x 128), k LayerNorm (2 x 128),
    # weights_proj (7168 x 64); everything else is DeepSeek-V3's
    indexer = 1536 * 64 * 128 + 7168 * 128 + 2 * 128 + 7168 * 64
    assert v32.total_params - v3.total_params == 61 * indexer
    assert v32.total_params == pytest.approx(671e9, rel=0.005)  # published 671B (+14B MTP)
    glm = load_model("glm-5")
    assert glm.total_params == pytest.approx(744e9, rel=0.002)  # published: 744B, 40B active
    assert glm.active_params == pytest.approx(40e9, rel=0.05)
    assert glm.mtp_layers == v32.mtp_layers == 1 and load_model("qwen3.5-27b").mtp_layers == 1


def test_full_attention_interval_without_layer_types():
    """Qwen3-Next's config gives only full_attention_interval: every fourth layer is full
    attention, as Qwen3.5's explicit layer_types say."""
    c = _config("qwen3.5-35b-a3b")
    explicit = from_config(c, "x")
    del c["text_config"]["layer_types"]
    implied = from_config(c, "x")
    assert implied.linear.layers == explicit.linear.layers == tuple(
        i for i in range(40) if (i + 1) % 4)
    assert implied.total_params == explicit.total_params


def test_state_and_kv_bytes_per_sequence_by_hand():
    m = load_model("qwen3.5-27b")
    ssm = 48 * 128 * 128 * 4  # fp32 recurrent state per layer (mamba_ssm_dtype)
    conv = 3 * (2 * 16 * 128 + 48 * 128) * 2  # last K-1 inputs of the conv, 16-bit
    assert m.linear.state_bytes_per_seq() == 48 * (ssm + conv) == 153_944_064
    assert m.linear.state_bytes_per_seq(tp=4) == 48 * (ssm + conv) // 4
    # KV only on the 16 full-attention layers: 2 * 16 * 4 heads * 256 * 2 bytes
    assert m.kv_bytes_per_token(2, 1, m.full_attention_layers()) == 65_536
    v32 = load_model("deepseek-v3.2")
    # MLA latent + rope, plus the indexer's 128 FP8 keys and their fp32 scale, per layer
    assert v32.kv_bytes_per_token(2) == 61 * ((512 + 64) * 2 + 128 + 4)


def test_recurrent_state_is_set_aside_per_sequence():
    m = load_model("qwen3.5-27b")
    args = dict(gpu_memory_bytes=H200.memory_bytes, tp=1, pp=1, layout=ExpertLayout(),
                weight_dtype="bf16", kv_dtype="bf16", block_size=16, utilization=0.9,
                max_tokens=8192, reserve_bytes=0.0)
    a, b = plan_moe_memory(m, max_seqs=64, **args), plan_moe_memory(m, max_seqs=128, **args)
    per = m.linear.state_bytes_per_seq()
    assert b.state_bytes_per_gpu == 128 * per and a.state_bytes_per_gpu == 64 * per
    # 64 more sequences: their states plus their logits rows leave the KV pool
    logits = 64 * m.vocab * 4
    assert a.kv_bytes_per_gpu[0] - b.kv_bytes_per_gpu[0] == pytest.approx(64 * per + logits)
    assert a.block_bytes_per_gpu[0] == 16 * 65_536


def test_hybrid_decode_step_grows_with_kv_on_full_layers_only():
    """The context term of a decode step is the 16 full layers' attention: a quarter of
    the same model with every layer full attention; GDN adds a per-sequence constant."""
    hyb = load_model("qwen3.5-27b")
    full = replace(hyb, linear=None)
    plans = {}
    for name, model in (("hyb", hyb), ("full", full)):
        plans[name] = _stage(model)
    n, kv1, kv2 = 32, 32 * 2000, 32 * 30000
    d = {k: c.step(n, 0.0, 0, kv2, n)[0] - c.step(n, 0.0, 0, kv1, n)[0]
         for k, c in plans.items()}
    assert d["hyb"] == pytest.approx(d["full"] * 16 / 64, rel=1e-9)
    # the GDN kernels: the fitted form on the state bytes, by hand
    g = GDNCost(hyb, H200, 1)
    flops = n * (7 * 48 * 128 * 128 + 2 * (2 * 2048 + 6144) * 4)
    nbytes = n * (2 * 48 * 128 * 128 * 4 + 2 * 3 * 10240 * 2 + (2 * 10240 + 6144) * 2)
    floor, ef, eb = GDN_FIT["hopper"]["decode"]
    assert g.decode(n) == pytest.approx(floor + max(flops / (ef * H200.peak("bf16")),
                                                    nbytes / (eb * H200.hbm_bandwidth_Bps)))
    # state-bound: 32 sequences move 32 x 6.3 MB per layer
    assert nbytes / (eb * H200.hbm_bandwidth_Bps) > flops / (ef * H200.peak("bf16"))


def _stage(model, gpu=H200, tp=1):
    routing = Routing.build(np.ones(1), 1, 0, 1, 0)
    return MoEStageCost(model, gpu, tp, 0, model.layers, True, True, "bf16", "bf16",
                        AllReduceCost((), 1), ExpertLayout(), routing, None)


def test_dsa_decode_flat_beyond_index_topk():
    v32 = load_model("deepseek-v3.2")
    dsa = DSACost(v32, H200, 16, "bf16", "fp8")
    sh = dsa.shape
    # past top-k, only the indexer term grows: 2 n_I d_I FLOPs and 132 bytes per key
    f1, b1 = sh.work(1, 10_000, 2048, 2, 1)
    f2, b2 = sh.work(1, 20_000, 2048, 2, 1)
    assert f2 - f1 == pytest.approx(2 * 64 * 128 * 10_000)
    assert b2 - b1 == pytest.approx(132 * 10_000)
    t = [float(dsa.decode(1, kv)) for kv in (1024, 2048, 4096, 65536)]
    below = (t[1] - t[0]) / 1024
    beyond = (t[3] - t[2]) / (65536 - 4096)
    assert beyond < below / 5  # the sparse attention stopped growing at 2048 keys
    # a dense MLA model keeps growing: DSA at 64k context is cheaper than V3 there
    assert dsa.index.selected(65536, 1) == 2048


def _attention_growth(model, lo=16384, hi=65536, n=16):
    """Decode step growth from ``lo`` to ``hi`` tokens per sequence of ``model`` with its
    experts replaced by the dense MLP (no routing draw: only attention depends on the
    context), on 8 H200 in FP8."""
    m = replace(model, moe=None)
    c = MoEStageCost(m, H200, 8, 0, m.layers, True, True, "fp8", "bf16",
                     AllReduceCost((), 1), ExpertLayout(), Routing.build(np.ones(1), 1, 0, 1,
                                                                          0), None)
    return c, c.step(n, 0.0, 0, n * hi, n)[0] - c.step(n, 0.0, 0, n * lo, n)[0]


def test_dsa_stage_decode_stops_growing_with_context_unlike_mla():
    """A decode step of DeepSeek-V3.2 grows far less from 16k to 64k tokens of context per
    sequence (only the indexer reads more) than DeepSeek-V3's, whose MLA reads every
    token."""
    v32 = _attention_growth(load_model("deepseek-v3.2"))[1]
    v3 = _attention_growth(load_model("deepseek-v3"))[1]
    assert 0 < v32 < v3 / 4


def test_quantized_weight_bytes_per_class():
    glm = load_model("glm-5-nvfp4")
    assert (glm.quant.scheme, glm.quant.attention, glm.quant.experts,
            glm.quant.lm_head) == ("nvfp4", "bf16", "fp4", "bf16")
    lay = ExpertLayout(ep=8, expert_dtype="fp4")
    rows = {r[0]: r for r in weight_classes(glm, 8, lay, 78, True, "bf16")}
    # 75 MoE layers x 32 experts per rank x 3 h I x (half a byte + one FP8 scale per 16)
    assert rows["routed experts"][1] == pytest.approx(75 * 32 * 3 * 6144 * 2048 * (0.5 + 1 / 16))
    total = moe_weight_bytes_per_gpu(glm, 8, lay, 0, 78, True, True, "bf16")
    assert sum(r[1] for r in rows.values()) == pytest.approx(total, rel=1e-12)
    kimi = load_model("kimi-k2.5")  # compressed-tensors W4A16, group 32
    assert kimi.quant.scheme == "int4" and kimi.moe.expert_dtype == "int4"
    assert kimi.quant.attention == "bf16" and kimi.quant.shared_experts == "bf16"
    lay = ExpertLayout(ep=8, expert_dtype="int4")
    row = {r[0]: r for r in weight_classes(kimi, 8, lay, 61, True, "bf16")}["routed experts"]
    assert row[1] == pytest.approx(60 * 48 * 3 * 7168 * 2048 * (0.5 + 2 / 32))
    v32 = load_model("deepseek-v3.2")
    assert v32.quant.scheme == "fp8_block" and v32.quant.lm_head == "bf16"
    q35 = load_model("qwen3.5-397b-a17b-nvfp4")  # linear_attn*, self_attn*, shared_expert*
    assert (q35.quant.attention, q35.quant.shared_experts, q35.quant.experts) == (
        "bf16", "bf16", "fp4")


def _config(name):
    return json.loads((MODEL_CONFIGS / f"{name}.json").read_text())


@pytest.mark.parametrize("edit, needle", [
    (lambda c: c["text_config"]["layer_types"].__setitem__(0, "mamba"),
     "'layer_types' has 'mamba'"),
    (lambda c: c["text_config"].__setitem__("mamba_ssm_dtype", "float8"),
     "'mamba_ssm_dtype' = 'float8'"),
    (lambda c: c.__setitem__("quantization_config", {"quant_method": "awq"}),
     "quant_method = 'awq' is not supported"),
    (lambda c: c["text_config"].__setitem__("hybrid_override_pattern", "M-M*"),
     "Mamba2"),
])
def test_refusals_name_the_key_and_value(edit, needle):
    c = _config("qwen3.5-27b")
    edit(c)
    with pytest.raises(ScenarioError, match="model.name") as exc:
        from_config(c, "x")
    assert needle in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("source, needle", [
    ("deepseek-ai--DeepSeek-V4-Flash_config.json", "compress_ratios"),
    ("moonshotai--Kimi-K3_config.json", "linear_attn_config"),
    ("nvidia--Nemotron-H-56B-Base-8K_config.json", "hybrid_override_pattern"),
    ("nvidia--NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16_config.json", "layers_block_type"),
    ("nvidia--Llama-3_3-Nemotron-Super-49B-v1_config.json", "block_configs"),
    ("XiaomiMiMo--MiMo-V2-Flash_config.json", "hybrid_layer_pattern"),
    ("google--gemma-4-26B-A4B_config.json", "global_head_dim"),
    ("nvidia--Qwen3.6-27B-NVFP4_config.json", "MIXED_PRECISION"),
])
def test_unpriced_architectures_refused(source, needle):
    path = SHARED / "models" / "aic" / source
    if not path.is_file():
        pytest.skip("shared/models/aic not present")
    with pytest.raises(ScenarioError, match=needle):
        load_model(str(path))


@pytest.mark.parametrize("model, want", [
    ("deepseek-v3", "fp8"),       # block FP8: attention ships FP8
    ("glm-5-nvfp4", "bf16"),      # NVFP4 experts, 16-bit attention
    ("llama-3.1-70b", "bf16"),    # no quantization_config
])
def test_unset_weight_dtype_is_the_release_precision(model, want):
    s = load_scenario({"model": {"name": model}, "workload": {"rate_per_s": 1.0,
                                                               "num_requests": 4}})
    assert s.model.weight_dtype == want
    set_ = load_scenario({"model": {"name": model, "weight_dtype": "bf16"},
                          "workload": {"rate_per_s": 1.0, "num_requests": 4}})
    assert set_.model.weight_dtype == "bf16"  # a value the user sets is kept


def test_hybrid_prefix_caching_resumes_at_vllm_state_snapshots():
    """Qwen3.5-27B under vLLM V1 prefix caching: a 784-token attention block (vLLM logs
    it for this model on one GPU), 400 at TP8; every hit is a whole number of those blocks
    (a 2,048-token shared prefix is reused as 1,568 tokens), and each 16-token KV block
    carries its share of a state snapshot instead of a state set aside per sequence."""
    m = load_model("qwen3.5-27b")
    assert hybrid_block_tokens(m, 2, 1) == 16 * -(-3_207_168 // (16 * 4096)) == 784
    assert hybrid_block_tokens(m, 2, 8) == 400  # 4 KV heads replicated: 1 per GPU
    base = {"model": {"name": "qwen3.5-27b"}, "cluster": {"topology": "hgx-h200"},
            "engine": {"max_num_seqs": 64, "prefix_caching": True},
            "workload": {"arrival": "sessions", "rate_per_s": 2.0, "num_requests": 60,
                         "shared_prefix_tokens": 2048, "hash_block_tokens": 16,
                         "prompt_tokens": 300, "output_tokens": 100}}
    r = run(load_scenario(base))
    hits = r.requests.cached_prompt_tokens
    assert (r.requests.status == "completed").all()
    assert (hits % 784 == 0).all() and 1568 in set(hits) and r.summary["prefix_hit_rate"] > 0
    state = 48 * (48 * 128 * 128 * 4 + 3 * 10240 * 2)
    assert r.plan.memory.block_bytes_per_gpu == (16 * 16 * 4096 + round(16 * state / 784),)
    assert r.plan.memory.state_bytes_per_gpu == 0.0
    with pytest.raises(ScenarioError, match="allowed: vllm-v1, none"):
        run(load_scenario(base | {"engine": base["engine"] | {"profile": "sglang"}}))


def test_qwen_moe_without_mlp_only_layers_is_all_moe():
    """A Qwen3.5/3.6 MoE text config that leaves out mlp_only_layers (Qwen3.6-35B-A3B)
    has every layer MoE with its shared expert, as one that lists none."""
    c = _config("qwen3.5-35b-a3b")
    want = from_config(c, "x").moe
    del c["text_config"]["mlp_only_layers"]
    got = from_config(c, "x").moe
    assert got == want and got.layers == tuple(range(c["text_config"]["num_hidden_layers"]))
    assert got.shared_intermediate == c["text_config"]["shared_expert_intermediate_size"]


def _scenario(tmp_path, model, topology="hgx-h200", tp=8, extra="", dtype="bf16"):
    f = tmp_path / "s.toml"
    f.write_text(f'[model]\nname = "{model}"\nweight_dtype = "{dtype}"\n'
                 f'[cluster]\ntopology = "{topology}"\n[parallel]\ntp = {tp}\n{extra}'
                 f'[workload]\nrate_per_s = 1.0\nnum_requests = 4\n')
    return f


def test_nvfp4_on_hopper_is_refused_in_one_line(tmp_path, capsys):
    code = main(["validate", str(_scenario(tmp_path, "glm-5-nvfp4"))])
    err = capsys.readouterr().err
    assert code == 2 and "NVFP4" in err and "h200_sxm" in err and len(err.strip().splitlines()) == 1
    assert main(["validate", str(_scenario(tmp_path, "glm-5-nvfp4", "hgx-b200"))]) == 0


def test_prefix_caching_on_a_hybrid_is_refused_outside_vllm(tmp_path, capsys):
    f = tmp_path / "s.toml"
    f.write_text('[model]\nname = "qwen3.5-27b"\n[cluster]\ntopology = "hgx-h200"\n'
                 '[engine]\nprofile = "sglang"\n'
                 '[workload]\narrival = "sessions"\nrate_per_s = 1.0\nnum_requests = 4\n')
    code = main(["validate", str(f)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "engine.prefix_caching" in err and "'sglang'" in err
    assert len(err.splitlines()) == 1
    f.write_text(f.read_text().replace('profile = "sglang"', 'profile = "vllm-v1"'))
    assert main(["validate", str(f)]) == 0  # vLLM V1's block-aligned state snapshots


def test_too_many_sequences_for_their_states_says_how_many_fit(tmp_path, capsys):
    m = load_model("qwen3.5-27b")
    f = _scenario(tmp_path, "qwen3.5-27b", tp=1, extra="[engine]\nmax_num_seqs = 1024\n")
    assert main(["validate", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    fits = int(err.split("at most ")[1].split()[0])
    # the largest count whose states fit beside weights, activations, reserve, one block
    plan = plan_moe_memory(m, H200.memory_bytes, 1, 1, ExpertLayout(), "bf16", "bf16", 16,
                           0.9, 8192, fits, 1024**3)
    assert plan.kv_blocks >= 1 and len(err.splitlines()) == 1
    with pytest.raises(ScenarioError):
        plan_moe_memory(m, H200.memory_bytes, 1, 1, ExpertLayout(), "bf16", "bf16", 16,
                        0.9, 8192, fits + 8, 1024**3)


def test_hybrid_and_dsa_scenarios_run(tmp_path):
    for model, tp, dtype in (("qwen3.5-35b-a3b", 2, "bf16"), ("deepseek-v3.2", 8, "fp8")):
        s = load_scenario(_scenario(tmp_path, model, tp=tp, dtype=dtype))
        res = run(s)
        assert len(res.requests) == 4 and res.requests["ttft_s"].gt(0).all()
        plan = build_plan(s)
        assert plan.memory.kv_blocks > 0


#: Held-back median errors docs/model.md quotes, percent.
QUOTED = {("h100_sxm", "gdn", "decode"): 6.4, ("h100_sxm", "gdn", "prefill"): 10.6,
          ("b200_sxm", "gdn", "decode"): 5.5, ("b200_sxm", "gdn", "prefill"): 16.0,
          ("h100_sxm", "dsa", "decode"): 10.2, ("h100_sxm", "dsa", "prefill"): 17.7,
          ("b200_sxm", "dsa", "decode"): 11.6, ("b200_sxm", "dsa", "prefill"): 21.8}


@pytest.mark.parametrize("system, family, phase", list(QUOTED))
def test_shipped_forms_hold_on_the_held_back_rows(system, family, phase):
    """The shipped GDN_FIT / DSA_FIT were fitted on the even rows of AIConfigurator's
    tables: on the odd rows their median error is the one the docs quote, and refitting
    gives the shipped numbers back."""
    from simulator.calibration import attention_kinds as ak
    aic = SHARED / "calibration" / "aic"
    if not (aic / system).is_dir():
        pytest.skip("shared/calibration/aic not present")
    preset, gen = ak.SYSTEMS[system]
    gpu = load_gpu(preset)
    table, shipped = ((ak.gdn_table, GDN_FIT) if family == "gdn" else
                      (ak.dsa_table, DSA_FIT))
    f, b, t = table(aic, system, phase)
    params = shipped[gen][phase]
    err = ak.held_back_error(params, f, b, t, gpu.peak("bf16"), gpu.hbm_bandwidth_Bps)
    assert round(100 * float(np.median(err)), 1) == pytest.approx(QUOTED[system, family,
                                                                          phase], abs=0.11)
    refit = ak.fit_form(f, b, t, gpu.peak("bf16"), gpu.hbm_bandwidth_Bps)
    assert refit == pytest.approx(params, rel=0.01)
    assert all(0 < e <= 1 for e in params[1:])  # never beats the roofline


DOCS = Path(__file__).resolve().parents[1] / "docs" / "model.md"
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("workload", ["hybrid-qwen3.5-27b", "dsa-glm-5-nvfp4-b200"])
def test_docs_worked_validate_matches_the_command(workload, capsys):
    """Every line docs/model.md quotes from `validate` of the workload is what it prints."""
    docs = DOCS.read_text()
    block = docs.split(f"$ python -m simulator validate workloads/{workload}.toml\n", 1)[1]
    quoted = [ln for ln in block.split("```", 1)[0].splitlines()
              if ln.startswith("  ") and ln.strip()]
    assert len(quoted) >= 3
    assert main(["validate", str(ROOT / "workloads" / f"{workload}.toml")]) == 0
    out = capsys.readouterr().out.splitlines()
    for line in quoted:
        assert line in out, line


def test_docs_refusal_and_figures(capsys):
    docs = DOCS.read_text()
    path = ROOT / "workloads" / "dsa-glm-5-nvfp4-b200.toml"
    assert main(["validate", str(path), "--set", "cluster.topology=hgx-h200"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.split(": model.name: ", 1)[1] in docs
    # the experts figure the docs work out by hand
    assert 75 * 32 * 3 * 6144 * 2048 * 0.5625 / 2**30 == pytest.approx(47.46, abs=0.005)
    assert "at most 514 fit" in docs
    table = SHARED / "calibration/aic/b200_sxm/sparse_attention/vllm/0.24.0"
    if table.is_dir():  # the one-token prefill module the docs quote
        d = pd.read_parquet(table / "dsa_context_module_perf.parquet")
        row = d[(d.model == "zai-org/GLM-5") & (d.num_heads == 8) & (d.batch_size == 1)
                & (d.isl == 1) & (d.step == 0) & (d.gemm_type == "bfloat16")
                & (d.kv_cache_dtype == "bfloat16")]
        assert round(float(row.latency.iloc[0]), 2) == 1.28 and "1.28 ms" in docs
    f = ROOT / "workloads" / "hybrid-qwen3.5-27b.toml"
    assert main(["validate", str(f), "--set", "engine.max_num_seqs=1024"]) == 2
    assert "at most 514 " in capsys.readouterr().err


def test_disaggregated_hand_off_of_a_hybrid_moves_its_kv_and_its_state(tmp_path):
    """Qwen3.5-27B, prefill TP8 -> decode TP8: each request moves the KV of the 16
    full-attention layers (4 KV heads of 256 in bf16, replicated so that each of the 8
    decode ranks reads one head) per prompt token, plus the recurrent state of the 48
    Gated DeltaNet layers once: 48 value heads x 128 x 128 float32 and the convolution
    state, 3 x 10240 bf16, per layer."""
    f = ROOT / "workloads" / "disagg-70b-1p1d-short.toml"
    s = load_scenario(str(f), overrides=["model.name=qwen3.5-27b", "engine.max_num_seqs=64",
                                         "workload.num_requests=30"])
    df = run(s).requests
    assert (df.status == "completed").all() and len(df) == 30
    per_token = 16 * 8 * (2 * 256 * 2)
    state = 48 * (48 * 128 * 128 * 4 + 3 * 10240 * 2)
    assert (df.kv_bytes == df.prompt_tokens * per_token + state).all()
    # the links carry the state too: what leaves the prefill GPUs is every byte moved
    plan = build_plan(s)
    env = simpy.Environment()
    kv = KVTransfers(env, plan.graph, plan.model, 0.0)
    src, dst = (p.replicas[0].placement.stages for p in plan.pools)
    _, total = kv.start(783, src, dst, 2)
    env.run()
    assert total == 783 * per_token + state
    _, links, nbytes = kv.link_bytes()
    out = {g for stage in src for g in stage}
    assert sum(b for (a, _), b in zip(links, nbytes, strict=True) if a in out) == total


def test_dsa_kv_flows_carry_the_indexer_keys():
    """GLM-5 (MLA + DeepSeek sparse attention, 78 layers, each with its indexer): one
    token moves its 576-wide latent and its indexer key (128 FP8 + one fp32 scale) per
    layer."""
    from simulator.cluster.transfer import kv_flows, state_flows
    m = load_model("glm-5")
    assert kv_flows(m, 1, [["p0"]], [["d0"]]) == [("p0", "d0", 78 * (576 + 132))]
    assert state_flows(m, [["p0"]], [["d0"]]) == []


def test_a_release_that_does_not_fit_in_16_bit_names_its_precision(tmp_path, capsys):
    assert main(["validate", str(_scenario(tmp_path, "deepseek-v3.2"))]) == 2
    err = capsys.readouterr().err
    assert 'the release ships in fp8_block: model.weight_dtype = "fp8"' in err
    assert main(["validate", str(_scenario(tmp_path, "deepseek-v3.2", dtype="fp8"))]) == 0


def test_new_forms_never_beat_the_roofline():
    """For any shape and batch, the fitted GDN and DSA times are at least FLOPs / peak and
    bytes / bandwidth (both efficiencies <= 1, the floor >= 0)."""
    rng = np.random.default_rng(0)
    peak, bw = H200.peak("bf16"), H200.hbm_bandwidth_Bps
    q27, v32 = load_model("qwen3.5-27b"), load_model("deepseek-v3.2")
    gdn, dsa = GDNCost(q27, H200, 1), DSACost(v32, H200, 16, "bf16", "fp8")
    for _ in range(200):
        n, tokens, kv = (int(x) for x in rng.integers(1, 4096, 3))
        f, b = la.decode_work(q27.linear, n, 1)
        assert gdn.decode(n) >= max(f / peak, b / bw)
        f, b = la.prefill_work(q27.linear, tokens, n, 1)
        assert gdn.prefill(tokens, n) >= max(f / peak, b / bw)
        f, b = dsa.shape.work(n, n * kv, min(n * kv, n * 2048), 2, 1)
        assert float(dsa.decode(n, n * kv)) >= max(f / peak, b / bw)


def test_a_gpu_generation_without_measurements_is_refused(tmp_path, capsys):
    f = _scenario(tmp_path, "qwen3.5-27b", topology="l40s-pcie", tp=4,
                  extra="[engine]\nmax_num_seqs = 16\n")
    assert main(["validate", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert "no Gated DeltaNet calibration for l40s" in err and len(err.splitlines()) == 1


def test_shared_indexers_of_glm52(tmp_path):
    """GLM-5.2 runs its own indexer on 21 of 78 layers ('full' in indexer_types); the 57
    others reuse those top-k indices: no indexer weights, keys or scoring there."""
    path = SHARED / "models" / "aic" / "zai-org--GLM-5.2_config.json"
    if not path.is_file():
        pytest.skip("shared/models/aic not present")
    g52, g5 = load_model(str(path)), load_model("glm-5")
    ix = g5.dsa.indexer_params(6144, 2048)
    assert g52.dsa.indexed(0, 78) == 21
    assert g5.total_params - g52.total_params == 57 * ix
    assert g5.kv_bytes_per_token(2) - g52.kv_bytes_per_token(2) == 57 * 132
    c52, grow52 = _attention_growth(g52)
    c5, grow5 = _attention_growth(g5)
    assert (c52.n_skip, c5.n_skip) == (57, 0)
    # a layer reusing top-k indices costs the same at 4k and 64k tokens of context
    assert float(c52.dsa_skip.decode(16, 16 * 65536)) == float(c52.dsa_skip.decode(16, 16 * 4096))
    # so past top-k only 21 indexers grow where GLM-5 has 78
    assert grow52 == pytest.approx(grow5 * 21 / 78, rel=1e-6)
