"""What a user reads: the run printout, validate's notes, model names."""

from __future__ import annotations

import json

from conftest import DATA, rejecting_scenario, toy_scenario

import simulator
from simulator.cli import format_summary, main


def test_printout_counts_rejected_requests_with_their_reason_and_the_slo():
    res = simulator.run(rejecting_scenario())
    s = res.summary
    text = format_summary("toy", s, res.requests)
    assert f"requests completed / total     {s['requests_completed']} / 20" in text
    assert (f"requests rejected              {s['requests_rejected']}: prompt + output tokens "
            f"exceed max_model_len 300") in text
    assert f"SLO attainment                 {s['slo_attainment']:.3f}" in text
    assert "output throughput (tok/s)" in text
    assert "dropped" not in text and "availability" not in text  # trivial: not shown


def test_printout_of_a_failure_run_says_what_failed_and_when():
    res = simulator.run(toy_scenario(
        cluster={"nodes": 2}, parallel={"dp": 2},
        workload={"arrival": "constant", "rate_per_s": 5.0, "num_requests": 100,
                  "prompt_tokens": 100, "output_tokens": 20},
        faults=[{"at_s": 4.0, "target": "node:1", "duration_s": 6.0}],
        recovery={"restart_s": 2.0}))
    text = format_summary("toy", res.summary, res.requests)
    assert "replica 1 down                 at 4.0 s (node:1 failed), up again at 12.0 s" in text
    avail = res.summary["availability_min"]
    assert avail < 1 and "availability mean / min" in text and f"{avail:.3f}" in text


def test_validate_says_when_max_model_len_was_lowered(capsys, tmp_path):
    assert main(["validate", "--set", "engine.scheduler=vllm_v0"]) == 0
    out = capsys.readouterr().out
    assert "max_model_len 8192 (lowered from the model's 131072 to fit max_num_batched_tokens" \
        in out
    assert main(["validate"]) == 0
    assert "lowered" not in capsys.readouterr().out


def test_a_config_json_model_is_named_by_its_folder(tmp_path):
    folder = tmp_path / "My-Model-8B"
    folder.mkdir()
    (folder / "config.json").write_text((DATA / "toy_model.json").read_text())
    sc = toy_scenario(model={"name": str(folder / "config.json")})
    assert simulator.build_plan(simulator.load_scenario(sc)).model.name == "My-Model-8B"
    assert json.loads((DATA / "toy_model.json").read_text())  # the fixture itself is intact


def test_plan_writes_a_runnable_scenario_for_its_pick(tmp_path):
    import pytest
    from test_planner import SMALL

    from simulator.planner import plan
    from simulator.planner.report import RECOMMENDED, write_plan

    result = plan(SMALL, gpus=4, top=3, requests=None, jobs=1)
    assert result.best is not None
    files = write_plan(result, tmp_path, figure=False)
    assert tmp_path / RECOMMENDED in files
    best = result.best
    sc = simulator.load_scenario(tmp_path / RECOMMENDED)
    assert (sc.parallel.tp, sc.parallel.pp, sc.parallel.dp) == \
        (best["tp"], best["pp"], best["dp"])
    assert sc.engine.max_num_seqs == best["max_num_seqs"]
    # Running it gives the figures the plan ranked it on.
    s = simulator.run(sc).summary
    assert s["ttft_p99_s"] == pytest.approx(best["ttft_p99_s"])
    assert s["tpot_p50_s"] == pytest.approx(best["tpot_p50_s"])
    assert main(["capacity", str(tmp_path / RECOMMENDED), "--out", str(tmp_path / "cap"),
                 "--no-plot", "--requests", "80"]) == 0


def _two_runs(tmp_path):
    a = simulator.run(toy_scenario(workload={"num_requests": 30, "rate_per_s": 5.0}))
    b = simulator.run(toy_scenario(workload={"num_requests": 30, "rate_per_s": 50.0}))
    simulator.write_result(a, tmp_path / "slow")
    simulator.write_result(b, tmp_path / "fast")
    return a, b


def test_report_is_one_self_contained_html_file(tmp_path, capsys):
    import base64
    import re

    a, _ = _two_runs(tmp_path)
    assert main(["report", str(tmp_path / "slow")]) == 0
    page = (tmp_path / "slow" / "report.html").read_text()
    assert capsys.readouterr().out.strip() == str(tmp_path / "slow" / "report.html")
    images = re.findall(r"src='data:image/png;base64,([^']+)'", page)
    assert len(images) == 4  # latency CDFs, time series, Gantt, GPU heat map
    assert all(base64.b64decode(i).startswith(b"\x89PNG") for i in images)
    assert not re.search(r"(src|href)=['\"](?!data:)", page)  # nothing outside the file
    assert f"<td>TTFT p99 (s)</td><td>{a.summary['ttft_p99_s']:.4g}</td>" in page
    assert 'name = &quot;toy&quot;' in page  # the scenario, escaped
    assert "<h2>Alerts</h2>" in page
    assert main(["report", str(tmp_path)]) == 2
    assert "is not a run folder" in capsys.readouterr().err


def test_compare_tabulates_differences_and_overlays_cdfs(tmp_path, capsys):
    import pandas as pd

    a, b = _two_runs(tmp_path)
    out = tmp_path / "cmp"
    assert main(["compare", str(tmp_path / "slow"), str(tmp_path / "fast"),
                 "--out", str(out)]) == 0
    table = pd.read_csv(out / "compare.csv").set_index("metric")
    row = table.loc["ttft_p99_s"]
    assert row["slow"] == a.summary["ttft_p99_s"] and row["fast"] == b.summary["ttft_p99_s"]
    assert row["fast - slow"] == b.summary["ttft_p99_s"] - a.summary["ttft_p99_s"]
    assert (out / "compare_cdf.png").stat().st_size > 5000
    assert "TTFT p99 (s)" in capsys.readouterr().out
    assert main(["compare", str(tmp_path / "slow")]) == 2


def test_parquet_output_holds_the_same_tables_as_csv(tmp_path):
    import pandas as pd

    sc = toy_scenario(workload={"num_requests": 30, "rate_per_s": 20.0})
    csv_run = simulator.run(sc)
    pq_run = simulator.run({**sc, "output": {"format": "parquet"}})
    simulator.write_result(csv_run, tmp_path / "csv")
    simulator.write_result(pq_run, tmp_path / "pq")
    for stem in ("requests", "steps", "timeseries", "gpu_timeseries"):
        assert not (tmp_path / "pq" / f"{stem}.csv").exists()
        a = pd.read_csv(tmp_path / "csv" / f"{stem}.csv")
        b = pd.read_parquet(tmp_path / "pq" / f"{stem}.parquet")
        if stem == "requests":  # an empty reason reads back from CSV as NaN
            a["reason"] = a["reason"].astype(object).fillna("")
            a, b = a.astype({"reason": str, "status": str}), b.astype({"reason": str,
                                                                      "status": str})
        pd.testing.assert_frame_equal(a, b, check_dtype=False, check_categorical=False)
    assert main(["report", str(tmp_path / "pq")]) == 0  # readers take either


def test_trace_is_gzipped_by_default_and_plain_on_request(tmp_path):
    import gzip

    sc = toy_scenario(workload={"num_requests": 30, "rate_per_s": 20.0})
    simulator.write_result(simulator.run(sc), tmp_path / "gz")
    simulator.write_result(simulator.run({**sc, "output": {"trace_gzip": False}}),
                           tmp_path / "plain")
    packed = (tmp_path / "gz" / "trace.json.gz").read_bytes()
    plain = (tmp_path / "plain" / "trace.json").read_bytes()
    assert not (tmp_path / "gz" / "trace.json").exists()
    assert gzip.decompress(packed) == plain and len(packed) * 3 < len(plain)
    json.loads(plain)


def test_topology_drawing_is_laid_out_by_node_with_gpus_in_order(tmp_path):
    from simulator.hardware.specs import load_node
    from simulator.topology.graph import build_graph
    from simulator.topology.summary import layout

    g = build_graph(load_node("dgx-h100"), 2, "leaf_spine", 1.0)
    pos = layout(g)
    xs = [pos[f"gpu{i}"][0] for i in range(16)]
    assert xs == sorted(xs) and len(set(xs)) == 16  # index order, left to right
    assert max(xs[:8]) < min(xs[8:])  # node 0's block, then node 1's
    assert {pos[f"gpu{i}"][1] for i in range(16)} == {0.0}
    assert all(pos[v][1] > 0 for v, d in g.nodes(data=True) if d["kind"] in ("nic", "switch"))
    assert main(["topology", "show", "dgx-h100", "--nodes", "2", "--png",
                 str(tmp_path / "t.png")]) == 0
    assert (tmp_path / "t.png").stat().st_size > 10000


def test_an_error_from_set_names_the_flag(capsys):
    path = str(simulator.paths.ROOT / "workloads" / "llama70b-2xdgx.toml")
    assert main(["validate", path, "--set", "parallel.tp=3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"{path}: --set parallel.tp=3: parallel.tp: 3 does not divide")
    assert main(["validate", "--set", "parallel.tpp=3"]) == 2  # the default scenario: no file
    assert capsys.readouterr().err.startswith("--set parallel.tpp=3: parallel.tpp: unknown key")
