"""Named benchmark clients: a concurrency-4 benchmark's dispatch timeline by hand, each
client's warm-up and what it leaves out of the results, the API server in front of the
engine (requests in turn), and bad input."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import benchmark_module, toy_scenario

import simulator
from simulator.engine.host import ApiServer
from simulator.errors import ScenarioError
from simulator.io import schema
from simulator.workload.clients import CLIENTS

C, N, PROMPT, OUTPUT = 4, 12, 100, 40


def _bench(client: str | None = None, **engine) -> simulator.Result:
    workload = {"arrival": "closed_loop", "concurrency": C, "num_requests": N,
                "prompt_tokens": PROMPT, "output_tokens": OUTPUT}
    if client is not None:
        workload["client"] = client
    return simulator.run(_toy(workload, **engine))


def _toy(workload: dict, **engine) -> dict:
    """The toy scenario with exactly this workload (no request rate: ``inf``)."""
    s = toy_scenario(engine=engine)
    s["workload"] = workload
    return s


def _start(res: simulator.Result) -> float:
    return float(res.requests["arrival_s"].min())


def test_the_names_in_the_schema_are_the_registry():
    meta = {f.name: f.metadata for f in dataclasses.fields(schema.WorkloadKeys)}
    assert meta["client"]["choices"] is CLIENTS
    assert tuple(CLIENTS) == ("vllm-bench", "sglang-bench", "aiperf", "genai-perf",
                              "trtllm-bench")


def test_concurrency_4_dispatch_timeline_by_hand():
    res = _bench("vllm-bench")
    req = res.requests.sort_values("request_id").reset_index(drop=True)
    t0 = _start(res)
    # The measured run: ids 0..N-1 only (the warm-up is left out), the first C sent
    # together when the warm-up is over, every later one the moment a client is free:
    # request C + k is sent when the k-th completion reaches its client.
    assert req["request_id"].tolist() == list(range(N))
    assert (req["arrival_s"].iloc[:C] == t0).all()
    ends = np.sort(req["finish_s"].to_numpy())
    np.testing.assert_array_equal(req["arrival_s"].iloc[C:].to_numpy(), ends[:N - C])
    # Fixed lengths: the four first requests finish in order, so do their successors;
    # each client sends its next request at its last one's finish (ids in send order).
    fin = req["finish_s"].to_numpy()
    np.testing.assert_array_equal(req["arrival_s"].iloc[C:].to_numpy(), fin[:N - C])
    # The warm-up (vllm's "initial single prompt test run") ran alone before t0: one
    # prefill step and OUTPUT - 1 decode steps of one sequence, the last ending at t0.
    before = res.steps[res.steps["end_s"] <= t0]
    assert len(before) == OUTPUT and (before["batch_size"] == 1).all()
    assert before["end_s"].max() == t0
    assert before["prefill_tokens"].sum() == PROMPT


def test_sglang_warms_up_with_at_most_32_tokens_then_sleeps_a_second():
    res = _bench("sglang-bench")
    t0 = _start(res)
    before = res.steps[res.steps["end_s"] <= t0]
    assert len(before) == 32 and (before["batch_size"] == 1).all()  # min(OUTPUT, 32)
    assert t0 == pytest.approx(before["end_s"].max() + 1.0, abs=1e-9)


def test_trtllm_bench_warms_up_with_two_together_and_skips_the_api_server():
    res = _bench("trtllm-bench", api_request_s=0.004)
    t0 = _start(res)
    before = res.steps[res.steps["end_s"] <= t0]
    assert len(before) == OUTPUT and (before["batch_size"] == 2).all()
    # In-process token ids: the first C reach the idle engine at their send.
    first = res.requests.sort_values("request_id").iloc[:C]
    assert (first["first_scheduled_s"] == t0).all()


def test_aiperf_sends_no_warm_up_and_an_override_adds_them():
    assert _start(_bench("aiperf")) == 0.0
    assert _start(_bench("genai-perf")) == 0.0
    res = simulator.run(_toy({
        "arrival": "closed_loop", "concurrency": C, "num_requests": N, "client": "aiperf",
        "warmup_requests": 3, "prompt_tokens": PROMPT, "output_tokens": OUTPUT}))
    before = res.steps[res.steps["end_s"] <= _start(res)]
    assert len(before) == OUTPUT and (before["batch_size"] == 3).all()  # together
    assert len(res.requests) == N


def test_the_api_server_takes_requests_in_turn():
    api = ApiServer(0.002, 1e-6)
    # Three sent at once: each waits for the one before (2 ms + 1 us per prompt token).
    assert api.enter(0.0, 1000) == pytest.approx(0.003)
    assert api.enter(0.0, 1000) == pytest.approx(0.006)
    assert api.enter(0.0, 0) == pytest.approx(0.008)
    assert api.enter(1.0, 500) == pytest.approx(1.0025)  # free again: starts at its send


def test_ttft_counts_the_api_server_and_the_engine_sees_each_request_after_it():
    res = _bench("vllm-bench", api_request_s=0.004)
    req = res.requests.sort_values("request_id")
    t0 = _start(res)
    first = req.iloc[:C]
    # The first C, sent together at t0, reach the engine 4, 8, 12 and 16 ms later, in
    # turn; none is scheduled before it got there, and TTFT counts from the send.
    reach = t0 + 0.004 * np.arange(1, C + 1)
    assert (np.sort(first["first_scheduled_s"].to_numpy()) >= reach - 1e-9).all()
    assert first["first_scheduled_s"].min() == pytest.approx(reach[0], abs=1e-9)
    np.testing.assert_allclose(first["ttft_s"], first["first_token_s"] - t0, atol=1e-12)
    assert (req["ttft_s"] > 0.004).all()


def test_a_client_needs_a_closed_loop_and_warmups_need_a_client():
    with pytest.raises(ScenarioError, match="workload.client"):
        simulator.load_scenario(toy_scenario(workload={"client": "vllm-bench"}))
    with pytest.raises(ScenarioError, match="workload.warmup_requests"):
        simulator.load_scenario(toy_scenario(workload={
            "arrival": "closed_loop", "concurrency": 2, "num_requests": 4,
            "warmup_requests": 2}))
    with pytest.raises(ScenarioError, match="workload.client"):
        simulator.load_scenario(toy_scenario(workload={
            "arrival": "closed_loop", "concurrency": 2, "num_requests": 4,
            "client": "vllm-bnch"}))


def _client_ttft():
    return benchmark_module("validation/client_ttft.py")


def test_the_fixed_concurrency_figures_of_the_cost_model_doc():
    # docs/cost-model.md, "Benchmark clients and the held-out TTFT": at C = 8 the eight
    # prompts stay one lockstep group (every prefill step holds all eight), and its TTFT
    # is that step; the step's plain roofline bounds any lockstep TTFT from below.
    ct = _client_ttft()
    ttft, groups = ct.simulated("vllm-v1", "vllm-bench", "bf16", 1024, 512, 4, 8)
    assert round(ttft) == 245 and set(groups) == {8}
    assert round(ct.group_roofline_ms("bf16", 1024, 4, 8)) == 131
    ttft, groups = ct.simulated("trtllm", "trtllm-bench", "fp8", 1024, 256, 4, 32)
    assert round(ttft) == 344 and max(groups) < 8  # a step holds at most 7 of the 32
    assert round(ct.group_roofline_ms("fp8", 1024, 4, 32)) == 263


def test_the_lone_prefill_step_the_doc_quotes():
    # One 1,024-token prompt of Qwen3-32B on TP4 H100 in fp8: a 34 ms step, 9.4 ms of it
    # all-reduce, against an 8.2 ms plain roofline (16.4 ms in bf16).
    ct = _client_ttft()
    sc = ct.scenario("trtllm", "trtllm-bench", "fp8", 1024, 256, 4, 1)
    sc["workload"]["client"] = "aiperf"  # no warm-up: the first step is the run's
    res = simulator.run(sc)
    first = res.steps[res.steps["prefill_tokens"] > 0].iloc[0]
    assert round((first["end_s"] - first["start_s"]) * 1e3) == 34
    assert round(first["comm_s"] * 1e3, 1) == 9.4
    assert round(ct.group_roofline_ms("fp8", 1024, 4, 1), 1) == 8.2
    assert round(ct.group_roofline_ms("bf16", 1024, 4, 1), 1) == 16.4
