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
