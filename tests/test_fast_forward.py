"""The decode fast path gives exactly the results of stepping one by one."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import toy_scenario, with_kv_tokens
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import simulator


def _both(sc: dict) -> tuple[simulator.Result, simulator.Result]:
    fast = simulator.run({**sc, "engine": {**sc.get("engine", {}), "fast_forward": True}})
    slow = simulator.run({**sc, "engine": {**sc.get("engine", {}), "fast_forward": False}})
    return fast, slow


def _assert_identical(fast: simulator.Result, slow: simulator.Result) -> None:
    # Bit-identical tables: the CSV text the user gets is the same.
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)
    assert fast.requests.to_csv(index=False) == slow.requests.to_csv(index=False)
    # Summaries too (busy-time sums may differ in the last bits: runs add them in bulk).
    for key, value in slow.summary.items():
        if key not in ("wall_time_s", "simpy_events"):
            assert fast.summary[key] == pytest.approx(value, rel=1e-9, nan_ok=True), key


SCENARIOS = {
    "poisson-dp2": toy_scenario(
        parallel={"dp": 2}, router={"policy": "least_outstanding"},
        workload={"arrival": "poisson", "rate_per_s": 30.0, "num_requests": 300,
                  "prompt_tokens": {"dist": "lognormal", "mean": 300, "sigma": 1.0},
                  "output_tokens": {"dist": "lognormal", "mean": 120, "sigma": 1.0}}),
    "closed-loop": toy_scenario(
        workload={"arrival": "closed_loop", "concurrency": 12, "num_requests": 300,
                  "rate_per_s": None, "prompt_tokens": {"dist": "uniform", "min": 1, "max": 900},
                  "output_tokens": {"dist": "uniform", "min": 1, "max": 300}}),
    "seq-cap": toy_scenario(
        engine={"max_num_seqs": 4, "max_num_batched_tokens": 512},
        workload={"arrival": "poisson", "rate_per_s": 50.0, "num_requests": 200,
                  "prompt_tokens": 64, "output_tokens": {"dist": "exponential", "mean": 60}}),
    "pipeline-1-stream": toy_scenario(
        parallel={"pp": 2}, engine={"max_inflight_microbatches": 1},
        workload={"arrival": "gamma", "rate_per_s": 20.0, "cv": 3.0, "num_requests": 200,
                  "prompt_tokens": 200, "output_tokens": {"dist": "uniform", "min": 1,
                                                          "max": 200}}),
}


@pytest.mark.parametrize("name", SCENARIOS)
def test_fast_path_equals_step_by_step(name):
    fast, slow = _both(SCENARIOS[name])
    _assert_identical(fast, slow)


@pytest.mark.parametrize("name", ["poisson-dp2", "seq-cap"])
def test_fast_path_without_step_records_equals_step_by_step(name):
    # Without per-step records the decode runs take their own, leaner code path.
    sc = {**SCENARIOS[name], "output": {"steps": False}}
    fast, slow = _both(sc)
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    assert fast.summary["steps_total"] == slow.summary["steps_total"]


def test_fast_path_equals_step_by_step_under_kv_pressure():
    sc = toy_scenario(
        engine={"max_num_seqs": 64, "max_num_batched_tokens": 1024, "max_model_len": 1200},
        workload={"arrival": "poisson", "rate_per_s": 100.0, "num_requests": 150,
                  "prompt_tokens": {"dist": "uniform", "min": 100, "max": 600},
                  "output_tokens": {"dist": "uniform", "min": 50, "max": 500}})
    fast, slow = _both(with_kv_tokens(sc, 5000))
    assert slow.summary["preemptions_total"] > 0
    _assert_identical(fast, slow)


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 10_000), rate=st.floats(1, 80), seqs=st.integers(1, 40),
       out=st.integers(2, 400), block=st.sampled_from([1, 8, 16, 32]))
def test_fast_path_identity_property(seed, rate, seqs, out, block):
    sc = toy_scenario(
        seed=seed,
        engine={"max_num_seqs": seqs, "max_num_batched_tokens": max(seqs, 256),
                "block_size": block},
        workload={"arrival": "poisson", "rate_per_s": rate, "num_requests": 80,
                  "prompt_tokens": {"dist": "uniform", "min": 1, "max": 700},
                  "output_tokens": {"dist": "exponential", "mean": out, "max": 2000}})
    _assert_identical(*_both(sc))


def test_fast_path_takes_fewer_events():
    """The point of the fast path: far fewer SimPy events for decode-heavy loads."""
    sc = toy_scenario(workload={"arrival": "poisson", "rate_per_s": 2.0, "num_requests": 40,
                                "prompt_tokens": 100, "output_tokens": 400})
    fast, slow = _both(sc)
    _assert_identical(fast, slow)
    assert fast.summary["simpy_events"] * 5 < slow.summary["simpy_events"]


def test_a_lone_replica_runs_ahead_of_the_clock():
    # One replica, open loop, no faults: steps before the next arrival and the arrivals
    # themselves cost no event; the tables stay those of stepping one by one.
    fast, slow = _both(SCENARIOS["seq-cap"])
    _assert_identical(fast, slow)
    # Here about one event per request (200 requests: 201 events, against 4,002 stepping).
    assert fast.summary["simpy_events"] <= 1.1 * len(fast.requests)
    assert slow.summary["simpy_events"] > 10 * fast.summary["simpy_events"]
