"""Fixed-length closed loops: the clients' lockstep and what breaks it.

C clients with equal lengths that start together prefill in one step, decode together,
finish in the same step and come back together, so every TTFT is the time of one step that
prefills C prompts. A token budget that holds one prompt per step spreads a cycle's
prefills over C steps, and the clients stay spread (docs/cost-model.md, "Steady-state TTFT
in fixed-length closed loops"; benchmarks/docs/closed_loop_ttft.py for the 70B figures).
"""

from __future__ import annotations

import numpy as np
import pytest

import simulator
from simulator.cluster.simulation import run_rngs
from simulator.engine.clock import SCALE
from simulator.errors import ScenarioError
from simulator.workload.arrivals import release_times

C, PROMPT, OUTPUT, CYCLES = 4, 500, 20, 4


def _loop(**engine) -> simulator.Result:
    return simulator.run({
        "name": "loop", "seed": 0, "model": {"name": "llama-3.1-8b"},
        "cluster": {"topology": "dgx-h100"}, "parallel": {"tp": 1}, "engine": engine,
        "workload": {"arrival": "closed_loop", "concurrency": C, "num_requests": C * CYCLES,
                     "prompt_tokens": PROMPT, "output_tokens": OUTPUT}})


def test_equal_clients_stay_in_lockstep_and_each_ttft_is_one_group_prefill_step():
    res = _loop()  # vllm-v1: an 8192-token budget holds all four prompts
    req, steps = res.requests.sort_values("request_id"), res.steps
    prefill = steps[steps["prefill_tokens"] > 0].reset_index(drop=True)
    # One prefill step per cycle, each holding the whole group and nothing else.
    assert len(prefill) == CYCLES
    assert (prefill["prefill_tokens"] == C * PROMPT).all()
    assert (prefill["decode_tokens"] == 0).all()
    # The group sends together when its previous requests finish together, the idle
    # replica schedules it at once, and every first token comes at that step's end.
    arrivals = np.sort(req["arrival_s"].unique())
    assert len(arrivals) == CYCLES
    np.testing.assert_array_equal(arrivals, prefill["start_s"].to_numpy())
    cycle = np.searchsorted(arrivals, req["arrival_s"].to_numpy())
    ends = prefill["end_s"].to_numpy()[cycle]
    np.testing.assert_allclose(req["first_token_s"], ends, rtol=0, atol=1e-12)
    np.testing.assert_allclose(req["ttft_s"], (prefill["end_s"] - prefill["start_s"]).iloc[0],
                               rtol=1e-9)


def test_a_budget_of_one_prompt_per_step_spreads_the_clients_for_good():
    # Budget P + C - 1: after the decodes (at most C - 1 tokens) a step completes at most
    # one prompt (two would need 2P - (C - 1) <= P + C - 1 tokens), so a cycle's first
    # tokens come in C different steps; the clients then finish, and send again, apart.
    spread = _loop(max_num_batched_tokens=PROMPT + C - 1, max_num_seqs=C)
    lock = _loop()
    req = spread.requests.sort_values("arrival_s")
    assert req["first_token_s"].nunique() == C * CYCLES
    assert req["arrival_s"].iloc[C:].nunique() == C * (CYCLES - 1)  # apart in every cycle
    prefill = spread.steps[spread.steps["prefill_tokens"] > 0]
    assert (prefill["prefill_tokens"] <= PROMPT + C - 1).all()
    # Apart, a request waits for the step in flight and the one already scheduled (async
    # scheduling), then prefills in a step of its own: at most three steps.
    later = req.iloc[C:]
    longest = (spread.steps["end_s"] - spread.steps["start_s"]).max()
    assert (later["ttft_s"] <= 3 * longest + 1e-12).all()
    assert later["ttft_s"].mean() < lock.requests["ttft_s"].mean()
    assert lock.requests["ttft_s"].iloc[0] == pytest.approx(
        lock.steps["end_s"].iloc[0] - lock.steps["start_s"].iloc[0])


# -- a closed loop with a request rate: vllm bench serve --request-rate R --max-concurrency C
def _rated(concurrency: int, rate: float, n: int, output: int, **workload) -> dict:
    return {"name": "rated", "seed": 3, "model": {"name": "llama-3.1-8b"},
            "cluster": {"topology": "dgx-h100"}, "parallel": {"tp": 1},
            "workload": {"arrival": "closed_loop", "concurrency": concurrency,
                         "num_requests": n, "rate_per_s": rate, "prompt_tokens": 300,
                         "output_tokens": output, **workload}}


def test_release_times_are_vllm_bench_gamma_gaps_rescaled_to_n_over_rate():
    sc = simulator.load_scenario(_rated(2, 4.0, 50, 10, cv=0.5))
    t = release_times(sc.workload, np.random.default_rng(0))
    assert len(t) == 50 and (np.diff(t) > 0).all()
    assert t[-1] == pytest.approx(50 / 4.0, rel=1e-12)  # serve.py: target_total_delay_s
    gaps = np.diff(t)
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(0.5, abs=0.15)


def test_each_request_goes_at_its_release_or_when_a_client_frees_whichever_is_later():
    # Request i takes the i-th free client slot (C at t = 0, then one per finish, in time
    # order) and is sent at the later of that and its release time; TTFT counts from the
    # send, as vllm bench serve's (st is taken after the semaphore).
    c, n = 3, 12
    s = _rated(c, 4.0, n, 120)
    res = simulator.run(s)
    req = res.requests.sort_values("request_id")
    sc = simulator.load_scenario(s)
    rel = np.rint(release_times(sc.workload, run_rngs(sc.seed)["arrivals"]) * SCALE) / SCALE
    free = np.sort(np.concatenate([np.zeros(c), req["finish_s"].to_numpy()]))[:n]
    sent = req["arrival_s"].to_numpy()
    np.testing.assert_array_equal(sent, np.maximum(rel, free))
    assert (sent == rel).any() and (sent > rel).any()  # both cases occur in this run
    assert (req["ttft_s"] == req["first_token_s"] - req["arrival_s"]).all()


def test_without_a_rate_the_closed_loop_is_unchanged_and_a_rate_needs_a_count():
    plain = _loop()
    assert (plain.requests.sort_values("arrival_s")["arrival_s"].iloc[:C] == 0.0).all()
    s = _rated(2, 4.0, 10, 10)
    del s["workload"]["num_requests"]
    s["workload"]["duration_s"] = 5.0
    with pytest.raises(ScenarioError, match=r"workload.num_requests: required for arrival = "
                       r"\"closed_loop\" with rate_per_s"):
        simulator.load_scenario(s)


def test_releases_after_duration_are_not_sent():
    s = _rated(2, 10.0, 40, 5, duration_s=1.0)  # releases span 4 s; the run stops at 1 s
    req = simulator.run(s).requests
    sc = simulator.load_scenario(s)
    rel = release_times(sc.workload, run_rngs(sc.seed)["arrivals"])
    assert len(req) == int((rel < 1.0).sum()) and (req["arrival_s"] < 1.0).all()


def test_a_client_resends_only_once_it_has_seen_the_last_token():
    # token_delay_s (output processing, detokenization, streaming) moves the first token and
    # the end the client sees; the client's next request leaves from that end, so one
    # client never has two requests in flight.
    def run(delay: float) -> simulator.Result:
        return simulator.run({
            "name": "d", "seed": 0, "model": {"name": "llama-3.1-8b"},
            "cluster": {"topology": "dgx-h100"}, "parallel": {"tp": 1},
            "engine": {"token_delay_s": delay},
            "workload": {"arrival": "closed_loop", "concurrency": 1, "num_requests": 3,
                         "prompt_tokens": 100, "output_tokens": 5}}).requests

    plain, late = run(0.0), run(0.05)
    np.testing.assert_array_equal(late["arrival_s"].iloc[1:], late["finish_s"].iloc[:-1])
    np.testing.assert_allclose(late["ttft_s"], plain["ttft_s"] + 0.05, rtol=0, atol=1e-9)
    # Each cycle is the engine's time plus the delay once.
    np.testing.assert_allclose(np.diff(late["arrival_s"]),
                               np.diff(plain["arrival_s"]) + 0.05, rtol=0, atol=1e-9)
