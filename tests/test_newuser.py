"""What a new user meets on the command line: ``--unset``, ``--set pools.<name>.key``, Ctrl-C
in ``run``, ``topology show`` of a scenario with pools, a sweep rerun that runs nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
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


# -- the printout, report and compare per mode -------------------------------------------
def _run_cli(argv, capsys) -> str:
    assert main(argv) == 0
    return capsys.readouterr().out


def test_printout_names_the_mode_figures_and_a_verdict(tmp_path, capsys):
    """A disaggregated MoE-free run: each pool's busy share, the KV transfers, cost and
    energy; the verdict says it keeps up (48 req/s offered, all within the SLOs)."""
    out = _run_cli(["run", DISAGG, "--out", str(tmp_path / "d"), "--quiet", "--no-trace",
                    "--set", "workload.num_requests=400"], capsys)
    summary = json.loads((tmp_path / "d" / "summary.json").read_text())
    lines = {line[:32].strip(): line[32:].strip() for line in out.splitlines()[1:]}
    assert lines["verdict"].startswith("keeps up with ")
    util = summary["pool_utilization"]
    assert lines["pools busy"] == f"prefill {util['prefill']:.1%}, decode {util['decode']:.1%}"
    assert lines["KV transfer mean / p99 (s)"].startswith(
        f"{summary['kv_transfer_mean_s']:.4f} / {summary['kv_transfer_p99_s']:.4f} (400 ")
    assert lines["cost per million output tok"].startswith(
        f"${summary['cost_per_million_tokens_usd']:.2f}")
    assert lines["output tok/s per GPU"].startswith(
        f"{summary['throughput_tok_per_s'] / 16:,.1f} (16 GPUs)")
    assert "speculation" not in lines and "MoE imbalance, all-to-all" not in lines


def test_verdict_falls_behind_and_closed_loop():
    from simulator.cluster.running import run  # noqa: PLC0415
    from simulator.printout import verdict  # noqa: PLC0415

    # 40 requests/s of 100 + 50 tokens on the toy replica of 8 sequences: far past capacity.
    res = run(toy_scenario(engine={"max_num_seqs": 8, "step_overhead_s": 0.005},
                           workload={"arrival": "constant", "rate_per_s": 40.0,
                                     "num_requests": 400, "prompt_tokens": 100,
                                     "output_tokens": 50}))
    line = verdict(res.summary, res.requests, False)
    assert line.startswith("falls behind 40 req/s offered: ")
    assert "closed loop" in verdict(res.summary, res.requests, True)


def test_mode_lines_of_speculation_prefix_moe_and_alerts():
    from simulator.printout import mode_lines  # noqa: PLC0415

    summary = {"acceptance_length_mean": 2.5, "spec_step_fraction": 0.9,
               "draft_time_share": 0.05, "prefix_hit_rate": 0.123,
               "prefill_tokens_saved": 12345, "moe_imbalance_mean": 1.95,
               "moe_a2a_share": 0.32}
    alerts = pd.DataFrame({"time_s": [2.0, 5.0, 9.0, 3.0], "rule": ["a", "a", "a", "b"],
                           "event": ["fire", "clear", "fire", "fire"],
                           "replica": ["all", "all", "all", "0"]})
    lines = mode_lines(summary, alerts)
    assert any("2.50 tokens per verification step, 90% of decode steps" in x for x in lines)
    assert any("12.3% of prompt tokens (12,345 prefill tokens saved)" in x for x in lines)
    assert any("1.95 (busiest rank / mean), all-to-all 32% of step time" in x for x in lines)
    assert lines[-1].endswith("a x2 (first at 2 s)")  # rule b fired on a replica only


def test_compare_shows_mode_keys_and_counts_as_integers(tmp_path, capsys):
    from simulator.report import format_compare, html_report  # noqa: PLC0415

    a, b = tmp_path / "a", tmp_path / "b"
    for out, rate in ((a, 2.0), (b, 4.0)):
        sc = tmp_path / f"{out.name}.toml"
        sc.write_text(tomli_w.dumps(toy_scenario(workload={
            "arrival": "constant", "rate_per_s": rate, "num_requests": 1500,
            "prompt_tokens": 100, "output_tokens": 20})))
        _run_cli(["run", str(sc), "--out", str(out), "--quiet", "--no-trace"], capsys)
    text = _run_cli(["compare", str(a), str(b), "--out", str(tmp_path / "c")], capsys)
    rows = {cells[0]: cells[1:] for cells in (re.split(r"\s{2,}", line.strip())
                                               for line in text.splitlines()[1:-1])}
    assert rows["requests"][:2] == ["1,500", "1,500"]
    summary = json.loads((b / "summary.json").read_text())
    per_gpu = summary["throughput_tok_per_s"] / summary["gpus"]
    assert rows["output tok/s per GPU"][1] == f"{per_gpu:.4g}"
    assert "e+" not in text
    assert "prefix hit rate" not in rows  # zero in both runs: not this mode
    page = html_report(b).read_text()
    assert "<title>" + str(ROOT / "tests" / "data" / "toy_model.json") in page
    assert "<li>layout TP1 PP1 DP1</li>" in page and "<li>verdict: keeps up with 4 req/s" in page
    assert format_compare  # imported for the table above


# -- plots of runs with and without step records -----------------------------------------
@pytest.fixture(scope="module")
def no_steps_run(tmp_path_factory):
    """The toy under load (alerts fire), written without per-step records."""
    out = tmp_path_factory.mktemp("nosteps") / "run"
    sc = out.parent / "toy.toml"
    sc.write_text(tomli_w.dumps(toy_scenario(
        engine={"max_num_seqs": 4, "step_overhead_s": 0.02},
        workload={"arrival": "constant", "rate_per_s": 40.0, "num_requests": 200,
                  "prompt_tokens": 100, "output_tokens": 20},
        alerts={"ttft_p99_s": 1.0, "fire_after": 1})))
    assert main(["run", str(sc), "--out", str(out), "--quiet", "--no-steps"]) == 0
    return out


def test_plots_without_steps_have_a_time_axis_and_no_empty_panels(no_steps_run, capsys):
    from simulator.plotting import run_figures  # noqa: PLC0415

    figs = run_figures(no_steps_run)
    assert "pipeline_gantt" not in figs and "gpu_heatmap" not in figs
    fig = figs["timeseries"]
    fig.canvas.draw()
    axes = fig.get_axes()
    assert len(axes) == 3  # no KV panel without step records
    for ax in axes:
        labels = [t.get_text() for t in ax.get_xticklabels() if t.get_visible()]
        assert ax.get_xlabel() == "time (s)" and any(labels), labels
        assert len(ax.get_xticks()) >= 3
    # Alert lines are named by their rule; legends sit outside the data area.
    assert any(t.get_text().strip() == "ttft_p99_above" for t in axes[0].texts)
    for ax in axes:
        legend = ax.get_legend()
        assert legend is not None
        frame, box = ax.get_window_extent(), legend.get_window_extent()
        assert box.x0 >= frame.x1  # to the right of the frame: covers no data
    assert main(["plot", str(no_steps_run)]) == 0
    out = capsys.readouterr().out
    assert "not drawn: pipeline_gantt.png, gpu_heatmap.png (the run kept no per-step" in out
    assert not (no_steps_run / "pipeline_gantt.png").exists()


# -- output size ---------------------------------------------------------------------------
def test_trace_bounded_to_its_first_steps_and_said_so(tmp_path, monkeypatch, capsys):
    import gzip  # noqa: PLC0415

    from simulator.io import writers  # noqa: PLC0415

    monkeypatch.setattr(writers, "LARGE_BYTES", 1000.0)  # warn on this small run
    sc = tmp_path / "toy.toml"
    sc.write_text(tomli_w.dumps(toy_scenario(
        workload={"arrival": "constant", "rate_per_s": 5.0, "num_requests": 40,
                  "prompt_tokens": 100, "output_tokens": 30},
        output={"trace_max_steps": 100})))
    assert main(["run", str(sc), "--out", str(tmp_path / "r"), "--quiet"]) == 0
    cap = capsys.readouterr()
    steps = pd.read_csv(tmp_path / "r" / "steps.csv")
    cut = float(np.sort(steps["start_s"].to_numpy())[100])
    assert f"trace: the first 100 of {len(steps):,} steps, up to {cut:.1f} s" in cap.out
    size = (tmp_path / "r" / "steps.csv").stat().st_size
    assert cap.err.startswith("warning: writing steps.csv of about ")
    quoted = float(cap.err.split("about ")[1].split(" MB")[0]) * 1e6
    assert abs(quoted - size) <= 0.1 * size + 0.5e6  # the estimate, to the MB printed
    assert f"MB ({len(steps):,} step rows)" in cap.err
    events = json.load(gzip.open(tmp_path / "r" / "trace.json.gz"))["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X" and e["name"] != "all-reduce"]
    assert len(spans) == 100
    assert max(e["ts"] for e in spans) < cut * 1e6
    # 0: every step.
    assert main(["run", str(sc), "--out", str(tmp_path / "all"), "--quiet",
                 "--set", "output.trace_max_steps=0"]) == 0
    assert "trace: the first" not in capsys.readouterr().out
    events = json.load(gzip.open(tmp_path / "all" / "trace.json.gz"))["traceEvents"]
    assert len([e for e in events if e.get("ph") == "X" and e["name"] != "all-reduce"]) == len(
        steps)


def test_a_large_trace_is_warned_before_it_is_written(tmp_path, monkeypatch, capsys):
    """The trace's JSON size is estimated from its first events (the bounded window's) and
    warned above the threshold; the quoted size is the file's, uncompressed, to 10%."""
    from simulator.io import chrome_trace, writers  # noqa: PLC0415

    sc = tmp_path / "toy.toml"
    sc.write_text(tomli_w.dumps(toy_scenario(
        workload={"arrival": "constant", "rate_per_s": 5.0, "num_requests": 40,
                  "prompt_tokens": 100, "output_tokens": 30},
        output={"trace_gzip": False})))
    assert main(["run", str(sc), "--out", str(tmp_path / "small"), "--quiet"]) == 0
    assert "trace of about" not in capsys.readouterr().err  # under 200 MB: no warning
    size = (tmp_path / "small" / "trace.json").stat().st_size
    monkeypatch.setattr(writers, "LARGE_BYTES", size / 2)
    assert main(["run", str(sc), "--out", str(tmp_path / "r"), "--quiet"]) == 0
    err = capsys.readouterr().err
    line = next(ln for ln in err.splitlines() if "trace of about" in ln)
    assert line.startswith("warning: writing a trace of about ") and "--no-trace" in line
    assert "output.trace_max_steps bounds its steps" in line
    quoted = float(line.split("about ")[1].split(" MB")[0]) * 1e6
    assert abs(quoted - size) <= 0.1 * size + 0.5e6
    est = chrome_trace.json_bytes(*[pd.read_csv(tmp_path / "r" / f) for f in
                               ("requests.csv", "steps.csv")])
    assert abs(est - size) <= 0.1 * size  # the estimate itself, to a few percent
    # A bounded trace is estimated over the steps it keeps: 20 of them, under the threshold.
    assert main(["run", str(sc), "--out", str(tmp_path / "b"), "--quiet",
                 "--set", "output.trace_max_steps=20"]) == 0
    assert "trace of about" not in capsys.readouterr().err


def test_howto_links_name_existing_sections():
    """docs/howto.md points to sections as docs/<page>.md, "<heading>": each exists."""
    text = (ROOT / "docs" / "howto.md").read_text()
    refs = re.findall(r'docs/([a-z-]+\.md), "([^"]+)"', text.replace("\n", " "))
    assert len(refs) >= 10
    for page, heading in refs:
        headings = re.findall(r"^#+ (.+)$", (ROOT / "docs" / page).read_text(), re.M)
        assert any(h.startswith(heading) for h in headings), (page, heading)
    for page in set(re.findall(r"docs/([a-z-]+\.md)", text)):
        assert (ROOT / "docs" / page).exists(), page
