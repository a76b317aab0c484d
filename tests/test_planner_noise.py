"""Answers within their noise: sectioning intervals on hand-made samples, the flag rule on
hand-made plan rows, and the intervals of real simulated points bracketing their value."""

from __future__ import annotations

import copy
import math

import numpy as np
import pandas as pd
import pytest

from simulator.planner import plan
from simulator.planner.nearmiss import SECTIONS, T_975, flags, quantile_ci, section_ci
from tests.test_planner import SMALL


def test_section_ci_by_hand():
    # sections of 100 values each, means 1..5: s = sqrt(2.5), h = t(0.975, 4) s / sqrt(5)
    v = np.repeat([1.0, 2.0, 3.0, 4.0, 5.0], 100)
    lo, hi = section_ci(v, lambda x: float(x.mean()))
    h = T_975[SECTIONS - 1] * math.sqrt(2.5) / math.sqrt(5)
    assert (lo, hi) == pytest.approx((3 - h, 3 + h), rel=1e-12)
    assert h == pytest.approx(1.9629, abs=1e-4)


def test_quantile_ci_needs_sections_longer_than_the_tail():
    rng = np.random.default_rng(0)
    assert math.isnan(quantile_ci(rng.exponential(size=499), 0.99)[0])  # < 5 x 100
    x = rng.exponential(size=5000)
    lo, hi = quantile_ci(x, 0.99)
    # i.i.d. exponential: the true p99 is ln(100) = 4.605, inside a 95% interval
    assert lo < math.log(100) < hi and hi - lo < 1.5
    x[4000:4020] = math.inf  # 2% of a section never finished: its p99 is unbounded
    assert quantile_ci(x, 0.99)[1] == math.inf


def _rows(**over) -> pd.DataFrame:
    base = {"rank": [1, 2], "slo_met": [True, True], "ttft_slo_q_s": [1.5, 1.0],
            "ttft_slo_q_lo_s": [1.2, 0.9], "ttft_slo_q_hi_s": [1.8, 1.1],
            "tpot_slo_q_s": [0.04, 0.03], "tpot_slo_q_lo_s": [0.035, 0.028],
            "tpot_slo_q_hi_s": [0.045, 0.032], "goodput_req_per_s_per_gpu": [2.0, 1.0],
            "goodput_req_per_s_per_gpu_ci_half": [0.1, 0.1]}
    base.update(over)
    return pd.DataFrame(base)


def test_a_clear_pick_is_not_flagged():
    says, again = flags(_rows(), 2.0, 0.05, 0.99, "goodput_req_per_s_per_gpu")
    assert says == [] and again == []


def test_a_pick_whose_interval_crosses_a_target_is_flagged():
    says, again = flags(_rows(tpot_slo_q_hi_s=[0.052, 0.032]), 2.0, 0.05, 0.99,
                        "goodput_req_per_s_per_gpu")
    assert again == [0]
    assert says == ["TPOT p99 0.04 s is within noise of the 0.05 s target "
                    "(95% CI 0.035 to 0.052 s)"]


def test_a_pick_within_noise_of_the_runner_up_is_flagged_with_it():
    t = _rows(goodput_req_per_s_per_gpu=[2.0, 1.85])  # 0.15 apart, 0.2 of noise
    says, again = flags(t, 2.0, 0.05, 0.99, "goodput_req_per_s_per_gpu")
    assert again == [0, 1] and "within noise of the runner-up (rank 2" in says[0]
    # an exact tie without spread (both serve all they are offered) is not noise
    t = _rows(goodput_req_per_s_per_gpu=[2.0, 2.0],
              goodput_req_per_s_per_gpu_ci_half=[0.0, 0.0])
    assert flags(t, 2.0, 0.05, 0.99, "goodput_req_per_s_per_gpu") == ([], [])


def test_simulated_points_carry_intervals_around_their_value():
    # 600 requests: sections of 120 >= the 100 a p99 needs
    r = plan(copy.deepcopy(SMALL), gpus=1, top=1, jobs=1, requests=600)
    row = r.table.iloc[0]
    for name in ("ttft", "tpot"):
        assert row[f"{name}_slo_q_lo_s"] <= row[f"{name}_slo_q_s"] <= row[f"{name}_slo_q_hi_s"]
    assert row["requests_total"] >= 600


def test_a_sample_too_small_to_section_says_so():
    says, again = flags(_rows(ttft_slo_q_hi_s=[math.nan, 1.1]), 2.0, 0.05, 0.99, None)
    assert says == ["no interval for the pick: p99 needs sections of 100 requests (500 in "
                    "all; raise --requests)"] and again == []
