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


# -- refusals, escaping, partial rows, Ctrl-C ------------------------------------------------
def _write(tmp_path, grid_text: str, base: dict = BASE):
    import tomli_w

    scenario = tmp_path / "s.toml"
    scenario.write_text(tomli_w.dumps(base))
    grid = tmp_path / "g.toml"
    grid.write_text(grid_text)
    return scenario, grid


@pytest.mark.parametrize("flag, value, message", [
    ("--seeds", "-1", "--seeds: -1 runs nothing"),
    ("--seeds", "0", "--seeds: 0 runs nothing"),
    ("--jobs", "0", "--jobs: 0 worker processes"),
])
def test_cli_refuses_counts_that_run_nothing(tmp_path, capsys, flag, value, message):
    scenario, grid = _write(tmp_path, '"parallel.tp" = [1]\n')
    out = tmp_path / "r.csv"
    assert main(["sweep", str(scenario), "--grid", str(grid), flag, value,
                 "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("grid, message", [
    ({"parallel.tp": [1, 2, 1]}, "parallel.tp: 1 is listed twice"),
    ({"zip": {"a": {"parallel.tp": [1, 1], "parallel.dp": [2, 2]}}},
     "zip.a: the point {'parallel.tp': 1, 'parallel.dp': 2} is listed twice"),
])
def test_duplicate_grid_values_are_refused_naming_the_key(grid, message):
    with pytest.raises(simulator.ScenarioError, match=message):
        parse_grid(grid)


def test_zipped_lists_may_repeat_a_value_when_points_differ():
    axes = parse_grid({"zip": {"a": {"parallel.tp": [1, 2], "parallel.dp": [2, 2]}}})
    assert grid_points(axes) == [{"parallel.tp": 1, "parallel.dp": 2},
                                 {"parallel.tp": 2, "parallel.dp": 2}]


def test_formula_cells_are_escaped_in_the_csv(tmp_path):
    import csv

    out = tmp_path / "r.csv"
    names = ["=HYPERLINK(\"http://x\",\"y\")", "+1", "@SUM(A1)", "-2", "plain"]
    simulator.sweep(BASE, {"name": names}, jobs=1, out=out)
    with out.open() as fh:
        cells = [row["name"] for row in csv.DictReader(fh)]
    assert sorted(cells) == sorted(["'" + n for n in names[:4]] + ["plain"])
    assert not [c for c in cells if c[0] in "=+-@\t\r"]


def test_resume_drops_a_partial_last_row_and_says_so(tmp_path, capsys):
    out = tmp_path / "r.csv"
    grid = {"workload.rate_per_s": [2.0, 8.0, 16.0]}
    simulator.sweep(BASE, grid, jobs=1, out=out)
    text = out.read_text()
    lines = text.splitlines(keepends=True)
    out.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])  # a cut write
    capsys.readouterr()
    df = simulator.sweep(BASE, grid, jobs=1, out=out)
    assert "dropped the partial last row" in capsys.readouterr().err
    assert len(df) == 3 and df["run_id"].is_unique and (df["status"] == "ok").all()
    assert out.read_text().count("\n") == 4
    # A whole file is left alone.
    simulator.sweep(BASE, grid, jobs=1, out=out)
    assert "partial" not in capsys.readouterr().err


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_ctrl_c_stops_keeps_finished_rows_and_says_how_to_resume(tmp_path, backend):
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    if backend == "ray":
        pytest.importorskip("ray")
    base = {**BASE, "workload": {**BASE["workload"], "num_requests": 400}}
    rates = [round(1.0 + 0.25 * i, 2) for i in range(40)]
    scenario, grid = _write(tmp_path, f'"workload.rate_per_s" = {rates}\n', base)
    out = tmp_path / "r.csv"
    cmd = [sys.executable, "-m", "simulator", "sweep", str(scenario), "--grid", str(grid),
           "--out", str(out), "--quiet", "--backend", backend]
    if backend == "local":
        cmd += ["--jobs", "2"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    for _ in range(6000):  # until the first row is written (a poll, not a timing)
        if out.exists() and out.read_text().count("\n") >= 2 or proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert "rerun the same command to resume" in err
    kept = pd.read_csv(out)
    assert 1 <= len(kept) < len(rates) and (kept["status"] == "ok").all()
    assert f"{len(kept)} of {len(rates)} runs kept" in err
