"""plan --autoscale: the peak of a rate profile by hand, the layout search on the peak and
the autoscaled day for the best layouts, the answer the cheapest that reaches the SLO
attainment, and what it refuses."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import tomli_w
import tomllib

from simulator.cli import main
from simulator.planner.day import peak_rate

DAY = {"name": "day-plan", "seed": 3, "model": {"name": "llama-3.1-8b"},
       "cluster": {"topology": "dgx-h100", "nodes": 1},
       "engine": {"max_num_seqs": 64, "max_num_batched_tokens": 2048},
       "workload": {"arrival": "poisson", "duration_s": 1200.0,
                    "prompt_tokens": {"dist": "lognormal", "mean": 512, "sigma": 0.5,
                                      "max": 2048},
                    "output_tokens": {"dist": "lognormal", "mean": 64, "sigma": 0.5,
                                      "max": 256},
                    "rate_profile": {"shape": "diurnal", "peak_per_s": 150.0,
                                     "trough_per_s": 10.0, "period_s": 1200.0,
                                     "peak_at_s": 600.0}},
       "slo": {"ttft_s": 0.3, "tpot_s": 0.012},
       "autoscale": {"policy": "load", "interval_s": 30.0, "target": 8.0,
                     "provision_s": 5.0, "graph_capture_s": 5.0}}


def test_the_peak_of_a_profile_by_hand():
    diurnal = {"shape": "diurnal", "peak_per_s": 18.0, "trough_per_s": 2.0,
               "peak_at_s": 50400.0}
    assert peak_rate(diurnal, 86400.0) == pytest.approx(18.0)
    # Over the first 6 hours (02:00 is the trough, 14:00 the peak) the peak is at 06:00:
    # 2 + 16 (1 + cos(2 pi (21600 - 50400) / 86400)) / 2 = 2 + 8 (1 + cos(-2 pi / 3)) = 6.
    assert peak_rate(diurnal, 21600.0) == pytest.approx(6.0)
    # A burst of 1.8x from 10:00 to 10:15: the rate still grows, so the highest is at the
    # burst's end, 1.8 x (2 + 8 (1 + cos(2 pi (36900 - 50400) / 86400))) = 26.0.
    burst = diurnal | {"bursts": [{"at_s": 36000.0, "duration_s": 900.0, "multiplier": 1.8}]}
    end = 1.8 * (2 + 8 * (1 + math.cos(2 * math.pi * (36900 - 50400) / 86400)))
    assert end == pytest.approx(26.0, abs=0.01)
    assert peak_rate(burst, 86400.0) == pytest.approx(end, rel=1e-3)
    steps = {"shape": "steps", "at_s": [0.0, 100.0, 200.0], "rates_per_s": [1.0, 9.0, 3.0]}
    assert peak_rate(steps, 300.0) == 9.0 and peak_rate(steps, 50.0) == 1.0


def test_plan_autoscale_answers_the_cheapest_layout_and_bounds_that_keep_the_slos(
        tmp_path, capsys):
    path = tmp_path / "day.toml"
    path.write_text(_toml(DAY))
    out = tmp_path / "plan"
    assert main(["plan", str(path), "--autoscale", "0.99", "--requests", "80", "--top", "1",
                 "--jobs", "1", "--no-plot", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    peak = pd.read_csv(out / "plan.csv")
    day = pd.read_csv(out / "day_plan.csv")
    # The layout search ran at the 150 req/s peak; the best layout meeting the SLOs there
    # was simulated over the day with its peak replicas as the bound, and half as many more.
    first = peak[peak["slo_met"]].iloc[0]
    dp = int(first["dp"])
    assert (day["tp"] == first["tp"]).all() and (day["pp"] == first["pp"]).all()
    assert sorted(day["max_replicas"]) == sorted({dp, min(8, dp + max(1, dp // 2))})
    assert (day["min_replicas"] == 1).all() and (day["policy"] == "load").all()
    # The answer: the fewest GPU-hours among the days at >= 99% SLO attainment.
    meets = day[day["slo_attainment"] >= 0.99]
    assert not meets.empty and day["meets"].iloc[0]
    best = day.iloc[0]
    assert best["gpu_hours"] == meets["gpu_hours"].min()
    assert best["cost_per_day_usd"] == pytest.approx(best["cost_usd"] * 86400 / 1200)
    pick = tomllib.loads((out / "recommended-day.toml").read_text())
    assert pick["parallel"]["tp"] == best["tp"] and pick["parallel"]["dp"] == \
        best["max_replicas"]
    assert pick["autoscale"]["max_replicas"] == best["max_replicas"]
    assert pick["autoscale"]["min_replicas"] == 1
    assert "rate_profile" in pick["workload"]
    assert "day plan: peak 150 req/s" in text and f"max_replicas = {best['max_replicas']}" \
        in text


def test_plan_autoscale_needs_a_load_that_changes(tmp_path, capsys):
    flat = DAY | {"workload": {k: v for k, v in DAY["workload"].items()
                               if k != "rate_profile"} | {"rate_per_s": 5.0}}
    path = tmp_path / "flat.toml"
    path.write_text(_toml(flat))
    assert main(["plan", str(path), "--autoscale"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "plan --autoscale: needs a load that changes over time" in err[0]
    assert main(["plan", str(path), "--autoscale", "1.5"]) == 2
    assert "--autoscale" in capsys.readouterr().err
    assert main(["plan", str(path), "--autoscale", "--disagg-only", "--gpus", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "plan --autoscale: --disagg-only, --gpus not taken" in err[0]


def _toml(data: dict) -> str:
    return tomli_w.dumps(data)
