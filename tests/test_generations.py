"""GPU generations: the per-generation keys of the GPU files, the transfer rules, and
``calibrate fit`` on a user's own measurements (a random half of the H100 data standing in
for a GPU we do not ship)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from simulator.calibration import check, fit
from simulator.calibration.params import Calibration
from simulator.hardware.specs import load_gpu
from simulator.paths import ROOT

DATA = ROOT / "simulator" / "calibration" / "data" / "h100_sxm"
#: The H100 targets (docs/cost-model.md, tests/test_calibration.py): median, p90 of |error| %.
TARGETS = {"gemm": (10, 25), "attention_context": (10, 26),
           "attention_generation": (10, 26), "nccl all_reduce": (10, 25)}


@pytest.fixture(scope="module")
def halves() -> tuple[dict[str, pd.DataFrame], dict[str, pd.DataFrame]]:
    """Each family split at random (fixed seed) into a fitting half and a checking half;
    the large families subsampled (1,500 rows to fit, 3,000 to check) to stay fast."""
    rng = np.random.default_rng(17)
    fit_on, check_on = {}, {}
    for family, df in check.load_data(DATA).items():
        order = rng.permutation(len(df))
        a, b = df.iloc[order[: len(df) // 2]], df.iloc[order[len(df) // 2:]]
        if len(df) > 5000:
            a, b = a.iloc[:1500], b.iloc[:3000]
        fit_on[family], check_on[family] = a, b
    return fit_on, check_on


def _errors(gpu, data) -> pd.DataFrame:
    report = check.check(gpu, data)
    return pd.concat([check.summarize(report), check.breakdown(report)])


def test_fit_on_half_brings_every_family_within_the_h100_targets_on_the_other(halves):
    fit_on, check_on = halves
    # A "new" GPU: the H100's datasheet numbers, no calibration (every form at its roofline).
    new = replace(load_gpu("h100_sxm"), calibration=Calibration())
    before = _errors(new, check_on)
    fitted = replace(new, calibration=fit.fit(new, fit_on, "half of the H100 data"))
    after = _errors(fitted, check_on)
    for family, (median, p90) in TARGETS.items():
        assert after.loc[family, "median_abs_error_pct"] <= median, family
        assert after.loc[family, "p90_abs_error_pct"] <= p90, family
        # The fit did the work: the uncalibrated forms miss by more (kernels by far more).
        assert before.loc[family, "median_abs_error_pct"] > after.loc[
            family, "median_abs_error_pct"] * (3 if family != "nccl all_reduce" else 1.2)


def test_every_shipped_gpu_names_a_known_generation():
    from simulator.calibration.generations import GENERATIONS
    for name in ("a100_sxm", "h100_sxm", "h200_sxm", "b200", "gb200", "l40s"):
        assert load_gpu(name).generation in GENERATIONS, name
    assert not GENERATIONS["ampere"]["nvls"] and GENERATIONS["blackwell"]["nvlink"] == 5


def test_sm_second_costs_carry_over_by_clock_and_nothing_else_does():
    h100, a100, h200 = load_gpu("h100_sxm"), load_gpu("a100_sxm"), load_gpu("h200_sxm")
    factor = h100.boost_clock_hz / a100.boost_clock_hz  # 1.98 / 1.41 GHz
    ref, car = h100.calibration.decode_for("bf16"), a100.calibration.decode_for("bf16")
    assert car.seq_sm_s == pytest.approx(ref.seq_sm_s * factor, rel=1e-12)
    assert car.seq_head_sm_s == pytest.approx(ref.seq_head_sm_s * factor, rel=1e-12)
    assert (car.floor_s, car.bandwidth_eff) == (ref.floor_s, ref.bandwidth_eff)
    g_ref, g_car = h100.calibration.gemm_for("fp8"), a100.calibration.gemm_for("fp8")
    assert g_car.quant_row_sm_s == pytest.approx(g_ref.quant_row_sm_s * factor, rel=1e-12)
    assert (g_car.launch_s, g_car.compute_eff) == (g_ref.launch_s, g_ref.compute_eff)
    assert h200.calibration.prefill_for("bf16") == h100.calibration.prefill_for("bf16")


def test_a_node_cannot_claim_nvls_on_a_generation_without_it(tmp_path):
    from simulator.errors import ScenarioError
    from simulator.hardware.specs import load_node
    from simulator.paths import TOPOLOGIES
    text = (TOPOLOGIES / "dgx-a100.toml").read_text()
    text = text.replace("in_switch_reduction = false", "in_switch_reduction = true")
    text = text.replace('gpu = "a100_sxm"', f'gpu = "{TOPOLOGIES / "gpus" / "a100_sxm.toml"}"')
    (tmp_path / "my-a100.toml").write_text(text)
    with pytest.raises(ScenarioError, match=r"in_switch_reduction = true, but a100_sxm is "
                                            r"ampere"):
        load_node("my-a100.toml", tmp_path)
    assert not load_node("dgx-a100").scale_up.in_switch_reduction
    assert load_node("hgx-b200").scale_up.in_switch_reduction


def _vidur_check():
    """benchmarks/docs/generations/vidur_check.py as a module (benchmarks/ is not a package)."""
    import importlib.util
    path = ROOT / "benchmarks" / "docs" / "generations" / "vidur_check.py"
    spec = importlib.util.spec_from_file_location("vidur_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_vidur_comparison_prices_each_family_at_the_hand_computed_roofline():
    vc = _vidur_check()
    # An uncalibrated A100 (every form at its plain roofline) on one row of each family.
    gpu = replace(load_gpu("a100_sxm"), calibration=Calibration())
    data = {
        "gemm": pd.DataFrame({"gpu": ["a100"], "model": ["x"], "op": ["o"], "tp": [1],
                              "m": [1], "n": [8192], "k": [8192], "latency_us": [100.0]}),
        "attention": pd.DataFrame({
            "gpu": ["a100", "a100"], "phase": ["prefill", "decode"], "batch_size": [1, 8],
            "q_len": [4096, 1], "kv_len": [0, 1023], "num_heads": [32, 32],
            "num_key_value_heads": [4, 4], "head_dim": [128, 128],
            "latency_us": [400.0, 10.0]}),
        "all_reduce": pd.DataFrame({"gpu": ["a100"], "num_gpus": [8],
                                    "message_bytes": [64 * 2**20], "latency_us": [500.0]}),
    }
    report = vc.compare({"a100": gpu}, data).set_index("regime")
    bw, peak = 2.039e12, 312e12
    # GEMV: the 8192 x 8192 fp16 weight, the input row and the output row from HBM.
    gemm = (2 * 8192 * 8192 + 2 * 2 * 8192) / bw
    # Causal prefill of 4,096 tokens, 32 heads of 128: 4 d FLOPs per (query, key) pair.
    prefill = 4 * 32 * 128 * (4096 * 4097 / 2) / peak
    # Decode: 8 sequences read 1,024 K/V entries each (4 KV heads x 128 x 2 x 2 bytes), and
    # move their Q, O (32 heads) and new K/V.
    decode = (8 * 1024 * 2048 + 8 * (2 * 32 * 128 * 2 + 2048)) / bw
    # NCCL ring on NVSwitch 2 (no NVLS), default collective parameters: 5.2 us launch,
    # 14 steps of 0.8 us (two 0.4 us hops), 2 (n-1)/n of the buffer at 75% of 300 GB/s.
    ring = 5.2e-6 + 14 * 0.8e-6 + 2 * 7 / 8 * 64 * 2**20 / (300e9 * 0.75)
    for regime, seconds, measured in (("gemm m<=64", gemm, 100.0),
                                      ("attention prefill", prefill, 400.0),
                                      ("attention decode", decode, 10.0),
                                      ("all_reduce >=16MiB", ring, 500.0)):
        row = report.loc[regime]
        assert row["predicted_us"] == pytest.approx(seconds * 1e6, rel=1e-9), regime
        assert row["error_pct"] == pytest.approx((seconds * 1e6 / measured - 1) * 100), regime


def test_vidur_summary_and_generation_ratio_on_hand_made_rows():
    vc = _vidur_check()
    # Two GEMM shapes timed on both GPUs: measured A100/H100 ratios 3 and 2, ours 2.4 and 2.
    report = pd.DataFrame({
        "gpu": ["a100", "a100", "h100", "h100"], "family": "gemm", "regime": "gemm mid",
        "model": "x", "op": "o", "tp": 1, "m": [128, 256, 128, 256], "n": 1024, "k": 1024,
        "latency_us": [30.0, 20.0, 10.0, 10.0], "predicted_us": [24.0, 30.0, 10.0, 15.0]})
    report["error_pct"] = (report["predicted_us"] / report["latency_us"] - 1) * 100
    summary = vc.summarize(report)
    # A100 errors -20% and +50%: median |error| 35%, signed median +15%; H100 0% and +50%.
    assert summary.loc[("a100", "gemm"), "median_abs_error_pct"] == pytest.approx(35.0)
    assert summary.loc[("a100", "gemm"), "signed_median_error_pct"] == pytest.approx(15.0)
    assert summary.loc[("h100", "gemm"), "signed_median_error_pct"] == pytest.approx(25.0)
    ratio = vc.generation_ratio(report).loc["gemm mid"]
    # Ratio errors 2.4 / 3 - 1 = -20% and 2 / 2 - 1 = 0%.
    assert ratio["pairs"] == 2
    assert ratio["measured_ratio"] == pytest.approx(2.5)
    assert ratio["model_ratio"] == pytest.approx(2.2)
    assert ratio["median_abs_ratio_error_pct"] == pytest.approx(10.0)
    assert ratio["signed_ratio_error_pct"] == pytest.approx(-10.0)
    # A shape timed on one GPU only pairs with nothing.
    assert vc.generation_ratio(report[report["gpu"] == "a100"]).empty


def test_vidur_nccl_diagnostic_recovers_a_known_factor():
    vc = _vidur_check()
    a100 = load_gpu("a100_sxm")
    rows = pd.DataFrame({"gpu": "a100", "num_gpus": [2, 4, 8, 8, 2, 4],
                         "message_bytes": [2**20, 4 * 2**20, 16 * 2**20, 64 * 2**20,
                                           32 * 2**20, 8 * 2**20], "latency_us": 1.0})
    # Rows "measured" on an A100 whose NCCL reaches 70% of the efficiencies we carry over.
    slower = vc.with_nccl_factor(a100, 0.7)
    assert slower.calibration.collectives.ring_eff == pytest.approx(
        0.7 * a100.calibration.collectives.ring_eff)
    rows["latency_us"] = vc.predict_all_reduce(slower, rows) * 1e6
    assert vc.fit_nccl_factor(a100, rows) == pytest.approx(0.7)
    split = vc.nccl_split_check(a100, rows)
    assert split["factor"] == pytest.approx(0.7) and split["after_pct"] < 1e-9
    assert split["before_pct"] > 10
