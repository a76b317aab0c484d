"""Observability outputs: timeseries, alerts, Perfetto trace, plots."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pandas as pd
import pytest
from conftest import rejecting_scenario, toy_scenario

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
    trace = json.loads(gzip.decompress((out / "trace.json.gz").read_bytes()))
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
                      alerts={"ttft_p99_s": 2.0, "e2e_p99_s": 0, "batch_efficiency_min": 0,
                              "waiting_ttft_s": 0})
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


# -- honest windows and alerts ---------------------------------------------------------------
def test_tokens_count_in_the_window_where_they_are_generated():
    from simulator.metrics.timeseries import generated_by, request_windows

    # One request: first token at 1.0 s, 11 tokens, finish at 3.0 s: 1 token at 1.0, then
    # 10 evenly over [1, 3] (5 per second). A second finishes its 4 tokens all at 2.5 s.
    # G(t) counts tokens generated before t, so a window [a, b) holds G(b) - G(a).
    req = pd.DataFrame({"arrival_s": [0.0, 2.0], "first_scheduled_s": [0.5, 2.0],
                        "first_token_s": [1.0, 2.5], "finish_s": [3.0, 2.5],
                        "output_tokens": [11, 4], "status": ["completed"] * 2,
                        "ttft_s": [1.0, 0.5], "tpot_s": [0.2, np.nan], "e2e_s": [3.0, 0.5]})
    assert generated_by(req, np.array([0.5, 1.0, 2.0, 2.5, 3.0, 9.0])) == \
        pytest.approx([0, 0, 6, 1 + 7.5, 15, 15])
    ts = request_windows(req, np.arange(5.0))
    assert ts["output_tok_per_s"].tolist() == pytest.approx([0, 6, 5 + 4, 0])
    assert ts["tpot_p50_s"].iloc[3] == pytest.approx(0.2)  # the request finishing in [3, 4)
    assert np.isnan(ts["tpot_p50_s"].iloc[2])  # a 1-token reply has no TPOT


def test_ages_of_what_waits_at_each_window_end():
    from simulator.metrics.timeseries import request_windows

    # r0 queued 0 -> 3.5 (first token at 4.2); r1 queued 1 -> 1.2; r2 rejected at 1.5.
    req = pd.DataFrame({"arrival_s": [0.0, 1.0, 1.5], "first_scheduled_s": [3.5, 1.2, np.nan],
                        "first_token_s": [4.2, 1.4, np.nan], "finish_s": [5.0, 2.0, np.nan],
                        "output_tokens": [5, 5, 5],
                        "status": ["completed", "completed", "rejected"],
                        "ttft_s": [4.2, 0.4, np.nan], "tpot_s": [0.2, 0.15, np.nan],
                        "e2e_s": [5.0, 1.0, np.nan]})
    ts = request_windows(req, np.arange(7.0))
    assert ts["queue_len"].tolist() == [2, 1, 1, 0, 0, 0]  # r1 waits at t = 1 too
    assert ts["oldest_queued_s"].tolist() == pytest.approx([1, 2, 3, 0, 0, 0])
    assert ts["waiting_ttft_max_s"].tolist() == pytest.approx([1, 2, 3, 4, 0, 0])


def _batch_fill_by_hand(res, t0, t1):
    """Mean over stage-0 steps ending in [t0, t1) of the binding resource's fill."""
    s, plan = res.steps, res.plan
    eng = res.scenario.engine
    st = s[(s["stage"] == 0) & (s["end_s"] >= t0) & (s["end_s"] < t1)]
    blocks = plan.memory.kv_blocks // plan.streams_per_replica
    fill = np.maximum.reduce([st["batch_size"] / eng.max_num_seqs,
                              (st["prefill_tokens"] + st["decode_tokens"])
                              / eng.max_num_batched_tokens, st["kv_blocks"] / blocks])
    return float(fill.mean())


def test_batch_efficiency_alert_stays_quiet_when_under_loaded_with_nothing_queued():
    # 2 requests/s of 100-token prompts on a replica allowing 64 sequences: a handful run,
    # batches are far below 0.6 full, but nothing waits: light load, no alert.
    res = simulator.run(toy_scenario(
        workload={"arrival": "constant", "rate_per_s": 2.0, "num_requests": 40,
                  "prompt_tokens": 100, "output_tokens": 50},
        alerts={"ttft_p99_s": 0, "e2e_p99_s": 0, "waiting_ttft_s": 0}))
    ts, al = res.timeseries, res.alerts
    assert ts["batch_efficiency"].iloc[3] == pytest.approx(_batch_fill_by_hand(res, 3.0, 4.0))
    assert (ts["batch_efficiency"].dropna() < 0.6).all() and (ts["queue_len"] == 0).all()
    assert al.empty


def test_batch_efficiency_alert_fires_only_while_requests_wait():
    from simulator.metrics.alerts import transitions

    # Under-filled batches in every window; a request waiting longer than a window (1 s)
    # in windows 2-5 only (window 1: one queued for 0.3 s, about to join a step).
    ts = pd.DataFrame({"window_start_s": np.arange(0.0, 9.0),
                       "window_end_s": np.arange(1.0, 10.0),
                       "batch_efficiency": np.full(9, 0.2),
                       "oldest_queued_s": [0.3, 1.5, 2.5, 3.5, 1.2, 0, 0, 0, 0]})
    events = transitions(ts, {"batch_efficiency_min": 0.6}, "all")
    assert [(e["time_s"], e["event"]) for e in events] == [(2.0, "fire"), (6.0, "clear")]
    # With hysteresis: fire after 2 windows in a row, clear after 3.
    events = transitions(ts, {"batch_efficiency_min": 0.6, "fire_after": 2,
                              "clear_after": 3}, "all")
    assert [(e["time_s"], e["event"]) for e in events] == [(3.0, "fire"), (8.0, "clear")]


def test_alert_hysteresis_switches_by_hand():
    from simulator.metrics.alerts import switches

    bad = np.array([0, 1, 1, 0, 1, 1, 1, 0, 0, 1, 0, 0, 0, 1, 1], dtype=bool)
    assert switches(bad) == [1, 3, 4, 7, 9, 10, 13]  # every change of verdict
    assert switches(bad, 2, 3) == [2, 12, 14]  # fires at the 2nd bad, clears at the 3rd good
    assert switches(bad, 3, 2) == [6, 8]
    assert switches(np.zeros(5, dtype=bool), 1, 1) == []
    assert switches(np.ones(3, dtype=bool), 4, 1) == []  # never 4 in a row


def test_batch_efficiency_alert_stays_quiet_when_saturated():
    # 480 requests at once, at most 8 sequences per step: every step of the backlog holds 8
    # sequences (fill 1 on sequences) although its tokens fill a few percent of the budget.
    # 60 x 100 steps of at least the 1 ms CPU step (hidden GPU time with vllm-v1): >= 6 s.
    res = simulator.run(toy_scenario(
        engine={"max_num_seqs": 8},
        workload={"arrival": "constant", "rate_per_s": 1e6, "num_requests": 480,
                  "prompt_tokens": 20, "output_tokens": 100},
        alerts={"ttft_p99_s": 0, "e2e_p99_s": 0, "waiting_ttft_s": 0}))
    ts, al = res.timeseries, res.alerts
    backlog = ts[ts["queue_len"] > 0]
    assert len(backlog) >= 5
    # (the first window's first step starts when only the first request has arrived)
    assert (backlog["batch_efficiency"] > 0.99).all()
    assert (backlog["batch_fill_seqs"].iloc[1:] == 1.0).all()
    assert (backlog["batch_fill_tokens"] < 0.6).all()  # the token budget alone would fire
    drained = float(ts.loc[ts["queue_len"] == 0, "window_end_s"].min())
    rule = al[al["rule"] == "batch_efficiency_below"]
    assert rule.empty or rule["time_s"].min() > drained


def test_an_outage_fires_the_waiting_rule_while_nothing_completes():
    # The only replica goes down from 5 s to 25 s: no completions then, so the latency p99
    # rules have nothing to look at; the oldest waiting request ages from the outage on.
    sc = toy_scenario(
        workload={"arrival": "constant", "rate_per_s": 5.0, "num_requests": 200,
                  "prompt_tokens": 100, "output_tokens": 20},
        faults=[{"at_s": 5.0, "target": "node:0", "duration_s": 19.0}],
        recovery={"restart_s": 1.0},
        alerts={"waiting_ttft_s": 3.0, "e2e_p99_s": 0, "batch_efficiency_min": 0,
                "fire_after": 1})
    res = simulator.run(sc)
    ts, al = res.timeseries, res.alerts
    assert (ts.loc[(ts["window_end_s"] > 6) & (ts["window_end_s"] <= 25), "completions"] == 0).all()
    assert (ts.loc[ts["window_end_s"].between(6, 24), "replicas_down"] == 1).all()
    assert ts.loc[ts["window_end_s"] == 25, "replicas_down"].item() == 0  # up at 25 s
    assert (ts.loc[ts["replicas_down"] == 1, "kv_util_r0"] == 0).all()  # its KV cache is lost
    assert ts.loc[ts["window_end_s"] == 4, "kv_util_r0"].item() > 0
    w = al[(al["replica"] == "all") & (al["rule"] == "waiting_ttft_above")]
    fire = w[w["event"] == "fire"]["time_s"].iloc[0]
    assert 8.0 <= fire <= 9.0  # the first request waiting since ~5 s passes 3 s at ~8 s
    ttft = al[(al["replica"] == "all") & (al["rule"] == "ttft_p99_above")]
    assert ttft.empty or ttft["time_s"].min() > 25.0  # the latency rule only after repair
    assert res.summary["downtime_spans"] == [[0, 5.0, 25.0, "node:0"]]


def test_e2e_rule_does_not_flap_on_one_or_two_completions():
    from simulator.metrics.alerts import trailing_pct, transitions

    # Windows of 1 s with one completion each, e2e alternating 40 s / 1 s: a per-window p99
    # flips every window; over at least 10 completions it is high throughout.
    fin = np.arange(30) + 0.5
    e2e = np.where(np.arange(30) % 2 == 0, 40.0, 1.0)
    edges = np.arange(31.0)
    pooled = trailing_pct(fin, e2e, edges, 99, 10)
    ts = pd.DataFrame({"window_end_s": edges[1:], "e2e_p99_s": pooled})
    events = transitions(ts, {"e2e_p99_s": 30.0}, "all")
    assert [e["event"] for e in events] == ["fire"]
    ts["e2e_p99_s"] = e2e
    assert len(transitions(ts, {"e2e_p99_s": 30.0}, "all")) == 30


def test_rejected_requests_have_a_reason_and_count_against_the_slo():
    res = simulator.run(rejecting_scenario())
    req, s = res.requests, res.summary
    rej = req[req["status"] == "rejected"]
    assert len(rej) == s["requests_rejected"] > 0
    assert rej["reason"].str.contains("exceed max_model_len 300").all()
    assert rej[["finish_s", "e2e_s", "ttft_s"]].isna().all().all()
    done = req[req["status"] == "completed"]
    assert s["slo_attainment"] == pytest.approx(len(done) / len(req))  # all met, some rejected


def test_sweep_plot_draws_one_line_per_other_swept_value_with_seed_ranges():
    from matplotlib.figure import Figure

    from simulator.plotting import sweep_plot

    # Two swept keys and two seeds: at rate 8, tp=1 reads 69.6 / 70.4 s and tp=2 0.3 / 0.5 s.
    df = pd.DataFrame({"run_id": list("abcdefgh"), "workload.rate_per_s": [4, 4, 8, 8] * 2,
                       "parallel.tp": [1, 2, 1, 2] * 2, "seed": [0] * 4 + [1] * 4,
                       "status": "ok", "error": "",
                       "e2e_p99_s": [10.0, 0.2, 69.6, 0.3, 12.0, 0.2, 70.4, 0.5]})
    ax = sweep_plot(df, "workload.rate_per_s", "e2e_p99_s", ax=Figure().add_subplot())
    lines = {c.get_label(): c for c in ax.containers}
    assert set(lines) == {"tp=1", "tp=2"}  # never averaged over tp
    line, _, (bars,) = lines["tp=1"]
    assert line.get_ydata().tolist() == pytest.approx([11.0, 70.0])
    lo_hi = [seg[:, 1].tolist() for seg in bars.get_segments()]
    assert lo_hi == [pytest.approx([10.0, 12.0]), pytest.approx([69.6, 70.4])]
    assert "mean of 2 seeds" in ax.get_ylabel()


def test_run_plots_without_steps_leave_out_the_step_figures(tmp_path):
    res = simulator.run(toy_scenario(workload={"num_requests": 20, "rate_per_s": 5.0}))
    simulator.write_result(res, tmp_path, steps=False)
    from simulator.plotting import run_figures

    figs = run_figures(tmp_path)
    assert "pipeline_gantt" not in figs  # not drawn as an empty placeholder
    assert "toy" in figs["timeseries"].texts[0].get_text()  # the scenario name as title
    legend = [t.get_text() for t in figs["timeseries"].axes[1].get_legend().get_texts()]
    assert "queued" in legend and "queue_len" not in legend


def test_trailing_percentile_equals_a_slice_by_slice_computation():
    from simulator.metrics.alerts import trailing_pct

    rng = np.random.default_rng(5)
    fin = np.sort(rng.uniform(0, 50, 300) ** 1.5 / 7)  # busy and quiet windows
    val = rng.exponential(2.0, 300)
    edges = np.arange(0.0, 52.0, 1.0)
    got = trailing_pct(fin, val, edges, 99, 10)
    for j in range(len(edges) - 1):
        lo, hi = np.searchsorted(fin, edges[j]), np.searchsorted(fin, edges[j + 1])
        if hi == lo:
            assert np.isnan(got[j])
            continue
        want = np.percentile(val[min(lo, max(hi - 10, 0)):hi], 99)
        assert got[j] == pytest.approx(want, rel=1e-12)
