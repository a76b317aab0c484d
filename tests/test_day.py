"""A day in production: SLO attainment per window and the worst window, the sla policy's
capacity from the cost model, compare --day, and sweeps of autoscaling and gateway keys."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from simulator import load_scenario, run, sweep, write_result
from simulator.cli import main
from simulator.cluster import running
from simulator.cluster.pools import build_plan
from simulator.cluster.sizing import replica_sizing
from simulator.errors import ScenarioError
from simulator.io.scenario import read_toml
from simulator.metrics.day import AUTOSCALE_SUMMARY_KEYS, attainment_by_window, worst_window
from simulator.printout import format_summary
from simulator.sweep import parse_grid
from tests.test_autoscale import LOAD, _scenario
from tests.test_gateway import TWO
from tests.test_gateway import _scenario as gateway_scenario

ROOT = Path(__file__).resolve().parent.parent


def _table(rows):
    return pd.DataFrame(rows, columns=["arrival_s", "status", "ttft_s", "tpot_s"])


def test_attainment_per_window_by_hand():
    # SLOs: TTFT <= 1 s, TPOT <= 0.1 s. Window [0, 10): 3 arrivals, 2 met (the one-token
    # reply has no TPOT and meets them); [10, 20): none; [20, 30): a late and a rejected one.
    req = _table([(1.0, "completed", 0.5, 0.05), (2.0, "completed", 0.5, np.nan),
                  (9.0, "completed", 0.5, 0.2), (21.0, "completed", 2.0, 0.05),
                  (25.0, "rejected", np.nan, np.nan)])
    n, att = attainment_by_window(req, np.array([0.0, 10.0, 20.0, 30.0]), 1.0, 0.1)
    assert n.tolist() == [3, 0, 2]
    assert att[0] == pytest.approx(2 / 3) and math.isnan(att[1]) and att[2] == 0.0
    worst = worst_window(req, 10.0, 1.0, 0.1)
    assert worst == {"slo_window_s": 10.0, "slo_attainment_worst_window": 0.0,
                     "slo_attainment_worst_window_start_s": 20.0}
    # Wider windows: [0, 20) 2 of 3, [20, 40) 0 of 2; the windows without arrivals never win.
    assert worst_window(req.iloc[:3], 20.0, 1.0, 0.1)["slo_attainment_worst_window"] == \
        pytest.approx(2 / 3)


def test_an_autoscaled_run_reports_attainment_per_window_and_its_worst():
    # A step from 4 to 300 req/s at 120 s: one replica is swamped until the new ones are
    # warm, so the worst policy interval is in the step's first seconds.
    r = run(load_scenario(_scenario(LOAD, rates=(4.0, 300.0, 4.0), at=(0, 120, 200),
                                    duration=300.0)))
    s, ts, req = r.summary, r.timeseries, r.requests
    n, att = ts["arrivals"].to_numpy(), ts["slo_attainment"].to_numpy()
    # The arrivals-weighted mean of the windows is the run's attainment.
    assert np.nansum(att * n) / n.sum() == pytest.approx(s["slo_attainment"])
    assert s["slo_window_s"] == LOAD["interval_s"]
    start = s["slo_attainment_worst_window_start_s"]
    assert 120.0 <= start < 160.0
    inside = req[(req["arrival_s"] >= start) & (req["arrival_s"] < start + 20.0)]
    met = ((inside["status"] == "completed") & (inside["ttft_s"] <= r.scenario.slo.ttft_s)
           & (inside["tpot_s"] <= r.scenario.slo.tpot_s))
    assert s["slo_attainment_worst_window"] == pytest.approx(met.mean())
    assert s["slo_attainment_worst_window"] < s["slo_attainment"]
    # The requests that arrived while a replica cold-started: from a scale-up decision
    # (every 20 s) until that replica serves, 10 s of provisioning + the weights + 5 s later.
    scaler = _autoscaler_of(r.scenario)
    spans = scaler.cold_start_spans()
    cold = scaler.log.cold_starts_s
    assert len(spans) == len(cold) == s["autoscale_scale_ups"] >= 1
    assert spans[0] == pytest.approx((140.0, 140.0 + cold[0]))
    arr = req["arrival_s"].to_numpy()
    during = np.zeros(len(req), dtype=bool)
    for a, b in spans:
        during |= (arr >= a) & (arr < b)
    assert s["autoscale_requests_in_cold_starts"] == during.sum() > 0
    ok = ((req["status"] == "completed") & (req["ttft_s"] <= r.scenario.slo.ttft_s)
          & (req["tpot_s"] <= r.scenario.slo.tpot_s)).to_numpy()
    assert s["autoscale_cold_start_slo_attainment"] == pytest.approx(ok[during].mean())
    text = format_summary("as", s, req)
    assert (f"arrived during cold starts     {during.sum():,} requests, "
            f"{ok[during].mean():.1%} within the SLOs") in text
    assert (f"SLO attainment, worst window   {s['slo_attainment_worst_window']:.1%} (the 20 s "
            f"from t = {start:,.0f} s; {s['slo_attainment']:.1%} over the run)") in text


def _70b(workload: dict, dp: int, autoscale: dict | None = None) -> dict:
    out = {"name": "flat", "seed": 1, "model": {"name": "llama-3.1-70b"},
           "cluster": {"topology": "dgx-h100", "nodes": max(1, dp // 2)},
           "parallel": {"tp": 4, "dp": dp}, "router": {"policy": "least_outstanding"},
           "workload": {"duration_s": 300.0, "prompt_tokens": 1024, "output_tokens": 256}
           | workload, "output": {"steps": False}}
    return out | ({"autoscale": autoscale} if autoscale else {})


def test_the_cost_models_capacity_is_what_one_replica_serves_within_the_slos():
    # Llama-3.1-70B TP4 on H100, 1024 + 256 tokens, TTFT <= 2 s, TPOT <= 0.1 s: a
    # one-replica run keeps its SLOs at 90% of the estimate and misses them at 110%.
    s = load_scenario(_70b({"arrival": "poisson", "rate_per_s": 1.0}, dp=1))
    est = replica_sizing(build_plan(s), 1024, 256, s.slo.ttft_s, s.slo.tpot_s)
    assert est.slo_met and 0.9 * est.bound_per_s < est.capacity_per_s < est.bound_per_s
    # docs/autoscaling.md quotes them: 10.1 req/s within the SLOs, 10.7 the bound.
    assert round(est.capacity_per_s, 1) == 10.1 and round(est.bound_per_s, 1) == 10.7
    for factor, keeps in ((0.9, True), (1.1, False)):
        got = run(load_scenario(_70b({"arrival": "poisson",
                                      "rate_per_s": factor * est.capacity_per_s}, dp=1)))
        attained = got.summary["slo_attainment"]
        assert (attained >= 0.99) if keeps else (attained < 0.5), (factor, attained)


def test_slos_no_load_meets_leave_the_throughput_bound():
    # A TPOT of 1 ms is below one decode step of a 70B replica at any batch: the estimate
    # then sizes with the throughput bound (and the latency correction does the rest).
    s = load_scenario(_70b({"arrival": "poisson", "rate_per_s": 1.0}, dp=1))
    plan = build_plan(s)
    loose = replica_sizing(plan, 1024, 256, 2.0, 0.1)
    tight = replica_sizing(plan, 1024, 256, 2.0, 0.001)
    assert not tight.slo_met and tight.capacity_per_s == tight.bound_per_s
    assert tight.bound_per_s == pytest.approx(loose.bound_per_s)  # the bound has no SLO


SLA = {"policy": "sla", "min_replicas": 1, "max_replicas": 4, "interval_s": 30.0,
       "forecaster": "moving_average", "window": 3, "cooldown_down_s": 0.0,
       "provision_s": 5.0, "graph_capture_s": 5.0}


def test_a_flat_load_with_sla_sized_by_the_cost_model_settles():
    # 20 req/s, constant: the policy sizes for ceil(20 / (capacity x 0.8)) replicas, the
    # capacity the cost model's (no replica_capacity_per_s), and then stops scaling. The
    # backlog the single first replica gathers before the others are warm misses the TTFT
    # SLO, so the latency correction asks for a fourth replica for a while; once the
    # backlog is served the count goes back to 3 and stays there.
    s = load_scenario(_70b({"arrival": "constant", "rate_per_s": 20.0, "duration_s": 600.0},
                           dp=4, autoscale=SLA))
    cap = replica_sizing(build_plan(s), 1024, 256, s.slo.ttft_s, s.slo.tpot_s).capacity_per_s
    want = math.ceil(20.0 / (cap * 0.8))
    assert want == 3
    scaler = _autoscaler_of(s)
    assert scaler.policy.capacity_per_s == pytest.approx(cap)
    decisions = [n for t, n, _ in scaler.log.decisions if t >= 150.0]
    assert len(decisions) == 16 and set(decisions) == {want}  # after the warm-up: constant
    assert max(t for t, _, _ in scaler.log.changes) < 160.0  # no scaling after it
    assert scaler.state.count("serving") == want
    assert max(n for _, n, _ in scaler.log.decisions) == want + 1


def _autoscaler_of(s):
    captured = {}
    real = running.Autoscaler

    class Spy(real):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            captured["scaler"] = self

    running.Autoscaler = Spy
    try:
        captured["result"] = run(s)
    finally:
        running.Autoscaler = real
    return captured["scaler"]


def test_an_explicit_capacity_overrides_the_cost_model():
    # 6 req/s: one replica by the cost model (about 10 req/s each), three by a stated
    # capacity of 3 req/s: ceil(6 / (3 x 0.8)).
    for capacity, want in ((None, 1), (3.0, 3)):
        keys = SLA | ({"replica_capacity_per_s": capacity} if capacity else {})
        s = load_scenario(_70b({"arrival": "constant", "rate_per_s": 6.0}, dp=4,
                               autoscale=keys))
        scaler = _autoscaler_of(s)
        assert (scaler.sizing is None) == (capacity is not None)
        assert {n for _, n, _ in scaler.log.decisions} == {want}


def test_compare_day_puts_static_and_autoscaled_days_side_by_side(tmp_path, capsys):
    # The step day of the tests three ways: a static fleet for the peak (4 replicas), one
    # for less (2 replicas) and the load policy between 1 and 4.
    base = _scenario(LOAD, rates=(4.0, 300.0, 4.0), at=(0, 120, 200), duration=300.0)
    static = {k: v for k, v in base.items() if k != "autoscale"}
    runs = {"peak": static, "mean": static | {"parallel": {"tp": 2, "dp": 2}},
            "scaled": base}
    results = {}
    for name, sc in runs.items():
        results[name] = run(load_scenario(sc))
        write_result(results[name], tmp_path / name)
    folders = [str(tmp_path / n) for n in runs]
    assert main(["compare", "--day", *folders, "--out", str(tmp_path / "cmp")]) == 0
    table = pd.read_csv(tmp_path / "cmp" / "compare_day.csv").set_index("metric")
    peak, scaled = results["peak"].summary, results["scaled"].summary
    hours = peak["simulated_time_s"] / 3600
    assert table.loc["day_gpu_hours", "peak"] == pytest.approx(8 * hours)
    assert table.loc["day_cost_usd", "peak"] == pytest.approx(8 * hours * peak["gpu_hour_usd"])
    assert table.loc["day_gpu_hours", "scaled"] == pytest.approx(scaled["autoscale_gpu_hours"])
    assert table.loc["day_gpu_hours", "scaled"] < table.loc["day_gpu_hours", "peak"]
    assert table.loc["day_cold_starts", "peak"] == 0
    assert table.loc["day_cold_starts", "scaled"] == scaled["autoscale_scale_ups"] > 0
    assert table.loc["day_replicas_mean", "mean"] == 2
    # Every run's worst window over the autoscaled run's 20 s windows.
    for name in ("peak", "mean"):
        r = results[name]
        want = worst_window(r.requests, 20.0, r.scenario.slo.ttft_s, r.scenario.slo.tpot_s)
        assert table.loc["slo_attainment_worst_window", name] == pytest.approx(
            want["slo_attainment_worst_window"])
    assert table.loc["slo_attainment_worst_window", "scaled"] == pytest.approx(
        scaled["slo_attainment_worst_window"])
    text = capsys.readouterr().out
    assert "GPU-hours paid" in text and "cold starts" in text and "compare_day.csv" in text


def test_compare_day_needs_two_runs(tmp_path, capsys):
    assert main(["compare", "--day", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "compare --day: give at least two run folders" in err[0]


def test_the_day_grid_sweeps_policies_and_intervals():
    # workloads/day-70b-grid.toml over the first 20 minutes of the day: 4 deployments x 2
    # intervals, each row with what the day cost.
    base = read_toml(ROOT / "workloads" / "day-70b-diurnal.toml")
    base["workload"]["duration_s"] = 1200.0
    df = sweep(base, ROOT / "workloads" / "day-70b-grid.toml", jobs=1)
    assert len(df) == 8 and (df["status"] == "ok").all()
    assert set(AUTOSCALE_SUMMARY_KEYS) <= set(df.columns)
    hours = df["simulated_time_s"] / 3600
    static = df[df["autoscale.policy"] == "none"]
    # A static fleet pays all its GPUs (TP4: 4 per replica) for the whole run.
    np.testing.assert_allclose(static["autoscale_gpu_hours"],
                               4 * static["autoscale.initial_replicas"] * hours[static.index])
    assert (static["autoscale_scale_ups"] == 0).all()
    scaled = df[df["autoscale.policy"] != "none"]
    assert (scaled["autoscale_gpu_hours"] < static["autoscale_gpu_hours"].min()).all()
    sla = df[df["autoscale.policy"] == "sla"]
    assert sla["autoscale_replica_capacity_per_s"].notna().all()


def test_sweep_keys_of_autoscale_and_gateway():
    with pytest.raises(ScenarioError, match=r"autoscale\.polcy: unknown key \(did you mean "
                                            r"'policy'"):
        parse_grid({"autoscale.polcy": ["load"]})
    with pytest.raises(ScenarioError, match=r"gateway\.classes: not a key a sweep may vary"):
        parse_grid({"gateway.classes": [[]]})
    df = sweep(gateway_scenario(TWO, n=200), {"gateway.order": ["fcfs", "sjf"]}, jobs=1)
    assert (df["status"] == "ok").all()
    for c in ("critical", "batch"):
        assert (df[f"class_{c}_requests"] > 0).all()
    assert df["fairness_jain"].notna().all()
    assert (df["class_critical_requests"] + df["class_batch_requests"] == 200).all()
