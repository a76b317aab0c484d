"""compare --measured: each benchmark tool's result file read by hand, the load it offered
turned into a [workload], and measured against simulated figures."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from simulator.cli import main
from simulator.errors import ScenarioError
from simulator.io.measured import Lengths, read_measured
from simulator.metrics.measured import benchmark_workload, comparison, length_spec, simulated

DATA = Path(__file__).parent / "data" / "measured"

SCENARIO = """
name = "bench-8b"
seed = 1
[model]
name = "llama-3.1-8b"
[cluster]
topology = "dgx-h100"
[parallel]
tp = 1
[workload]
arrival = "poisson"
rate_per_s = 3.0
num_requests = 10
prompt_tokens = 100
output_tokens = 10
"""


def test_vllm_bench_serve_result():
    m = read_measured(DATA / "vllm_bench_serve.json")
    assert m.tool == "vllm-bench" and m.requests == 64 and m.concurrency == 8
    assert m.rate_per_s is None  # "inf"
    assert m.prompt == Lengths(512.0, 0.0, 512, 512) and m.output.mean == 128.0
    assert m.metrics["ttft_mean_s"] == pytest.approx(0.050)
    assert m.metrics["ttft_p50_s"] == pytest.approx(0.045)  # median_ttft_ms
    assert m.metrics["e2e_p99_s"] == pytest.approx(1.650)  # p99_e2el_ms
    assert m.metrics["itl_p99_s"] == pytest.approx(0.020)
    assert m.metrics["throughput_tok_per_s"] == 655.36
    assert benchmark_workload(m) == {"num_requests": 64, "prompt_tokens": 512,
                                     "output_tokens": 128, "arrival": "closed_loop",
                                     "concurrency": 8, "client": "vllm-bench"}


def test_sglang_jsonl_needs_a_line_and_reads_either_run():
    with pytest.raises(ScenarioError, match="holds 2 runs.*--line N"):
        read_measured(DATA / "sglang_bench_serving.jsonl")
    first = read_measured(DATA / "sglang_bench_serving.jsonl", line=1)
    assert first.tool == "sglang-bench" and first.concurrency == 16
    assert first.rate_per_s is None  # JSON Infinity
    assert first.prompt.mean == 153600 / 200 and first.metrics["e2e_mean_s"] == 2.4
    assert first.metrics["itl_p95_s"] == pytest.approx(0.014)
    second = read_measured(DATA / "sglang_bench_serving.jsonl", line=2)
    assert second.rate_per_s == 4.0 and second.concurrency is None
    assert benchmark_workload(second)["arrival"] == "poisson"
    with pytest.raises(ScenarioError, match="--line 3 is not a run"):
        read_measured(DATA / "sglang_bench_serving.jsonl", line=3)


def test_aiperf_json_maps_inter_token_latency_to_tpot():
    m = read_measured(DATA / "aiperf_profile_export_aiperf.json")
    assert m.tool == "aiperf" and m.requests == 200 and m.concurrency == 100
    assert m.metrics["tpot_mean_s"] == pytest.approx(0.05176)
    assert "itl_mean_s" not in m.metrics
    assert m.metrics["ttft_p90_s"] == pytest.approx(3.6951)
    assert m.output == Lengths(96.85, 0.88, 91, 97)
    spec = length_spec(m.output)  # varied lengths: a clipped lognormal, cv 0.88 / 96.85
    assert spec["dist"] == "lognormal" and (spec["min"], spec["max"]) == (91, 97)
    assert spec["sigma"] == pytest.approx(math.sqrt(math.log1p((0.88 / 96.85) ** 2)))
    assert length_spec(m.prompt) == 550


def test_perf_csv_export_needs_the_load_from_the_command_line():
    m = read_measured(DATA / "genai_perf_profile_export.csv")
    assert m.tool == "genai-perf" and m.requests == 200 and m.concurrency is None
    assert m.metrics["ttft_p99_s"] == pytest.approx(4.11933)
    assert m.metrics["throughput_req_per_s"] == 13.16
    assert benchmark_workload(m, concurrency=100)["concurrency"] == 100
    assert benchmark_workload(m, rate_per_s=5.0) | {} == {
        "num_requests": 200, "prompt_tokens": 550, "output_tokens": length_spec(m.output),
        "arrival": "poisson", "rate_per_s": 5.0}


def test_trtllm_bench_report():
    m = read_measured(DATA / "trtllm_bench_report.json")
    assert m.tool == "trtllm-bench" and m.requests == 500
    assert m.metrics["ttft_mean_s"] == 4.0 and m.metrics["tpot_p99_s"] == 0.095
    assert m.metrics["e2e_p50_s"] == 15.5 and m.metrics["throughput_tok_per_s"] == 3200.0
    assert "does not record --concurrency" in m.notes[0]
    assert benchmark_workload(m)["concurrency"] == 500  # offline: every request at once


def test_comparison_errors_by_hand():
    m = read_measured(DATA / "vllm_bench_serve.json")
    sim = {"ttft_mean_s": 0.060, "ttft_p50_s": 0.045, "throughput_tok_per_s": 600.0}
    table = comparison(m, sim).set_index("metric")
    assert table.loc["ttft_mean_s", "error_pct"] == pytest.approx(20.0)
    assert table.loc["ttft_p50_s", "error_pct"] == pytest.approx(0.0)
    assert table.loc["throughput_tok_per_s", "error_pct"] == pytest.approx(
        (600 - 655.36) / 655.36 * 100)
    assert math.isnan(table.loc["tpot_mean_s", "simulated"])  # not simulated: no error


def test_simulated_percentiles_are_numpy_linear_over_completed():
    requests = pd.DataFrame({"status": ["completed"] * 4 + ["rejected"],
                             "ttft_s": [1.0, 2.0, 3.0, 4.0, 100.0],
                             "tpot_s": [0.1] * 5, "e2e_s": [5.0] * 5})
    summary = {"itl_mean_s": 0.1, "itl_p50_s": 0.1, "itl_p99_s": 0.2,
               "throughput_req_per_s": 1.0, "throughput_tok_per_s": 10.0}
    sim = simulated(summary, requests)
    assert sim["ttft_mean_s"] == 2.5 and sim["ttft_p50_s"] == 2.5
    assert sim["ttft_p90_s"] == pytest.approx(3.7)  # 1 + 0.9 * 3
    assert sim["itl_p99_s"] == 0.2 and "itl_p90_s" not in sim


def test_rate_with_a_concurrency_cap_is_a_rate_limited_closed_loop(tmp_path):
    data = json.loads((DATA / "vllm_bench_serve.json").read_text())
    data |= {"request_rate": 2.0, "burstiness": 4.0}
    path = tmp_path / "capped.json"
    path.write_text(json.dumps(data))
    wl = benchmark_workload(read_measured(path))
    assert (wl["arrival"], wl["concurrency"], wl["rate_per_s"]) == ("closed_loop", 8, 2.0)
    assert wl["cv"] == pytest.approx(0.5)  # gamma shape 4: cv 1 / sqrt(4)


@pytest.mark.parametrize("content, words", [
    ("", "neither JSON"), ("[1, 2]", "not a JSON object"), ('{"a": 1}', "no benchmark"),
    ("[" * 100_000, "nested too deeply"),
    ('{"mean_ttft_ms": -1, "completed": 1, "total_input_tokens": 1, '
     '"total_output_tokens": 1}', "mean_ttft_ms is not a non-negative number"),
    ('{"mean_ttft_ms": 1, "completed": 0}', "completed is not a positive number"),
])
def test_bad_result_files_are_one_clean_error(tmp_path, content, words):
    path = tmp_path / "r.json"
    path.write_text(content)
    with pytest.raises(ScenarioError, match=words):
        read_measured(path)


def test_cli_compare_measured_end_to_end(tmp_path, capsys):
    scenario = tmp_path / "bench.toml"
    scenario.write_text(SCENARIO)
    out = tmp_path / "out"
    assert main(["compare", "--measured", str(DATA / "vllm_bench_serve.json"),
                 str(scenario), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "64 requests, 8 concurrent clients, prompts 512 and outputs 128" in printed
    table = pd.read_csv(out / "measured_vs_simulated.csv")
    assert set(table["metric"]) >= {"ttft_mean_s", "tpot_p99_s", "e2e_p50_s",
                                    "throughput_tok_per_s"}
    err = (table["simulated"] - table["measured"]) / table["measured"] * 100
    assert (err - table["error_pct"]).abs().max() < 1e-9
    # The simulation offered the benchmark's load: 64 requests of exactly 512 + 128 tokens.
    tok = table.set_index("metric").loc["throughput_tok_per_s", "simulated"]
    req = table.set_index("metric").loc["throughput_req_per_s", "simulated"]
    assert tok / req == pytest.approx(128)
    assert (out / "measured_vs_simulated.png").stat().st_size > 10_000


def test_cli_compare_measured_bad_arguments(tmp_path, capsys):
    scenario = tmp_path / "bench.toml"
    scenario.write_text(SCENARIO)
    cases = [(["compare", "--measured", str(DATA / "vllm_bench_serve.json"), str(scenario),
               str(scenario)], "one scenario"),
             (["compare", "--measured", str(tmp_path / "none.json"), str(scenario)],
              "none.json' not found"),
             (["compare", "--measured", str(DATA / "genai_perf_profile_export.csv"),
               str(scenario), "--concurrency", "0"], "--concurrency"),
             (["compare", "--measured", str(DATA / "genai_perf_profile_export.csv"),
               str(scenario), "--rate", "nan"], "--rate"),
             (["compare", str(tmp_path)], "two or more run folders")]
    for argv, words in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert words in err and len(err.splitlines()) == 1, (argv, err)


def test_a_link_to_a_device_is_refused_before_reading(tmp_path):
    link = tmp_path / "result.json"
    link.symlink_to("/dev/zero")
    with pytest.raises(ScenarioError, match="not a regular file"):
        read_measured(link)
