"""The planner as an operator runs it: exit codes 0 / 2 / 3 (answer, bad input, nothing
meets), Ctrl-C ends with what is known (130, no traceback), ``--requests`` is the sample
simulated (above the scenario's count too) while recommended.toml keeps the scenario's
count, the sweep backends give the same plan, and ``capacity`` never counts a run too short
to judge keeping up as keeping up."""

from __future__ import annotations

import copy
import importlib
import math
from pathlib import Path

import pandas as pd
import pytest
import tomli_w
import tomllib

from simulator.cli import EXIT_INTERRUPTED, EXIT_NO_ANSWER, main
from simulator.planner import capacity, plan
from simulator.planner.report import RECOMMENDED, recommended_scenario
from tests.test_planner import SMALL

plan_module = importlib.import_module("simulator.planner.plan")
search = importlib.import_module("simulator.planner.search")
capacity_module = importlib.import_module("simulator.planner.capacity")


def _small(**workload) -> dict:
    s = copy.deepcopy(SMALL)
    s["workload"].update(workload)
    return s


def test_requests_is_the_sample_and_recommended_keeps_the_scenarios_count():
    # 80 requests in the scenario; 120 simulated (more than it has)
    r = plan(_small(), gpus=1, top=1, requests=120, jobs=1)
    assert r.stats.requests == 120 and r.own_requests == 80
    pick = recommended_scenario(r)
    assert pick is not None and pick["workload"]["num_requests"] == 80
    # without --requests: the scenario's own 80 (under the default cap of 500)
    r = plan(_small(), gpus=1, top=1, jobs=1)
    assert r.stats.requests == 80
    assert recommended_scenario(r)["workload"]["num_requests"] == 80


def test_cli_exit_0_writes_a_recommendation_that_keeps_the_count(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text(tomli_w.dumps(_small()))
    out = tmp_path / "o"
    assert main(["plan", str(path), "--gpus", "1", "--top", "1", "--jobs", "1",
                 "--requests", "100", "--colocated-only", "--no-plot", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "100 requests simulated per candidate" in text
    rec = tomllib.loads((out / RECOMMENDED).read_text())
    assert rec["workload"]["num_requests"] == 80


def test_ctrl_c_returns_what_finished(monkeypatch, tmp_path, capsys):
    real = search.simulate_many

    def one_then_interrupt(jobs, *args, **kwargs):
        stream = real(dict(list(jobs.items())[:1]), *args, **kwargs)
        yield from stream
        raise KeyboardInterrupt

    monkeypatch.setattr(search, "simulate_many", one_then_interrupt)
    r = plan(_small(), gpus=2, top=3, jobs=1)
    assert r.interrupted and len(r.table) == 1  # one simulation finished, then Ctrl-C
    path = tmp_path / "s.toml"
    path.write_text(tomli_w.dumps(_small()))
    rc = main(["plan", str(path), "--gpus", "2", "--top", "3", "--jobs", "1",
               "--colocated-only", "--no-plot", "--out", str(tmp_path / "o")])
    captured = capsys.readouterr()
    assert rc in (EXIT_INTERRUPTED, EXIT_NO_ANSWER)  # the one run may or may not meet
    assert "stopped    by Ctrl-C after 1 simulations" in captured.out
    assert "Traceback" not in captured.err
    assert (tmp_path / "o" / "plan.csv").exists()


def test_ctrl_c_before_any_simulation_is_one_line(monkeypatch, tmp_path, capsys):
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt
        yield  # a generator, as the real one

    monkeypatch.setattr(search, "simulate_many", interrupt)
    path = tmp_path / "s.toml"
    path.write_text(tomli_w.dumps(_small()))
    assert main(["plan", str(path), "--gpus", "1", "--colocated-only", "--no-plot",
                 "--out", str(tmp_path / "o")]) == EXIT_INTERRUPTED
    assert capsys.readouterr().err.strip() == "plan: interrupted (Ctrl-C)"


@pytest.mark.parametrize("args", [["--requests", "0"], ["--top", "0"]])
def test_bad_input_exits_2(tmp_path, capsys, args):
    path = tmp_path / "s.toml"
    path.write_text(tomli_w.dumps(_small()))
    assert main(["plan", str(path), *args, "--no-plot", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert args[0] in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_capacity_never_counts_a_short_run_as_keeping_up():
    """80 requests: at high rates the steady window is too short to judge keeping up
    (NaN ratio). Such probes must not be sustained, so the answer is a rate whose run did
    show it keeps up."""
    r = capacity(_small(), requests=80)
    met = r.curve[r.curve["met"]]
    assert not met.empty and met["keep_up_ratio"].map(math.isfinite).all()
    short = r.curve[r.curve["keep_up_ratio"].isna()]
    assert not short["met"].any()
    assert r.rate_per_s == met["rate_per_s"].max()


def test_capacity_exit_3_when_no_rate_meets(tmp_path, capsys):
    s = _small()
    s["slo"]["tpot_s"] = 1e-5  # no layout decodes a token in 10 us
    path = tmp_path / "s.toml"
    path.write_text(tomli_w.dumps(s))
    assert main(["capacity", str(path), "--no-plot", "--out", str(tmp_path / "o")]) == 3
    err = capsys.readouterr().err
    assert "meets the SLOs at no rate" in err and "Traceback" not in err


def test_capacity_ctrl_c_keeps_the_bracket(monkeypatch):
    real, calls = capacity_module.simulate, []

    def interrupt_on_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(capacity_module, "simulate", interrupt_on_third)
    r = capacity(_small(), requests=200)
    assert r.interrupted and len(r.curve) == 2
    assert r.rate_per_s == r.curve[r.curve["met"]]["rate_per_s"].max()


def test_ray_backend_gives_the_local_plan():
    pytest.importorskip("ray")
    local = plan(_small(), gpus=1, top=2, jobs=1)
    ray = plan(_small(), gpus=1, top=2, backend="ray")
    cols = [c for c in local.table.columns if c not in ("wall_time_s",)]
    pd.testing.assert_frame_equal(local.table[cols], ray.table[cols])


def _doc_block(after: str, lang: str) -> str:
    text = (Path(__file__).resolve().parents[1] / "docs" / "planner.md").read_text()
    start = text.index(f"```{lang}\n", text.index(after)) + len(lang) + 4
    return text[start:text.index("```", start)]


def test_doc_capacity_of_a_short_run_figures():
    """docs/planner.md, Capacity: 42 req/s (a lower bound) with 100 requests, 62 with
    3000, where the NaN keep-up ratio counted as keeping up gave 2.5e+03."""
    s = tomllib.loads(_doc_block("This scenario (`capacity-8b-100.toml`)", "toml"))
    short = capacity(s)
    assert f"{short.rate_per_s:.3g}" == "42" and f"{short.failed_rate_per_s:.3g}" == "44"
    assert "too short to judge keeping up" in short.bound
    assert f"{capacity(s, requests=3000).rate_per_s:.3g}" == "62"
