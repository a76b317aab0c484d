"""[workload.rate_profile]: arrival rates over time, by hand and against their integral."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import tomli_w

from simulator import check, load_scenario
from simulator.cli import main
from simulator.errors import ScenarioError
from simulator.workload.arrivals import arrival_times
from simulator.workload.trace import load_trace

ROOT = Path(__file__).resolve().parent.parent


def _scenario(workload: dict) -> dict:
    return {"name": "rp", "model": {"name": "llama-3.1-8b"}, "cluster": {"topology":
            "dgx-h100"}, "workload": workload}


def _times(workload: dict, seed: int = 0) -> np.ndarray:
    return arrival_times(load_scenario(_scenario(workload)).workload,
                         np.random.default_rng(seed))


def test_steps_and_a_burst_by_hand():
    """Constant unit gaps (u = 1, 2, ...) through Lambda: rate 1 until 10 s, then 2, with
    4x (rate 8) in [12, 13): Lambda(10) = 10, Lambda(12) = 14, Lambda(13) = 22."""
    t = _times({"arrival": "constant", "num_requests": 25, "rate_profile": {
        "shape": "steps", "at_s": [0, 10], "rates_per_s": [1.0, 2.0],
        "bursts": [{"at_s": 12.0, "duration_s": 1.0, "multiplier": 4.0}]}})
    want = [*range(1, 11), 10.5, 11.0, 11.5, 12.0,
            *(12 + k / 8 for k in range(1, 9)), 13.5, 14.0, 14.5]
    np.testing.assert_allclose(t, want, rtol=0, atol=1e-9)


def test_diurnal_counts_follow_the_integral_of_the_rate():
    prof = {"shape": "diurnal", "peak_per_s": 20.0, "trough_per_s": 2.0,
            "peak_at_s": 50400.0}
    t = _times({"arrival": "poisson", "duration_s": 86400.0, "rate_profile": prof})
    assert len(t) == pytest.approx(11 * 86400, rel=4 / math.sqrt(11 * 86400))
    counts = np.histogram(t, bins=24, range=(0, 86400))[0]

    def lam(x):  # the integral of trough + (peak - trough)(1 + cos)/2
        return 11 * x + 9 * 86400 / (2 * math.pi) * math.sin(2 * math.pi * (x - 50400) / 86400)

    want = np.array([lam(3600 * (h + 1)) - lam(3600 * h) for h in range(24)])
    assert np.all(np.abs(counts - want) < 5 * np.sqrt(want))
    assert counts.argmax() in (13, 14) and counts.argmin() in (1, 2)  # 14:00 and 02:00


def test_noise_keeps_the_mean_and_widens_the_spread():
    base = {"shape": "steps", "at_s": [0], "rates_per_s": [50.0]}
    quiet = _times({"arrival": "poisson", "duration_s": 6000.0, "rate_profile": base})
    noisy = _times({"arrival": "poisson", "duration_s": 6000.0, "rate_profile": base | {
        "noise": 0.3, "noise_interval_s": 60.0}})
    assert len(noisy) == pytest.approx(300_000, rel=0.08)  # 100 draws of a mean-1 factor
    dispersion = [np.var(c) / np.mean(c) for c in
                  (np.histogram(x, bins=100, range=(0, 6000))[0] for x in (quiet, noisy))]
    assert dispersion[0] < 2 and dispersion[1] > 50  # Poisson: 1; noisy: + (0.3 * 3000)^2


def test_same_seed_same_times_and_duration_with_count():
    w = {"arrival": "gamma", "cv": 2.0, "num_requests": 500, "duration_s": 30.0,
         "rate_profile": {"shape": "diurnal", "peak_per_s": 30.0, "trough_per_s": 1.0,
                          "period_s": 60.0, "noise": 0.2, "noise_interval_s": 5.0}}
    a, b = _times(w, seed=4), _times(w, seed=4)
    np.testing.assert_array_equal(a, b)
    assert (a <= 30.0).all() and len(a) < 500 and not np.array_equal(a, _times(w, seed=5))


def test_trace_multiplier_replays_twice_as_fast_where_it_is_two(tmp_path):
    trace = tmp_path / "t.csv"
    pd.DataFrame({"arrival_s": np.arange(100.0), "prompt_tokens": 10,
                  "output_tokens": 5}).to_csv(trace, index=False)
    s = load_scenario(_scenario({"arrival": "trace", "trace": str(trace), "rate_profile": {
        "shape": "steps", "at_s": [0, 50], "multipliers": [1.0, 2.0]}}))
    _, requests = check(s)
    want = np.concatenate([np.arange(51.0), 50 + np.arange(1, 50) / 2])
    np.testing.assert_allclose(requests["arrival_s"].to_numpy(), want, atol=1e-6)


def test_burstgpt_columns_and_failed_rows(tmp_path):
    path = tmp_path / "BurstGPT_1.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    "5,ChatGPT,472,18,490,Conversation log\n"
                    "45,ChatGPT,1087,0,1087,Conversation log\n"
                    "118,GPT-4,417,30,447,API log\n")
    df = load_trace(path)
    assert df["arrival_s"].tolist() == [0.0, 113.0]
    assert df["prompt_tokens"].tolist() == [472, 417]
    assert df["output_tokens"].tolist() == [18, 30]


def test_the_documented_day_first_hour():
    """docs/scenario.md: the first hour of workloads/day-70b-diurnal.toml offers
    Lambda(3600) = 9,468 requests by the formula, and the seeded draw gives 9,364."""
    p, tr, pk, d = 18.0, 2.0, 50400.0, 86400.0

    def lam(x):
        return (p + tr) / 2 * x + (p - tr) / 2 * d / (2 * math.pi) * math.sin(
            2 * math.pi * (x - pk) / d)

    assert round(lam(3600) - lam(0)) == 9468
    s = load_scenario(ROOT / "workloads" / "day-70b-diurnal.toml",
                      overrides=["workload.duration_s=3600"])
    _, requests = check(s)
    assert len(requests) == 9364


@pytest.mark.parametrize("profile, extra, words", [
    ({"shape": "weekly"}, {}, "shape: expected one of diurnal, steps"),
    ({"shape": "steps", "at_s": [0, 5], "rates_per_s": [1.0]}, {}, "1 values for 2 times"),
    ({"shape": "steps", "at_s": [1], "rates_per_s": [1.0]}, {}, "must start at 0"),
    ({"shape": "steps", "at_s": [0], "rates_per_s": [-1.0]}, {}, "rates_per_s: expected"),
    ({"shape": "steps", "at_s": [0], "rates_per_s": [0.0]}, {}, "at least one must be > 0"),
    ({"shape": "diurnal", "peak_per_s": 1.0, "trough_per_s": 2.0}, {}, "must be >= trough"),
    ({"shape": "diurnal", "peak_per_s": 1.0, "trough_per_s": 0.5, "peak": 3}, {},
     "rate_profile.peak: unknown key"),
    ({"shape": "steps", "at_s": [0], "rates_per_s": [1.0], "bursts": [{"at_s": 1}]}, {},
     "bursts[0]: expected exactly the keys"),
    ({"shape": "steps", "at_s": [0], "rates_per_s": [1.0], "noise": 5}, {}, "noise: a log"),
    ({"shape": "steps", "at_s": [0], "rates_per_s": [1.0]}, {"rate_per_s": 2.0},
     "rate_per_s: not used with workload.rate_profile"),
    ({"shape": "steps", "at_s": [0], "rates_per_s": [1.0]},
     {"arrival": "closed_loop", "concurrency": 4}, "shapes arrival = poisson"),
    ({"shape": "steps", "at_s": [0], "rates_per_s": [float("nan")]}, {}, "finite numbers"),
])
def test_bad_profiles_are_one_line_each(profile, extra, words, tmp_path, capsys):
    workload = {"arrival": "poisson", "num_requests": 10, "rate_profile": profile} | extra
    with pytest.raises(ScenarioError, match=words.replace("[", r"\[").replace("]", r"\]")):
        load_scenario(_scenario(workload))
    path = tmp_path / "s.toml"
    path.write_text(tomli_w.dumps(_scenario(workload)))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert words.split(":")[0] in err


def test_trace_profiles_take_multipliers_not_rates(tmp_path):
    with pytest.raises(ScenarioError, match="rates_per_s: unknown key .* over a trace"):
        load_scenario(_scenario({"arrival": "trace", "trace": "workloads/x.csv",
                                 "rate_profile": {"shape": "steps", "at_s": [0],
                                                  "rates_per_s": [1.0]}}))
