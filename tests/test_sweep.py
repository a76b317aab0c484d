"""Sweeps: grid x seeds rows, resume, failures recorded, identical results across backends."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import toy_scenario

import simulator
from simulator.cli import main
from simulator.metrics.summary import SUMMARY_KEYS
from simulator.sweep import grid_points, parse_grid

BASE = toy_scenario(workload={"arrival": "poisson", "rate_per_s": 5.0, "num_requests": 30,
                              "prompt_tokens": 200, "output_tokens": 20},
                    parallel={"tp": 1})
GRID = {"parallel.tp": [1, 2], "workload.rate_per_s": [2.0, 8.0, 16.0]}
METRICS = [k for k in SUMMARY_KEYS if k != "wall_time_s"]


def test_grid_is_the_product_of_axes_and_zips_vary_together():
    axes = parse_grid({"parallel.tp": [1, 2], "zip": {"l": {"engine.max_num_seqs": [8, 16, 32],
                                                          "engine.block_size": [16, 32, 64]}}})
    points = grid_points(axes)
    assert len(points) == 2 * 3
    assert {(p["engine.max_num_seqs"], p["engine.block_size"]) for p in points} == \
        {(8, 16), (16, 32), (32, 64)}


@pytest.mark.parametrize("grid, message", [
    ({"parallel.tpp": [1]}, "did you mean 'tp'"),
    ({"paralel.tp": [1]}, "did you mean 'parallel'"),
    ({"parallel.tp": 4}, "non-empty list"),
    ({"zip": {"a": {"parallel.tp": [1, 2], "parallel.dp": [1]}}}, "equal lengths"),
])
def test_bad_grids_are_refused_with_the_key(grid, message):
    with pytest.raises(simulator.ScenarioError, match=message):
        parse_grid(grid)


def test_one_row_per_point_and_seed_with_every_metric():
    df = simulator.sweep(BASE, GRID, seeds=2, jobs=1)
    assert len(df) == 2 * 3 * 2
    assert list(df.columns) == ["run_id", "parallel.tp", "workload.rate_per_s", "seed",
                                "status", "error", *SUMMARY_KEYS]
    assert (df["status"] == "ok").all()
    assert df["run_id"].is_unique
    # A point is the base scenario with the overrides: its row equals a direct run.
    row = df[(df["parallel.tp"] == 2) & (df["workload.rate_per_s"] == 8.0) & (df["seed"] == 1)]
    direct = simulator.run({**BASE, "seed": 1, "parallel": {"tp": 2},
                            "workload": {**BASE["workload"], "rate_per_s": 8.0}}).summary
    assert row["ttft_p99_s"].item() == direct["ttft_p99_s"]


def test_failing_point_is_recorded_and_the_sweep_goes_on(tmp_path):
    out = tmp_path / "r.csv"
    df = simulator.sweep(BASE, {"parallel.tp": [1, 3, 2]}, jobs=2, out=out)
    assert len(df) == 3
    bad = df[df["parallel.tp"] == 3].iloc[0]
    assert bad["status"] == "error"
    assert "parallel.tp" in bad["error"] and "does not divide" in bad["error"]
    assert (df[df["parallel.tp"] != 3]["status"] == "ok").all()


def test_rerun_resumes_and_skips_finished_points(tmp_path):
    out = tmp_path / "r.csv"
    first = simulator.sweep(BASE, GRID, seeds=1, jobs=2, out=out)
    assert len(first) == 6
    # Lose two rows (as if the sweep had been interrupted), then rerun the same command.
    kept = pd.read_csv(out, dtype={"run_id": str}).iloc[:4]
    kept.to_csv(out, index=False)
    again = simulator.sweep(BASE, GRID, seeds=1, jobs=2, out=out)
    assert len(again) == 6 and again["run_id"].is_unique
    # The four kept rows were not rerun: their wall times are unchanged.
    merged = kept.merge(again, on="run_id", suffixes=("_a", "_b"))
    assert (merged["wall_time_s_a"] == merged["wall_time_s_b"]).all()
    # A third run has nothing left to do.
    assert len(simulator.sweep(BASE, GRID, seeds=1, jobs=1, out=out)) == 6


def test_parallel_and_serial_give_identical_metrics():
    a = simulator.sweep(BASE, GRID, seeds=2, jobs=1)
    b = simulator.sweep(BASE, GRID, seeds=2, jobs=2)
    key = ["parallel.tp", "workload.rate_per_s", "seed"]
    a, b = a.sort_values(key, ignore_index=True), b.sort_values(key, ignore_index=True)
    pd.testing.assert_frame_equal(a[key + METRICS], b[key + METRICS])


def test_ray_backend_matches_local():
    pytest.importorskip("ray")
    grid = {"workload.rate_per_s": [2.0, 16.0]}
    local = simulator.sweep(BASE, grid, seeds=2, jobs=2)
    ray = simulator.sweep(BASE, grid, seeds=2, backend="ray")
    key = ["workload.rate_per_s", "seed"]
    local, ray = local.sort_values(key, ignore_index=True), ray.sort_values(key, ignore_index=True)
    pd.testing.assert_frame_equal(local[["run_id"] + key + METRICS],
                                  ray[["run_id"] + key + METRICS])


def test_cli_sweep_writes_the_csv(tmp_path, capsys):
    import tomli_w

    scenario = tmp_path / "s.toml"
    scenario.write_text(tomli_w.dumps(BASE))
    grid = tmp_path / "g.toml"
    grid.write_text('"workload.rate_per_s" = [2.0, 4.0]\n"parallel.tp" = [1, 3]\n')
    out = tmp_path / "res.csv"
    assert main(["sweep", str(scenario), "--grid", str(grid), "--seeds", "2", "--jobs", "2",
                 "--out", str(out), "--quiet"]) == 0
    df = pd.read_csv(out)
    assert len(df) == 8 and (df["status"] == "error").sum() == 4
    assert "8 runs" in capsys.readouterr().out
    grid.write_text('"parallel.tpp" = [1]\n')
    assert main(["sweep", str(scenario), "--grid", str(grid), "--out", str(out)]) == 2
    assert "parallel.tpp: unknown key (did you mean 'tp'?)" in capsys.readouterr().err
