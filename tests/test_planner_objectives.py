"""The power model, energy and cost metrics, and the planner's objectives (per GPU, per
dollar, per joule)."""

import math

import numpy as np
import pandas as pd
import pytest

import simulator
from simulator.hardware.prices import GPU_HOUR_USD, gpu_hour_usd
from simulator.hardware.specs import load_gpu, load_node
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


def test_spread_replicas_power_both_nodes():
    """Two TP1 replicas spread over two DGX nodes: both nodes draw their overhead, and 14
    GPUs idle."""
    r = simulator.run(small(cluster={"nodes": 2}, workload={"num_requests": 20}))
    g, ts = r.gpu_timeseries, r.timeseries
    assert sorted(g["gpu"].unique() // 8) == [0, 1]
    width = float(ts["window_end_s"].iloc[0] - ts["window_start_s"].iloc[0])
    rest = (14 * 80.0 + 2 * NODE_OVERHEAD_W) * width * len(ts)
    assert r.summary["energy_j"] == pytest.approx(float(g["power_w"].sum()) * width + rest)


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


# --- The planner: objectives, node kinds, rank correlation ---------------------------------

from test_planner import SMALL_TOML  # noqa: E402

from simulator.planner import plan  # noqa: E402
from simulator.planner.kinds import plan_kinds  # noqa: E402
from simulator.planner.objectives import est_power_w, spearman  # noqa: E402
from simulator.planner.ranking import rank_key  # noqa: E402
from simulator.planner.report import RECOMMENDED, format_plan, write_plan  # noqa: E402

# The small 8B question of test_planner.py.
PLAN_TOML = SMALL_TOML.format(model="llama-3.1-8b", tpot=0.05)


def test_spearman_by_hand():
    a = pd.Series([1.0, 2.0, 3.0, 4.0])
    assert spearman(a, a * 10) == pytest.approx(1.0)
    assert spearman(a, -a) == pytest.approx(-1.0)
    # Ranks (1, 2, 3, 4) against (1, 3, 2, 4): rho = 1 - 6 * 2 / (4 * 15) = 0.8.
    assert spearman(a, pd.Series([1.0, 3.0, 2.0, 4.0])) == pytest.approx(0.8)
    assert math.isnan(spearman(a[:2], a[:2]))  # too few points
    assert math.isnan(spearman(a, pd.Series([5.0] * 4)))  # constant


def test_estimated_power_by_hand():
    node = load_node("dgx-h100")
    # 2 of 8 GPUs at activity 0.5: 2 x (80 + 620 x 0.5) + 6 x 80 + 2300 W.
    assert est_power_w(node, 2, 0.5) == pytest.approx(2 * 390 + 480 + 2300)
    assert est_power_w(node, 9, 2.0) == pytest.approx(9 * 700 + 7 * 80 + 2 * 2300)


def test_objectives_change_the_pick_in_a_constructed_table():
    base = {"status": "ok", "slo_met": True, "tpot_slo_q_s": 0.01, "ttft_slo_q_s": 0.1,
            "gpus": 1, "tp": 1, "pp": 1, "dp": 1, "max_num_seqs": 64,
            "max_num_batched_tokens": 2048, "chunk_size": pd.NA}
    fast = {**base, "goodput_req_per_s_per_gpu": 10.0, "goodput_req_per_usd": 10 * 3600 / 6.0,
            "tokens_per_joule": 0.3}
    cheap = {**base, "tp": 2, "gpus": 1, "goodput_req_per_s_per_gpu": 8.0,
             "goodput_req_per_usd": 8 * 3600 / 2.7, "tokens_per_joule": 0.2}
    frugal = {**base, "tp": 4, "gpus": 1, "goodput_req_per_s_per_gpu": 5.0,
              "goodput_req_per_usd": 5 * 3600 / 6.0, "tokens_per_joule": 0.5}
    table = pd.DataFrame([fast, cheap, frugal])

    def pick(objective):
        return min(range(3), key=lambda i: rank_key(objective)(table.iloc[i]))

    assert pick("goodput_per_gpu") == 0
    assert pick("goodput_per_usd") == 1
    assert pick("tokens_per_joule") == 2


@pytest.fixture(scope="module")
def kinds_scenario(tmp_path_factory):
    path = tmp_path_factory.mktemp("p21") / "plan.toml"
    path.write_text(PLAN_TOML)
    return str(path)


@pytest.fixture(scope="module")
def by_usd(kinds_scenario):
    return plan_kinds(kinds_scenario, ["dgx-h100", "dgx-a100"], gpus=2, top=3,
                      requests=None, jobs=1, objective="goodput_per_usd")


def test_price_objective_picks_the_cheaper_kind(kinds_scenario, by_usd):
    per_gpu = plan_kinds(kinds_scenario, ["dgx-h100", "dgx-a100"], gpus=2, top=3,
                         requests=None, jobs=1)
    assert set(by_usd.table["node"]) == {"dgx-h100", "dgx-a100"}
    # Per GPU the H100 wins (one H100 serves the load); per dollar the A100 at 44% of the
    # price does.
    assert per_gpu.best["node"] == "dgx-h100"
    assert by_usd.best["node"] == "dgx-a100"
    t = by_usd.table
    best_h100 = t[(t["node"] == "dgx-h100") & t["slo_met"]].iloc[0]
    assert by_usd.best["goodput_req_per_usd"] > best_h100["goodput_req_per_usd"]
    # goodput per USD = goodput per GPU x 3600 / price, from the run.
    assert by_usd.best["goodput_req_per_usd"] == pytest.approx(
        by_usd.best["goodput_req_per_s_per_gpu"] * 3600 / (21.60 / 8))
    assert "over the best dgx-h100 layout" in by_usd.comparison


def test_rank_correlation_reported(by_usd):
    rho = by_usd.rank_correlation
    assert -1.0 <= rho <= 1.0
    assert f"{rho:.2f}" in format_plan(by_usd)
    assert "rank correlation" in format_plan(by_usd)


def test_recommended_scenario_of_a_kinds_plan_runs(by_usd, tmp_path):
    write_plan(by_usd, tmp_path, figure=True)
    assert (tmp_path / "pareto.png").stat().st_size > 0
    csv = pd.read_csv(tmp_path / "plan.csv")
    assert {"node", "binds", "goodput_req_per_usd", "slo_attainment"} <= set(csv.columns)
    s = simulator.load_scenario(str(tmp_path / RECOMMENDED))
    assert s.cluster.topology == by_usd.best["node"]
    res = simulator.run(s)
    assert res.summary["requests_completed"] == res.summary["requests_total"]


def test_tokens_per_joule_objective_measures_energy(kinds_scenario):
    r = plan(kinds_scenario, gpus=2, top=2, requests=None, jobs=1,
             objective="tokens_per_joule")
    ok = r.table[r.table["status"] == "ok"]
    assert ok["tokens_per_joule"].notna().all()
    assert (ok["tokens_per_joule"] == 1 / ok["energy_per_output_token_j"]).all()
    met = ok[ok["slo_met"]]
    assert r.best["tokens_per_joule"] == met["tokens_per_joule"].max()


def test_deepseek_plan_finds_an_expert_parallel_layout_that_fits():
    """DeepSeek-V3 fp8 (671 B parameters, ~671 GB of weights) on one HGX H200 (8 x 141 GB):
    no layout of 4 GPUs or fewer (564 GB) holds it, the plan's pick meets the SLOs, and
    an EP layout is among the simulated ones that do."""
    r = plan("workloads/moe-deepseek-v3-2xh200.toml", gpus=8, top=2, requests=40, jobs=1,
             overrides=["cluster.nodes=1"])
    c = r.candidates
    small = c[c["gpus"] <= 4]
    assert len(small) and (small["status"] == "excluded").all()
    assert small["reason"].str.contains("GiB").all()
    assert r.best is not None and int(r.best["gpus"]) > 4
    t = r.table
    assert not t[(t["ep"] > 1) & t["slo_met"]].empty
    assert {"est_objective", "binds", "cost_per_million_output_tokens_usd"} <= set(t.columns)
    assert t["gpu_hour_usd"].to_numpy() == pytest.approx([50.44 / 8] * len(t))


def test_disaggregated_candidates_appear_with_disagg(kinds_scenario, tmp_path):
    r = plan_kinds(kinds_scenario, ["dgx-h100"], gpus=2, top=2, requests=None, jobs=1,
                   disagg=True)
    c = r.candidates
    assert set(c["kind"]) == {"colocated", "disaggregated"}
    dis = c[(c["kind"] == "disaggregated") & (c["status"] == "feasible")]
    assert len(dis) and (dis["node"] == "dgx-h100").all()
    files = write_plan(r, tmp_path, figure=False)
    assert tmp_path / "plan.csv" in files
    assert "disaggregated" in set(r.table["kind"])
    assert "prefill TP1 PP1 DP1 + decode" in format_plan(r)
