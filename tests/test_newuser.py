"""What a new user meets on the command line: ``--unset``, ``--set pools.<name>.key``, Ctrl-C
in ``run``, ``topology show`` of a scenario with pools, a sweep rerun that runs nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import simpy
import tomli_w
from conftest import toy_scenario

from simulator.cli import main
from simulator.errors import ScenarioError
from simulator.io.overrides import apply_overrides
from simulator.io.scenario import load_scenario, to_dict
from simulator.sweep import resolve_point

ROOT = Path(__file__).parent.parent
DSV3 = str(ROOT / "workloads" / "moe-deepseek-v3-2xh200.toml")
DISAGG = str(ROOT / "workloads" / "disagg-70b-1p1d-short.toml")
HETERO = str(ROOT / "workloads" / "disagg-hetero-h100-a100.toml")


def test_unset_removes_a_key_so_the_default_applies():
    s = load_scenario(DSV3, overrides=["workload.arrival=closed_loop",
                                       "workload.concurrency=64"],
                      unsets=["workload.rate_per_s"])
    assert s.workload.rate_per_s is None and s.workload.arrival == "closed_loop"
    # Without --unset the file's rate stays: the clients' first requests are paced.
    kept = load_scenario(DSV3, overrides=["workload.arrival=closed_loop",
                                          "workload.concurrency=64"])
    assert kept.workload.rate_per_s == 8.0
    assert load_scenario(DSV3, unsets=["engine.max_num_seqs"]).engine.max_num_seqs != 512


def test_unset_of_a_key_the_scenario_does_not_set_is_an_error():
    with pytest.raises(ScenarioError, match=r"--unset workload.rate: the scenario does not "
                                            r"set this key"):
        load_scenario(DSV3, unsets=["workload.rate"])
    with pytest.raises(ScenarioError, match=r"--unset 'a\.\.b': expected a key path"):
        load_scenario(DSV3, unsets=["a..b"])


def test_set_reaches_a_pool_by_name_as_sweep_grids_do():
    s = load_scenario(DISAGG, overrides=["pools.prefill.tp=2",
                                         "pools.decode.engine.max_num_seqs=32"])
    pools = {p.name: p for p in s.pools}
    assert pools["prefill"].tp == 2 and pools["decode"].engine["max_num_seqs"] == 32
    # The sweep resolves the same dotted path to the same dict.
    base = load_scenario(DISAGG)
    data = to_dict(base)
    swept = resolve_point(data, {"pools.prefill.tp": 2}, seed=0)
    flagged = apply_overrides(data, ["pools.prefill.tp=2"])
    assert swept["pools"] == flagged["pools"]
    with pytest.raises(ScenarioError, match=r"'nope' is not a pool of the scenario "
                                            r"\(allowed: prefill, decode\)"):
        load_scenario(DISAGG, overrides=["pools.nope.tp=2"])
    with pytest.raises(ScenarioError, match=r"--unset pools.prefill.tp: the scenario does "
                                            r"not set"):
        load_scenario(DISAGG, unsets=["pools.prefill.tp", "pools.prefill.tp"])


def test_unset_on_the_command_line(capsys):
    assert main(["validate", DSV3, "--unset", "workload.rate_per_s", "--set",
                 "workload.arrival=closed_loop", "--set", "workload.concurrency=1024"]) == 0
    assert "closed loop, 1024 clients" in capsys.readouterr().out
    assert main(["validate", DSV3, "--unset", "workload.nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--unset workload.nope" in err


def test_ctrl_c_in_run_keeps_what_was_done_and_exits_130(tmp_path, monkeypatch, capsys):
    """KeyboardInterrupt at the 3,000th event of the default scenario: one line on stderr,
    exit 130, and the files of the requests finished by then."""
    step, n = simpy.Environment.step, [0]

    def interrupted_step(env):
        n[0] += 1
        if n[0] == 3000:
            raise KeyboardInterrupt
        return step(env)

    monkeypatch.setattr(simpy.Environment, "step", interrupted_step)
    rc = main(["run", "--out", str(tmp_path / "run"), "--quiet", "--no-trace"])
    cap = capsys.readouterr()
    assert rc == 130
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("run interrupted (Ctrl-C) at ")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert 0 < summary["requests_completed"] < 2000
    assert "requests completed" in cap.out


def test_ctrl_c_outside_the_simulation_is_one_line(monkeypatch, capsys):
    def stop(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr("simulator.cli.check", stop)
    assert main(["validate"]) == 130
    assert capsys.readouterr().err == "validate: interrupted (Ctrl-C)\n"


def test_topology_show_honours_pools(capsys):
    assert main(["topology", "show", HETERO]) == 0
    out = capsys.readouterr().out
    assert out.startswith("dgx-h100 + dgx-a100 (single_switch fabric): 16 GPUs")
    assert "pool h100 (mixed)  dgx-h100 (h100_sxm), 8 GPUs on node 0" in out
    assert "pool a100 (mixed)  dgx-a100 (a100_sxm), 8 GPUs on node 1" in out
    assert "nvlink   links       8 x 300 GB/s" in out  # the A100's NVLink 3 is there too
    assert main(["topology", "show", HETERO, "--nodes", "3"]) == 2
    assert "not with [[pools]]" in capsys.readouterr().err


def test_a_finished_sweep_rerun_says_nothing_ran(tmp_path, capsys):
    sc, grid = tmp_path / "toy.toml", tmp_path / "grid.toml"
    sc.write_text(tomli_w.dumps(toy_scenario()))
    grid.write_text('"workload.rate_per_s" = [1.0, 2.0]\n')
    argv = ["sweep", str(sc), "--grid", str(grid), "--out", str(tmp_path / "s.csv"),
            "--jobs", "1", "--quiet"]
    assert main(argv) == 0
    assert "nothing ran" not in capsys.readouterr().out
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "2 runs in" in out and "nothing ran: every run was already there" in out
