"""[autoscale]: cold starts by hand, scaling after the interval plus the cold start, every
request served once, bounds, a flat load that settles, hysteresis, the forecasters."""

from __future__ import annotations

import math

import numpy as np
import pytest

from simulator import load_scenario, run
from simulator.cluster import running
from simulator.cluster.autoscale import (
    SOURCE_BPS,
    HoltWinters,
    Kalman,
    Last,
    LoadPolicy,
    MovingAverage,
    Observation,
    cold_start_s,
)
from simulator.cluster.pools import build_plan
from simulator.errors import ScenarioError
from simulator.io.schema import AutoscaleKeys
from simulator.topology.graph import Paths


def _scenario(autoscale: dict, rates=(4.0, 40.0, 4.0), at=(0, 120, 400), duration=600.0,
              dp: int = 4) -> dict:
    return {"name": "as", "seed": 1, "model": {"name": "llama-3.1-8b"},
            "cluster": {"topology": "dgx-h100"}, "parallel": {"tp": 2, "dp": dp},
            "router": {"policy": "least_outstanding"},
            "workload": {"arrival": "constant", "duration_s": duration,
                         "prompt_tokens": 256, "output_tokens": 64,
                         "rate_profile": {"shape": "steps", "at_s": list(at),
                                          "rates_per_s": list(rates)}},
            "output": {"steps": False}, "autoscale": autoscale}


LOAD = {"policy": "load", "min_replicas": 1, "max_replicas": 4, "interval_s": 20.0,
        "target": 4.0, "cooldown_down_s": 40.0, "provision_s": 10.0,
        "graph_capture_s": 5.0}


def test_cold_start_by_hand():
    s = load_scenario(_scenario(LOAD))
    plan = build_plan(s)
    w = plan.memory.weights_per_gpu[0]  # TP2: each GPU one half of the weights
    a = s.autoscale
    # Storage: the replica's two GPUs on one node share the node's 25 GB/s of NVMe.
    assert cold_start_s(a, plan, 1, None) == pytest.approx(10 + 2 * w / SOURCE_BPS["nvme"] + 5)
    slow = AutoscaleKeys(**{**a.__dict__, "weights_from": "object_store",
                            "weights_bandwidth_Bps": 1e9})
    assert cold_start_s(slow, plan, 1, None) == pytest.approx(10 + 2 * w / 1e9 + 5)
    # A peer: each GPU reads its shard from the matching GPU of replica 0 over NVLink.
    peer = AutoscaleKeys(**{**a.__dict__, "weights_from": "peer"})
    paths = Paths(plan.graph)
    src, dst = plan.replicas[0].placement.gpus, plan.replicas[1].placement.gpus
    t = max(paths.transfer_time(x, y, w) for x, y in zip(src, dst, strict=True))
    assert cold_start_s(peer, plan, 1, 0) == pytest.approx(10 + t + 5)
    assert t < 2 * w / SOURCE_BPS["nvme"]  # NVLink beats the node's disks


def test_step_scales_up_after_the_interval_and_the_cold_start():
    s = load_scenario(_scenario(LOAD))
    result = run(s)
    changes = run_changes(s)
    cold = cold_start_s(s.autoscale, build_plan(s), 1, None)
    first = next(c for c in changes if c[2] == "starting")
    assert first[0] == pytest.approx(140.0)  # the first decision after the step at 120 s
    serving = next(c for c in changes if c[1] == first[1] and c[2] == "serving"
                   and c[0] > first[0])
    assert serving[0] == pytest.approx(140.0 + cold, abs=1e-6)
    # Every request arrived once and completed once; none routed to a parked replica.
    req = result.requests
    assert req["request_id"].is_unique and (req["status"] == "completed").all()
    assert len(req) == 4 * 120 + 40 * 280 + 4 * 200
    early = req[req["arrival_s"] < first[0] + cold]
    assert set(early["replica"]) == {0}


def run_changes(s):
    """The scaling log of a run of ``s`` (the autoscaler of a fresh cluster)."""
    captured = {}
    real = running.Autoscaler

    class Spy(real):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            captured["log"] = self.log

    running.Autoscaler = Spy
    try:
        run(s)
    finally:
        running.Autoscaler = real
    return captured["log"].changes


def test_a_scale_up_beyond_the_replicas_there_are_says_so():
    """max_replicas 1 under the 40 req/s step: every decision that wants a second replica
    is counted, the first one the first after the step (140 s), and none starts."""
    s = load_scenario(_scenario(LOAD | {"max_replicas": 1}))
    result = run(s)
    m = result.summary
    assert m["autoscale_scale_ups"] == 0 and m["autoscale_replicas_max"] == 1
    assert m["autoscale_scale_ups_capped"] >= 1 and m["autoscale_capped_first_s"] == 140.0
    assert m["autoscale_capped_wanted_max"] >= 2
    free = run(load_scenario(_scenario(LOAD)))  # with 4 to start from: never capped
    assert free.summary["autoscale_scale_ups_capped"] == 0
    assert math.isnan(free.summary["autoscale_capped_first_s"])


def test_bounds_and_scale_down_drains():
    result = run(load_scenario(_scenario(LOAD | {"max_replicas": 3})))
    ts, summary = result.timeseries, result.summary
    assert ts["replicas"].between(1, 3).all() and ts["replicas"].max() == 3
    assert summary["autoscale_scale_downs"] >= 1
    assert (result.requests["status"] == "completed").all()  # draining dropped nothing
    assert summary["autoscale_replicas_max"] == 3 and summary["autoscale_replicas_min"] == 1
    assert 1 < summary["autoscale_replicas_mean"] < 3
    paid = summary["autoscale_gpu_hours"] / (summary["simulated_time_s"] / 3600) / 2
    assert paid == pytest.approx(summary["autoscale_replicas_mean"], rel=0.02)


def test_flat_load_with_sla_settles_and_stops_scaling():
    sla = {"policy": "sla", "min_replicas": 1, "max_replicas": 4, "interval_s": 20.0,
           "forecaster": "moving_average", "window": 3, "replica_capacity_per_s": 5.0,
           "target_utilization": 0.8, "cooldown_down_s": 0.0, "provision_s": 5.0,
           "graph_capture_s": 5.0}
    s = load_scenario(_scenario(sla, rates=(10.0,), at=(0,), duration=600.0))
    changes = run_changes(s)
    # ceil(10 / (5 x 0.8)) = 3 replicas, reached within the first intervals, then no change.
    assert max(t for t, _, _ in changes) < 100
    serving = {i for t, i, st in changes if st == "serving"} - {
        i for t, i, st in changes if st in ("draining", "parked") and t > 0}
    assert len(serving) == 3


def test_load_policy_hysteresis_by_hand():
    a = AutoscaleKeys(policy="load", target=4.0, up_intervals=2, down_intervals=3,
                      scale_down_below=0.5)
    pol = LoadPolicy(a)
    # 2 replicas holding 9 requests want ceil(9 / 4) = 3, but only after 2 intervals in a row.
    assert pol.desired(Observation(2, 1.0, 9.0), 2) == 2
    assert pol.desired(Observation(2, 1.0, 7.0), 2) == 2  # wants 2: the count restarts
    assert pol.desired(Observation(2, 1.0, 9.0), 2) == 2
    assert pol.desired(Observation(2, 1.0, 9.0), 2) == 3
    # Down: 3 intervals under target x 0.5 = 2 per replica, each wanting fewer.
    assert [pol.desired(Observation(3, 1.0, 3.0), 3) for _ in range(3)] == [3, 3, 1]
    # 7 requests on 3 replicas (2.33 each) want 2 but sit above the floor: no scale-down.
    assert [pol.desired(Observation(3, 1.0, 7.0), 3) for _ in range(5)] == [3] * 5


def test_forecasters_by_hand():
    a = AutoscaleKeys(window=2, smoothing=0.5, trend_smoothing=0.5, kalman_q_over_r=1.0)
    xs = [10.0, 20.0, 30.0]
    f = [cls(a) for cls in (Last, MovingAverage, HoltWinters, Kalman)]
    for x in xs:
        for g in f:
            g.update(x)
    assert f[0].predict() == 30.0 and f[1].predict() == 25.0
    # Holt: l = 10, b = 0; l = .5 * 20 + .5 * 10 = 15, b = 2.5; l = .5 * 30 + .5 * 17.5 =
    # 23.75, b = .5 * 8.75 + .5 * 2.5 = 5.625: forecast 29.375.
    assert f[2].predict() == pytest.approx(29.375)
    # Kalman (r = 1, q = 1): x = 10, p = 1; p' = 2, k = 2/3, x = 16.67, p = 2/3;
    # p' = 5/3, k = 5/8, x = 16.67 + 5/8 * 13.33 = 25.
    assert f[3].predict() == pytest.approx(25.0)
    # A season of 2 intervals (10, 20, 10, ...) learnt: the next value, 10, not the mean.
    plain, season = (HoltWinters(AutoscaleKeys(smoothing=0.5, trend_smoothing=0.0,
                                               season_intervals=m)) for m in (0, 2))
    for x in (10.0, 20.0) * 10:
        plain.update(x)
        season.update(x)
    assert season.predict() == pytest.approx(10.0, abs=0.5)
    assert plain.predict() == pytest.approx(50 / 3, abs=0.5)  # no season: a smoothed level


@pytest.mark.parametrize("changes, words", [
    ({"max_replicas": 8}, "autoscale.max_replicas: 8 is more than the parallel.dp"),
    ({"min_replicas": 5}, "autoscale.min_replicas: 5 is more than max_replicas 4"),
    ({"initial_replicas": 9}, "autoscale.initial_replicas"),
    ({"policy": "sla", "replica_capacity_per_s": 0}, "autoscale.replica_capacity_per_s"),
    ({"policy": "bursty"}, "autoscale.policy"),
    ({"interval_s": 0}, "autoscale.interval_s"),
    ({"forecaster": "arima"}, "autoscale.forecaster"),
    ({"scale_down_below": 1.5}, "autoscale.scale_down_below"),
])
def test_bad_autoscale_tables(changes, words):
    with pytest.raises(ScenarioError, match=words.replace(".", r"\.")):
        load_scenario(_scenario(LOAD | changes))


def test_closed_loops_do_not_autoscale():
    s = _scenario(LOAD)
    s["workload"] = {"arrival": "closed_loop", "concurrency": 4, "num_requests": 10}
    with pytest.raises(ScenarioError, match="autoscaling needs an open-loop arrival"):
        load_scenario(s)


def test_without_autoscale_nothing_changes():
    s = _scenario(LOAD)
    del s["autoscale"]
    result = run(load_scenario(s))
    assert "replicas" not in result.timeseries
    assert not any(k.startswith("autoscale_") for k in result.summary)
    assert math.isfinite(result.summary["cost_per_million_output_tokens_usd"])
    assert np.isfinite(result.requests["ttft_s"]).all()


def test_the_printout_says_what_scaling_did():
    from simulator.printout import format_summary

    r = run(load_scenario(_scenario(LOAD)))
    s = r.summary
    text = format_summary("as", s, r.requests)
    assert (f"load: replicas {s['autoscale_replicas_mean']:.1f} mean "
            f"({s['autoscale_replicas_min']} to {s['autoscale_replicas_max']}), "
            f"{s['autoscale_scale_ups']} scale-ups") in text
    assert f"GPU-hours paid                 {s['autoscale_gpu_hours']:,.1f}" in text


def test_an_autoscaled_run_draws_load_and_replicas_on_one_time_axis(tmp_path):
    from simulator.io.writers import write_result
    from simulator.plotting import run_figures

    r = run(load_scenario(_scenario(LOAD | {"max_replicas": 3})))
    write_result(r, tmp_path / "run")
    fig = run_figures(tmp_path / "run")["autoscaling"]
    load, replicas = fig.axes
    assert load.get_xlabel() == "time (s)" and replicas.get_ylabel() == "replicas"
    steps = replicas.get_lines()[0].get_ydata()
    np.testing.assert_array_equal(steps, r.timeseries["replicas"].to_numpy())
    # The capacity paid for, in the load's units: replicas x one replica's capacity.
    cap = r.summary["autoscale_replica_capacity_per_s"]
    assert cap > 0 and load.get_lines()[1].get_label().startswith("capacity paid for")
    np.testing.assert_allclose(load.get_lines()[1].get_ydata(),
                               r.timeseries["replicas"].to_numpy() * cap)
    assert {t.get_text() for t in load.get_xticklabels()} - {""}  # a real time axis
