"""A day in production: SLO attainment per window and the worst window, by hand and on an
autoscaled run."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from simulator import load_scenario, run
from simulator.metrics.day import attainment_by_window, worst_window
from simulator.printout import format_summary
from tests.test_autoscale import LOAD, _scenario


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
    text = format_summary("as", s, req)
    assert (f"SLO attainment, worst window   {s['slo_attainment_worst_window']:.1%} (the 20 s "
            f"from t = {start:,.0f} s; {s['slo_attainment']:.1%} over the run)") in text
