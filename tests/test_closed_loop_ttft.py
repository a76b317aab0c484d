"""Fixed-length closed loops (issue 17): the clients' lockstep and what breaks it.

C clients with equal lengths that start together prefill in one step, decode together,
finish in the same step and come back together, so every TTFT is the time of one step that
prefills C prompts. A token budget that holds one prompt per step spreads a cycle's
prefills over C steps, and the clients stay spread (docs/cost-model.md, "Steady-state TTFT
in fixed-length closed loops"; benchmarks/closed_loop_ttft.py for the 70B figures).
"""

from __future__ import annotations

import numpy as np
import pytest

import simulator

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
