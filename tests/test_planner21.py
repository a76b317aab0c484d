"""Issue #21: the power model, energy and cost metrics, and the planner's objectives."""

import math

import numpy as np
import pandas as pd
import pytest

import simulator
from simulator.hardware.prices import GPU_HOUR_USD, gpu_hour_usd
from simulator.hardware.specs import load_gpu
from simulator.metrics.power import NODE_OVERHEAD_W, cost_summary, gpu_power_w


def small(**over) -> dict:
    s = {"name": "p21", "seed": 3, "model": {"name": "llama-3.1-8b"},
         "cluster": {"topology": "dgx-h100", "nodes": 1},
         "parallel": {"tp": 1, "pp": 1, "dp": 2},
         "workload": {"arrival": "poisson", "rate_per_s": 20.0, "num_requests": 60,
                      "prompt_tokens": 400, "output_tokens": 60}}
    for k, v in over.items():
        s[k] = {**s.get(k, {}), **v}
    return s


def test_power_idle_at_zero_tdp_at_full_and_monotone():
    assert gpu_power_w(0.0, 0.0, 80.0, 700.0) == pytest.approx(80.0)
    assert gpu_power_w(1.0, 1.0, 80.0, 700.0) == pytest.approx(700.0)
    assert gpu_power_w(1.0, 0.0, 80.0, 700.0) == pytest.approx(700.0)  # saturated SMs
    # By hand: a = 1 - (1 - 0.1)(1 - 0.7) = 0.73 -> 80 + 620 * 0.73 = 532.6 W.
    assert gpu_power_w(0.1, 0.7, 80.0, 700.0) == pytest.approx(532.6)
    u = np.linspace(0, 1, 21)
    for other in (0.0, 0.3, 0.9):
        assert np.all(np.diff(gpu_power_w(u, other, 80.0, 700.0)) >= 0)
        assert np.all(np.diff(gpu_power_w(other, u, 80.0, 700.0)) >= 0)
    assert np.all(np.diff(gpu_power_w(u, 0.0, 80.0, 700.0)) > 0)  # grows with each
    assert gpu_power_w(2.0, 0.0, 80.0, 700.0) == pytest.approx(700.0)  # never beyond TDP


def test_presets_carry_power_and_prices():
    for name in GPU_HOUR_USD:
        g = load_gpu(name)
        assert 0 < g.idle_w < g.tdp_w, name
    assert load_gpu("h100_sxm").tdp_w == 700.0
    assert gpu_hour_usd("h100_sxm") == pytest.approx(49.24 / 8)
    assert gpu_hour_usd("h100_sxm", 2.0) == 2.0
    assert math.isnan(gpu_hour_usd("no_such_gpu"))


def test_cost_per_million_tokens_by_hand():
    req = pd.DataFrame({"status": ["completed"] * 2, "arrival_s": [0.0, 1.0],
                        "finish_s": [5.0, 3600.0], "output_tokens": [500_000, 500_000]})
    # 4 GPUs x $3/h x 1 h / 1 M tokens = $12 per million.
    out = cost_summary(req, 4, 3.0)
    assert out["cost_per_million_output_tokens_usd"] == pytest.approx(12.0)
    assert out["gpu_hour_usd"] == 3.0


@pytest.fixture(scope="module")
def run_small():
    return simulator.run(small())


def test_energy_conserved_over_gpus_and_windows(run_small):
    r = run_small
    s, g, ts = r.summary, r.gpu_timeseries, r.timeseries
    width = float(ts["window_end_s"].iloc[0] - ts["window_start_s"].iloc[0])
    used = g["gpu"].nunique()
    assert used == 2
    gpu_j = float(g["power_w"].sum()) * width
    windows = len(ts)
    # The other 6 GPUs of the node idle, plus the node's overhead, every window.
    rest_j = (6 * 80.0 + NODE_OVERHEAD_W) * width * windows
    assert s["energy_j"] == pytest.approx(gpu_j + rest_j, rel=1e-9)
    assert float(ts["power_w"].sum()) * width == pytest.approx(s["energy_j"], rel=1e-9)
    assert s["power_mean_w"] == pytest.approx(s["energy_j"] / (width * windows))
    assert (g["power_w"] >= 80.0 - 1e-9).all() and (g["power_w"] <= 700.0 + 1e-9).all()
    done = r.requests[r.requests["status"] == "completed"]
    assert s["energy_per_request_j"] == pytest.approx(s["energy_j"] / len(done))
    assert s["energy_per_output_token_j"] == pytest.approx(
        s["energy_j"] / done["output_tokens"].sum())
    # A busy run draws more than the idle floor of the node.
    assert s["power_mean_w"] > 8 * 80.0 + NODE_OVERHEAD_W


def test_cost_key_in_every_run_and_price_configurable(run_small):
    s = run_small.summary
    done = run_small.requests[run_small.requests["status"] == "completed"]
    span = done["finish_s"].max() - run_small.requests["arrival_s"].min()
    expect = 2 * (49.24 / 8) * span / 3600 / (done["output_tokens"].sum() / 1e6)
    assert s["cost_per_million_output_tokens_usd"] == pytest.approx(expect)
    cheap = simulator.run(small(cluster={"gpu_hour_usd": 1.0}))
    assert cheap.summary["gpu_hour_usd"] == 1.0
    assert cheap.summary["cost_per_million_output_tokens_usd"] == pytest.approx(
        expect / (49.24 / 8))
    # The price changes nothing else.
    for k in ("throughput_tok_per_s", "ttft_p99_s", "energy_j"):
        assert cheap.summary[k] == s[k]


def test_bad_price_is_one_clear_error():
    with pytest.raises(simulator.ScenarioError, match="cluster.gpu_hour_usd"):
        simulator.load_scenario(small(cluster={"gpu_hour_usd": -1.0}))
