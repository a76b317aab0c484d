"""Observability outputs: timeseries, alerts, Perfetto trace, plots."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from conftest import toy_scenario

import simulator
from simulator.cli import main


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    sc = toy_scenario(parallel={"pp": 2}, output={"window_s": 0.5},
                      workload={"arrival": "poisson", "rate_per_s": 20.0, "num_requests": 120,
                                "prompt_tokens": {"dist": "uniform", "min": 10, "max": 800},
                                "output_tokens": {"dist": "uniform", "min": 1, "max": 200}})
    res = simulator.run(sc)
    simulator.write_result(res, out)
    return out, res


def test_timeseries_totals_match_the_request_table(run_dir):
    out, res = run_dir
    ts = pd.read_csv(out / "timeseries.csv")
    req = res.requests
    done = req[req["status"] == "completed"]
    assert ts["arrivals"].sum() == len(req)
    assert ts["completions"].sum() == len(done)
    w = 0.5
    assert (ts["output_tok_per_s"] * w).sum() == pytest.approx(done["output_tokens"].sum())
    assert (ts["window_end_s"] - ts["window_start_s"]).round(9).eq(w).all()
    # Queue and running at each window end, recounted from the request table.
    t = ts["window_end_s"].to_numpy()[5]
    running = ((req["first_scheduled_s"] <= t) & (req["finish_s"] > t)).sum()
    assert ts["running"].iloc[5] == running
    assert ts["kv_util_r0"].between(0, 1).all()


def test_trace_json_has_one_span_per_step_and_request_phases(run_dir):
    out, res = run_dir
    trace = json.loads((out / "trace.json").read_text())
    ev = trace["traceEvents"]
    steps = [e for e in ev if e.get("cat") == "step"]
    assert len(steps) == len(res.steps)
    assert all(e["ph"] == "X" and e["dur"] >= 0 for e in steps)
    # Times are microseconds to the nanosecond, in the order the step table holds them.
    first = res.steps.iloc[0]
    assert steps[0]["ts"] == pytest.approx(first["start_s"] * 1e6, abs=5e-4)
    assert steps[0]["dur"] == pytest.approx((first["end_s"] - first["start_s"]) * 1e6, abs=1e-3)
    comm = [e for e in ev if e.get("cat") == "comm"]
    assert len(comm) == int((res.steps["comm_s"] > 0).sum())
    begins = [e for e in ev if e.get("cat") == "request" and e["ph"] == "b"]
    assert len(begins) == 4 * len(res.requests)  # request, queued, prefill, decode
    names = {e["args"]["name"] for e in ev if e["ph"] == "M"}
    assert {"replica 0", "stage 0", "stage 1"} <= names


def test_alerts_fire_under_overload_and_clear_after_recovery(tmp_path):
    rng = np.random.default_rng(3)
    # The toy replica prefills ~0.5 M tokens/s: 2,000 prompts of 3,000 tokens in under a
    # second need ~12 s, so TTFT climbs far past 2 s; then a calm stretch drains it.
    burst = np.cumsum(rng.exponential(1 / 3000.0, 2000))
    calm = burst[-1] + 20 + np.cumsum(rng.exponential(1 / 2.0, 60))
    pd.DataFrame({"arrival_s": np.concatenate([burst, calm]), "prompt_tokens": 3000,
                  "output_tokens": 50}).to_csv(tmp_path / "t.csv", index=False)
    sc = toy_scenario(workload={"arrival": "trace", "trace": str(tmp_path / "t.csv"),
                                "rate_per_s": None, "num_requests": None},
                      alerts={"ttft_p99_s": 2.0, "e2e_p99_s": 0, "batch_efficiency_min": 0})
    res = simulator.run(sc)
    al = res.alerts[(res.alerts["replica"] == "all") & (res.alerts["rule"] == "ttft_p99_above")]
    assert list(al["event"]) == ["fire", "clear"]
    fire, clear = al["time_s"].tolist()
    assert fire < clear
    # It fired while the queue was long and cleared once TTFT came back under 2 s.
    ts = res.timeseries
    assert ts.loc[ts["window_end_s"] == fire, "ttft_p99_s"].item() > 2.0
    assert ts.loc[ts["window_end_s"] == clear, "ttft_p99_s"].item() <= 2.0
    assert set(res.alerts["rule"]) == {"ttft_p99_above"}  # the disabled rules stay silent


def test_plot_command_writes_nonempty_pngs(run_dir, tmp_path, capsys):
    out, _ = run_dir
    assert main(["plot", str(out), "--out", str(tmp_path / "plots")]) == 0
    pngs = sorted((tmp_path / "plots").glob("*.png"))
    assert {p.name for p in pngs} >= {"latency_cdf.png", "timeseries.png", "pipeline_gantt.png"}
    assert all(p.stat().st_size > 5000 for p in pngs)
    # A sweep CSV
    sweep = simulator.sweep(toy_scenario(workload={"num_requests": 5}),
                            {"workload.rate_per_s": [1.0, 4.0], "parallel.tp": [1, 2]}, jobs=1,
                            out=tmp_path / "s.csv")
    assert len(sweep) == 4
    assert main(["plot", str(tmp_path / "s.csv"), "--x", "workload.rate_per_s",
                 "--y", "ttft_p50_s", "--hue", "parallel.tp", "--out", str(tmp_path)]) == 0
    png = tmp_path / "s_ttft_p50_s_vs_workload.rate_per_s.png"
    assert png.stat().st_size > 5000
    assert main(["plot", str(tmp_path / "s.csv"), "--x", "nope", "--y", "ttft_p50_s"]) == 2
    assert "missing: nope" in capsys.readouterr().err


def test_gpu_utilization_counts_the_model_flops_and_bytes(toy):
    """One request on the toy GPU (tp=1): 100-token prefill, 2 decode steps."""
    res = simulator.run(toy())
    g = res.gpu_timeseries
    assert set(g["gpu"]) == {0}
    w = res.scenario.output.window_s
    flops = (g["compute_util"] * 100e12 * w).sum()
    linear = 2 * 16_777_216  # two layers of QKV, O, gate-up, down
    attention = 2 * 4 * 8 * 128 * (100 * 101 / 2 + 101 + 102)
    head = 3 * 2 * 1024 * 1024  # three sampled tokens
    assert flops == pytest.approx(2 * linear * 102 + attention + head, rel=1e-9)
    hbm = (g["hbm_util"] * 1e12 * w).sum()
    assert hbm > 3 * 2 * linear  # every step reads all weights at least
    assert (g["nvlink_util"] == 0).all() and (g["nic_util"] == 0).all()  # tp = pp = 1
    tp2 = simulator.run(toy(parallel={"tp": 2})).gpu_timeseries
    assert set(tp2["gpu"]) == {0, 1} and (tp2["nvlink_util"] > 0).any()
