"""Invariants: conservation, KV capacity, time order, determinism, closed loop, traces."""

from __future__ import annotations

import numpy as np
import pandas as pd
from conftest import with_kv_tokens
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import simulator
from simulator.workload.trace import load_trace

SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def _check_invariants(res: simulator.Result, n: int) -> None:
    req, steps = res.requests, res.steps
    # Every arrival is accounted for exactly once, with a status.
    assert len(req) == n
    assert sorted(req["request_id"]) == list(range(n))
    assert set(req["status"]) <= {"completed", "rejected"}
    done = req[req["status"] == "completed"]
    # Time never goes back within a request.
    assert (done["first_scheduled_s"] >= done["arrival_s"]).all()
    assert (done["first_token_s"] > done["first_scheduled_s"]).all()
    assert (done["finish_s"] >= done["first_token_s"]).all()
    # Steps of one stage never run backwards, and one stage runs one step at a time: sorted
    # by start, each step begins no earlier than the previous one ended.
    for _, g in steps.groupby(["replica", "stage"]):
        assert (g["end_s"] >= g["start_s"]).all()
        g = g.sort_values(["start_s", "end_s"])
        assert (g["start_s"].to_numpy()[1:] >= g["end_s"].to_numpy()[:-1] - 1e-9).all()
    # KV blocks never exceed a stream's capacity, never go negative.
    cap = res.summary["kv_blocks_per_replica"] // res.plan.streams_per_replica
    assert steps["kv_blocks"].between(0, cap).all()
    # Each request's tokens after the first come from decode steps, except that a recompute
    # preemption after the first token lets the re-prefill sample one of them.
    first = steps[steps["stage"] == 0]
    produced = first["decode_tokens"].sum()
    expected = (done["output_tokens"] - 1).sum()
    assert expected - done["preemptions"].sum() <= produced <= expected


@SETTINGS
@given(rate=st.floats(0.5, 50), n=st.integers(1, 60), prompt=st.integers(1, 3000),
       out_mean=st.integers(1, 300), seqs=st.integers(1, 32),
       budget=st.sampled_from([64, 256, 2048]), seed=st.integers(0, 2**16),
       kv_tokens=st.integers(3200, 12000))
def test_conservation_and_kv_capacity_under_pressure(toy, rate, n, prompt, out_mean, seqs,
                                                     budget, seed, kv_tokens):
    """A tight KV cache (a few thousand tokens) forces preemptions; nothing is lost."""
    sc = toy(seed=seed,
             workload={"arrival": "poisson", "rate_per_s": rate, "num_requests": n,
                       "prompt_tokens": {"dist": "uniform", "min": 1, "max": prompt},
                       "output_tokens": {"dist": "exponential", "mean": out_mean,
                                         "max": 600}},
             engine={"max_num_seqs": seqs, "max_num_batched_tokens": max(budget, seqs),
                     "max_model_len": 3200})
    with_kv_tokens(sc, kv_tokens)
    try:
        res = simulator.run(sc)
    except simulator.ScenarioError as exc:  # max_model_len beyond this cache: a clean refusal
        assert "engine.max_model_len" in str(exc)
        return
    _check_invariants(res, n)


def test_preemption_happens_when_kv_is_short_and_everything_completes(toy):
    sc = toy(workload={"arrival": "poisson", "rate_per_s": 200.0, "num_requests": 60,
                       "prompt_tokens": 500, "output_tokens": 400},
             engine={"max_num_seqs": 64,
                     "max_num_batched_tokens": 4096, "max_model_len": 1000})
    res = simulator.run(with_kv_tokens(sc, 6000))
    assert res.summary["preemptions_total"] > 0
    assert res.summary["requests_completed"] == 60
    _check_invariants(res, 60)


def test_same_seed_identical_requests_and_different_seed_differs():
    base = {**simulator.DEFAULT_SCENARIO,
            "workload": {**simulator.DEFAULT_SCENARIO["workload"], "num_requests": 150}}
    a = simulator.run(base).requests
    b = simulator.run(base).requests
    pd.testing.assert_frame_equal(a, b)
    assert a.to_csv(index=False) == b.to_csv(index=False)
    c = simulator.run({**base, "seed": 2}).requests
    assert not np.allclose(a["arrival_s"], c["arrival_s"])


def test_trace_replay_keeps_arrivals_and_lengths(toy):
    trace = "workloads/azure_llm_2023_code.csv"
    sc = toy(model={"name": "llama-3.1-8b"}, cluster={"topology": "dgx-h100"},
             workload={"arrival": "trace", "trace": trace, "num_requests": 300,
                       "rate_per_s": None, "time_scale": 2.0})
    res = simulator.run(sc)
    src = load_trace(simulator.paths.ROOT / trace).iloc[:300]
    req = res.requests
    assert len(req) == 300
    np.testing.assert_allclose(req["arrival_s"], src["arrival_s"] * 2.0)
    assert (req["prompt_tokens"].to_numpy() == src["prompt_tokens"].to_numpy()).all()
    assert (req["output_tokens"].to_numpy() == src["output_tokens"].to_numpy()).all()
    _check_invariants(res, 300)


def test_trace_window_start_and_duration(toy):
    sc = toy(model={"name": "llama-3.1-8b"}, cluster={"topology": "dgx-h100"},
             workload={"arrival": "trace", "trace": "workloads/azure_llm_2023_conv.csv",
                       "start_s": 600.0, "duration_s": 60.0, "rate_per_s": None,
                       "num_requests": None})
    res = simulator.run(sc)
    src = load_trace(simulator.paths.ROOT / "workloads/azure_llm_2023_conv.csv")
    t = src["arrival_s"]
    assert len(res.requests) == int(((t >= 600) & (t < 660)).sum())
    assert res.requests["arrival_s"].between(0, 60).all()


def test_closed_loop_holds_exactly_n_in_flight(toy):
    n = 7
    sc = toy(workload={"arrival": "closed_loop", "concurrency": n, "num_requests": 200,
                       "rate_per_s": None,
                       "prompt_tokens": {"dist": "uniform", "min": 10, "max": 400},
                       "output_tokens": {"dist": "uniform", "min": 1, "max": 50}})
    req = simulator.run(sc).requests
    assert len(req) == 200
    # At every arrival (before the last n requests are issued), exactly n are in flight:
    # the new one plus n-1 others that arrived earlier and have not finished.
    arr, fin = req["arrival_s"].to_numpy(), req["finish_s"].to_numpy()
    for i in range(len(req) - n):
        t = arr[i]
        in_flight = ((arr <= t) & (fin > t)).sum()
        assert in_flight == n, (i, t, in_flight)
    # The first n start at time 0, and each later arrival coincides with a completion.
    assert (arr[:n] == 0).all()
    assert np.isin(arr[n:], fin).all()


def test_summary_has_exactly_the_documented_keys(toy):
    from simulator.metrics.summary import SUMMARY_KEYS

    res = simulator.run(toy())
    assert list(res.summary) == SUMMARY_KEYS
    doc = (simulator.paths.ROOT / "docs" / "metrics.md").read_text()
    for key in SUMMARY_KEYS:
        stem = key.split("_p")[0].split("_mean")[0]
        assert stem in doc, key
