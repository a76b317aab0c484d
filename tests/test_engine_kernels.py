"""Per-engine kernel calibration: the AIConfigurator loader by hand, a profile selecting its
engine's fit, the documented fallback, Blackwell's native FP4 priced by the bytes and FLOPs
it saves (refused on Hopper), fitted forms by hand, and fit-on-half / check-on-half with
the roofline floor on the held-back half."""

from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

import simulator
from simulator.calibration import aic, bias, check, engines, forms, moe_forms
from simulator.calibration.params import Calibration, GemmParams, MoEParams
from simulator.cli import main as cli_main
from simulator.cluster.build import cluster_node
from simulator.errors import ScenarioError
from simulator.hardware.specs import load_gpu
from simulator.model.moe_cost import kernel_dtype
from simulator.model.spec import load_model
from simulator.paths import ROOT as REPO

ROOT = aic.default_root()
needs_data = pytest.mark.skipif(not ROOT.is_dir(), reason="../shared/calibration/aic absent")
H100, B200 = load_gpu("h100_sxm"), load_gpu("b200")
#: Stated tolerance of the fit-on-half / check-on-half test: median |error| % per family
#: on the held-back half (docs/cost-model.md, "Per-engine kernels", gives the figures).
HELD_OUT_TOLERANCE = 25.0


def _scenario(profile: str, topology: str = "hgx-b200") -> dict:
    return {"name": "k", "model": {"name": "llama-3.1-8b"},
            "cluster": {"topology": topology}, "engine": {"profile": profile},
            "workload": {"arrival": "constant", "rate_per_s": 2.0, "num_requests": 4,
                         "prompt_tokens": 100, "output_tokens": 8},
            "output": {"steps": False}}


# -- the loader, by hand ----------------------------------------------------------------

def test_loader_converts_units_and_keys_as_the_readme_says(tmp_path):
    base = tmp_path / "b200_sxm"
    comm = base / "comm" / "nccl" / "2.29.2"
    comm.mkdir(parents=True)
    pd.DataFrame({"framework": ["TRTLLM"], "version": ["2.29.2"], "device": ["B200"],
                  "op_name": ["all_reduce"], "kernel_source": ["NCCL"],
                  "nccl_dtype": ["half"], "num_gpus": [8], "message_size": [1024],
                  "latency": [0.0125]}).to_parquet(comm / "nccl_perf.parquet")
    gen = base / "attention" / "vllm"
    for version, ms in (("0.9.0", 9.0), ("0.24.0", 0.02)):  # the newest folder wins
        (gen / version).mkdir(parents=True)
        pd.DataFrame({"framework": ["VLLM"], "version": [version], "device": ["B200"],
                      "op_name": ["generation_attention"], "kernel_source": ["fa"],
                      "batch_size": [4], "isl": [1], "num_heads": [8],
                      "num_key_value_heads": [1], "head_dim": [128], "attn_dtype": ["bfloat16"],
                      "kv_cache_dtype": ["fp8"], "step": [511], "window_size": [0],
                      "latency": [ms]}).to_parquet(gen / version /
                                                   "generation_attention_perf.parquet")
    data = aic.load(tmp_path, "b200", "vllm")
    nccl = data["nccl"].iloc[0]
    assert nccl["message_bytes"] == 2048 and nccl["latency_us"] == pytest.approx(12.5)
    dec = data["attention_generation"]
    assert len(dec) == 1 and dec["kv_len"].iloc[0] == 511
    assert dec["latency_us"].iloc[0] == pytest.approx(20.0)


def test_loader_errors_are_one_line():
    with pytest.raises(ScenarioError, match="unknown engine 'tgi'"):
        aic.load(ROOT, "b200", "tgi")
    with pytest.raises(ScenarioError, match="has no AIConfigurator tables"):
        aic.load(ROOT, "a100_sxm", "vllm")


def test_halves_split_by_shape_and_are_stable():
    df = pd.DataFrame({"m": np.arange(400), "n": 7, "latency_us": np.arange(400) * 1.0})
    h = aic.halves(df)
    assert set(h) == {0, 1} and 120 < h.sum() < 280
    # The split ignores the measurement: the same shapes, other latencies, same halves.
    assert (aic.halves(df.assign(latency_us=1.0)) == h).all()


# -- a profile selects its engine's fit -------------------------------------------------

@pytest.mark.parametrize("profile, engine", [("sglang", "sglang"), ("trtllm", "trtllm"),
                                             ("vllm-v1", "vllm")])
def test_a_profile_selects_only_its_engines_fit(profile, engine):
    cal = cluster_node(simulator.load_scenario(_scenario(profile))).gpu.calibration
    own = engines.shipped("b200", engine)
    for section in engines.SECTIONS_BY_DTYPE:  # what the engine's tables fitted is its own
        if getattr(own, section):
            assert getattr(cal, section) == getattr(own, section), section
        else:  # the rest is borrowed from the engine that runs the same kernel, and said
            donor = engines.BORROW[engine][section]
            assert getattr(cal, section) == getattr(engines.shipped("b200", donor), section)
            assert f"{section} from b200 x {donor}" in cal.source
    assert cal.collectives == own.collectives
    for other in aic.ENGINES:
        if other != engine:
            assert cal.gemm != engines.shipped("b200", other).gemm


def test_profile_none_and_h100_vllm_keep_the_gpu_files_calibration():
    none = cluster_node(simulator.load_scenario(_scenario("none"))).gpu
    assert none.calibration == B200.calibration
    assert none.calibration.source.startswith("carried over from h100_sxm")
    h100 = cluster_node(simulator.load_scenario(_scenario("vllm-v1", "dgx-h100"))).gpu
    assert h100.calibration == H100.calibration


def test_a_gpu_without_a_fit_carries_the_nearest_generations_fit_and_says_so():
    h200 = load_gpu("h200_sxm")
    sel = engines.engine_gpu(h200, "sglang")
    assert sel.calibration.source.startswith("no sglang fit of h200_sxm: carried over from "
                                             "h100_sxm x sglang")
    ref = engines.engine_gpu(H100, "sglang").calibration
    # Efficiencies carry unchanged, SM-second costs by the clocks (generations.transfer).
    assert sel.calibration.gemm_for("bf16").compute_eff == ref.gemm_for("bf16").compute_eff
    factor = H100.boost_clock_hz / h200.boost_clock_hz
    assert sel.calibration.decode_for("bf16").seq_sm_s == pytest.approx(
        ref.decode_for("bf16").seq_sm_s * factor)
    assert "carried over from h100_sxm x sglang" in engines.describe(h200, "sglang")


def test_validate_prints_the_kernel_calibration(capsys, tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('name = "k"\n[model]\nname = "llama-3.1-8b"\n[cluster]\n'
                    'topology = "hgx-b200"\n[engine]\nprofile = "trtllm"\n'
                    '[workload]\narrival = "constant"\nrate_per_s = 2.0\nnum_requests = 4\n'
                    'prompt_tokens = 100\noutput_tokens = 8\n')
    assert cli_main(["validate", str(path)]) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if "kernels" in x][0]
    assert "b200 x trtllm: fitted" in line and "trtllm tables of AIConfigurator" in line


# -- Blackwell FP4 ------------------------------------------------------------------------

def test_nvfp4_gemm_roofline_saves_its_bytes_and_flops():
    """Neutral parameters: the form is the roofline. Memory-bound (1 token) NVFP4 reads
    half the FP8 weight bytes; compute-bound (8192 tokens) it runs at twice the peak."""
    p, bw, sms = GemmParams(), B200.hbm_bandwidth_Bps, B200.sm_count
    n = k = 8192
    t4 = forms.gemm_time(1, n, k, p, B200.peak("fp4"), bw, sms, 0.5, 0.5, True)
    t8 = forms.gemm_time(1, n, k, p, B200.peak("fp8"), bw, sms, 1.0, 1.0, True)
    assert float(t4) == pytest.approx((k * 0.5 + k * n * 0.5 + n * 2) / bw)
    assert float(t8) == pytest.approx((k + k * n + n * 2) / bw)
    c4 = forms.gemm_time(8192, n, k, p, B200.peak("fp4"), bw, sms, 0.5, 0.5, True)
    c8 = forms.gemm_time(8192, n, k, p, B200.peak("fp8"), bw, sms, 1.0, 1.0, True)
    # 1 x 1 tiles: 8192^2 of them in waves over 148 SMs, a 1.6e-6 share of idle slots.
    assert float(c4) == pytest.approx(2.0 * 8192 * n * k / 9000e12, rel=2e-6)
    assert float(c8) / float(c4) == pytest.approx(2.0)


def test_nvfp4_moe_experts_on_blackwell_are_priced_natively():
    """The fitted B200 kernels: NVFP4 experts cost less than FP8 by about the bytes they
    save in decode (weights: 0.5625 vs 1 byte), not the 10-20% of Hopper's W4A16 path."""
    gpu = engines.engine_gpu(B200, "trtllm")
    loads = np.full(32, 4.0)  # 32 local experts x 4 rows: a memory-bound decode step
    t4 = moe_forms.expert_time(loads, 7168, 2048, "nvfp4", gpu)
    t8 = moe_forms.expert_time(loads, 7168, 2048, "fp8_block", gpu, ep=8)
    assert t4 < 0.8 * t8
    r4 = moe_forms.expert_roofline(loads, 7168, 2048, "nvfp4", gpu)
    r8 = moe_forms.expert_roofline(loads, 7168, 2048, "fp8", gpu)
    assert r4 / r8 == pytest.approx(0.5625, rel=0.05)


def test_fp4_experts_follow_the_gpu_and_nvfp4_is_refused_on_hopper():
    ds = load_model("deepseek-v3")
    assert kernel_dtype(ds, "fp4", B200) == "nvfp4"
    assert kernel_dtype(ds, "fp4", H100) == "w4a16_mxfp4"
    with pytest.raises(ValueError, match="needs FP4 tensor cores; h100_sxm has none"):
        moe_forms.expert_time(np.full(8, 2.0), 7168, 2048, "nvfp4", H100)
    rows = pd.DataFrame({"dtype": ["nvfp4"], "m": [16], "n": [4096], "k": [4096],
                         "latency_us": [10.0]})
    with pytest.raises(ScenarioError, match="nvfp4 needs FP4 tensor cores"):
        check.predict_gemm(H100, rows)


def test_fp4_dense_weights_are_refused_on_hopper():
    s = _scenario("vllm-v1", "dgx-h100")
    s["model"]["weight_dtype"] = "fp4"
    with pytest.raises(ScenarioError, match="fp4 is not supported on h100_sxm"):
        simulator.run(simulator.load_scenario(s))


# -- fitted forms by hand ----------------------------------------------------------------

def test_fitted_nvfp4_gemm_by_hand():
    p = engines.shipped("b200", "vllm").gemm_for("fp4")
    m, n, k = 2048, 7168, 4096
    bw, peak, s = B200.hbm_bandwidth_Bps, B200.peak("fp4"), B200.sm_count
    tm, tn = p.tile_m, p.tile_n
    tiles = math.ceil(m / tm) * math.ceil(n / tn)
    rate = peak * p.compute_eff
    compute = min(math.ceil(tiles / s) * s * 2 * tm * tn * k / rate,
                  2 * m * n * k / rate + p.split_k_s)
    memory = (m * k * 0.5 + k * n * 0.5 + m * n * 2) / (bw * p.bandwidth_eff)
    mix = max(compute, memory) if p.overlap == math.inf else (
        compute ** p.overlap + memory ** p.overlap) ** (1 / p.overlap)
    quant = m * p.quant_row_sm_s / s + (m * k * 2.5 / (bw * p.quant_bandwidth_eff)
                                        if p.quant_bandwidth_eff else 0.0)
    want = p.launch_s + mix + (quant if p.quant_bandwidth_eff else 0.0)
    rows = pd.DataFrame({"dtype": ["nvfp4"], "m": [m], "n": [n], "k": [k]})
    got = check.predict_gemm(replace(B200, calibration=engines.shipped("b200", "vllm")), rows)
    assert got[0] == pytest.approx(want, rel=1e-12)


def test_fitted_moe_by_hand_one_expert():
    p: MoEParams = engines.shipped("b200", "trtllm").moe_for("nvfp4")
    gpu = engines.engine_gpu(B200, "trtllm")
    h, inter, rows = 7168, 2048, 64
    s, bw, peak = gpu.sm_count, gpu.hbm_bandwidth_Bps, gpu.peak("fp4")
    w = a = 0.5 + 1 / 16
    rate = peak * p.compute_eff
    compute = 0.0
    for n, k in ((2 * inter, h), (h, inter)):
        tiles = math.ceil(rows / p.tile_m) * math.ceil(n / p.tile_n)
        compute += math.ceil(tiles / s) * s * 2 * p.tile_m * p.tile_n * k / rate
    weights = 3 * inter * h * w
    acts = rows * (h * a + 2 * 2 * inter * 2 + 2 * inter * a + 2 * h * 2)
    memory = (weights + acts) / (bw * p.bandwidth_eff)
    mix = (max(compute, memory) if p.overlap == math.inf else
           (compute ** p.overlap + memory ** p.overlap) ** (1 / p.overlap))
    want = p.launch_s + (p.expert_sm_s + p.local_sm_s + rows * p.row_sm_s) / s + mix
    got = moe_forms.expert_time(np.array([float(rows)]), h, inter, "nvfp4", gpu)
    assert got == pytest.approx(want, rel=1e-12)


# -- held-back half and the roofline floor -----------------------------------------------

@needs_data
def test_fit_on_half_checks_on_the_other_half_b200_trtllm():
    table = bias.held_out("b200", "trtllm", ROOT, rows=150)
    assert set(table["family"]) >= {"gemm", "attention_context", "attention_generation",
                                    "nccl", "moe", "mla_context", "mla_generation"}
    assert (table["median_abs_error_pct"] <= HELD_OUT_TOLERANCE).all(), table
    assert (table["below_floor"] == 0).all(), table


DOC_FAMILIES = ("gemm", "attention_context", "attention_generation", "nccl",
                "vllm_custom_allreduce", "moe", "mla_context", "mla_generation", "alltoall")


@needs_data
@pytest.mark.slow
@pytest.mark.parametrize("gpu, engine", bias.fitted_pairs())
def test_fit_on_half_checks_on_the_other_half_every_pair_as_the_docs_say(gpu, engine):
    """`python benchmarks/validation/kernel_bias.py --rows 300`, the docs' bias-check table."""
    table = bias.held_out(gpu, engine, ROOT, rows=300).set_index("family")
    assert (table["median_abs_error_pct"] <= HELD_OUT_TOLERANCE).all(), table
    assert (table["below_floor"] == 0).all(), table
    row = next(r for r in _doc_table("only half 0). Median") if r[:2] == [gpu, engine])
    want = [f"{table.loc[f, 'median_abs_error_pct']:.1f} ({table.loc[f, 'bias_pct']:+.1f})"
            if f in table.index else "-" for f in DOC_FAMILIES]
    assert row[2:] == want


def test_the_ideal_calibration_is_the_roofline():
    """The floor check's reference: neutral forms equal FLOPs / peak vs bytes / BW."""
    cal = bias.ideal()
    assert cal.gemm_for("bf16") == GemmParams() and isinstance(cal, Calibration)
    t = forms.gemm_time(4096, 4096, 4096, cal.gemm_for("bf16"), B200.peak("bf16"),
                        B200.hbm_bandwidth_Bps, B200.sm_count, 2, 2, False)
    # 1 x 1 tiles in waves over 148 SMs: a 4e-6 share of idle slots.
    assert float(t) == pytest.approx(2 * 4096**3 / B200.peak("bf16"), rel=1e-5)


def _doc_table(title: str) -> list[list[str]]:
    """The rows of the first markdown table after the line ``title`` in docs/cost-model.md."""
    text = (REPO / "docs" / "cost-model.md").read_text()
    after = text[text.index(title) + len(title):]
    rows = []
    for line in after.splitlines()[1:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows[2:]


def test_the_docs_figures_table_is_what_the_calibrations_say():
    rows = _doc_table("What each calibration says")
    assert len(rows) == len(bias.FIGURE_ROWS)
    for row, (gpu, profile) in zip(rows, bias.FIGURE_ROWS, strict=True):
        f = bias.figures(engines.engine_gpu(load_gpu(gpu), profile))
        want = [gpu, profile, f"{f['allreduce_bus_GBps']:.0f}",
                f"{f['gemm_bf16_peak_fraction']:.2f}", f"{f['mla_decode_layer_us']:.1f}",
                f"{f['deepep_ll_dispatch_launch_us']:.1f}",
                "-" if math.isnan(f["nvfp4_over_fp8_experts"])
                else f"{f['nvfp4_over_fp8_experts']:.2f}"]
        assert row == want, (row, want)


@pytest.mark.slow
@pytest.mark.parametrize("name, ttft_ms, tpot_ms", [("b200-70b", 42, 7.6),
                                                    ("b200-dsv3", 70, 19.5)])
def test_the_b200_cases_the_docs_quote(name, ttft_ms, tpot_ms):
    path = REPO / "benchmarks" / "docs" / "engine_kernels" / f"{name}.toml"
    s = simulator.load_scenario(str(path))
    summary = simulator.run(s).summary
    assert round(summary["ttft_mean_s"] * 1e3) == ttft_ms
    assert round(summary["tpot_mean_s"] * 1e3, 1) == tpot_ms


def test_a_users_own_calibration_wins_over_the_shipped_fit(tmp_path):
    text = (REPO / "topologies" / "gpus" / "b200.toml").read_text()
    path = tmp_path / "my_b200.toml"
    path.write_text(text + '\n[calibration]\nsource = "my fit"\n'
                           '[calibration.gemm.bf16]\ncompute_eff = 0.5\n')
    mine = load_gpu(str(path))
    sel = engines.engine_gpu(mine, "trtllm")
    assert sel.calibration.gemm_for("bf16").compute_eff == 0.5
    assert sel.calibration.source.startswith("no trtllm fit of b200: the GPU file's own")


@pytest.mark.slow
@pytest.mark.skipif(not (REPO.parent / "shared" / "validation").is_dir(),
                    reason="../shared/validation absent")
def test_the_end_to_end_table_the_docs_quote():
    script = REPO / "benchmarks" / "validation" / "validation_e2e.py"
    out = subprocess.run([sys.executable, str(script),
                          "--per-group", "4", "--max-concurrency", "64"],
                         capture_output=True, text=True, check=True, timeout=3000).stdout
    # the mode cell is exactly "agg" ("disagg" rows belong to docs/disaggregation.md)
    rows = [line for line in out.splitlines()
            if line.startswith("| ") and line.split("|")[3].strip() == "agg"]
    doc = (REPO / "docs" / "cost-model.md").read_text()
    assert len(rows) >= 5 and all(r in doc for r in rows), rows
