"""[router] refresh_s: the router decides on the load it last scraped."""

from __future__ import annotations

import numpy as np
import pytest

from simulator import load_scenario, run
from simulator.errors import ScenarioError


def _scenario(refresh_s: float | None) -> dict:
    router = {"policy": "least_outstanding"} | ({"refresh_s": refresh_s} if refresh_s else {})
    return {"name": "stale", "seed": 0, "model": {"name": "llama-3.1-8b"},
            "cluster": {"topology": "dgx-h100"}, "parallel": {"tp": 1, "dp": 2},
            "router": router,
            "workload": {"arrival": "constant", "rate_per_s": 2.0, "num_requests": 60,
                         "prompt_tokens": 512, "output_tokens": 1500},
            "output": {"steps": False}}


def test_a_stale_router_keeps_sending_to_the_replica_it_last_saw_empty():
    """Scrapes at 0, 10, 20 s. At 0 both replicas hold nothing: every request of [0, 10)
    goes to replica 0 (ties go to the first); at 10 s replica 0 holds them all, so [10, 20)
    goes to replica 1; at 20 s replica 1 holds more than 0 (whose first requests of 1,500
    tokens have finished), so [20, 30) goes back to 0, and the last request, at 30 s, to 1."""
    req = run(load_scenario(_scenario(10.0))).requests.sort_values("arrival_s")
    # A request arriving at a scrape's instant sees it (the scrape was scheduled first).
    window = np.floor(req["arrival_s"].to_numpy() / 10.0).astype(int)
    by_window = req.groupby(window)["replica"].unique()
    assert [list(v) for v in by_window] == [[0], [1], [0], [1]]


def test_live_routing_spreads_and_staleness_costs_latency():
    live = run(load_scenario(_scenario(None)))
    stale = run(load_scenario(_scenario(10.0)))
    share = live.requests["replica"].value_counts()
    assert abs(share[0] - share[1]) <= 2  # live: alternates
    assert stale.summary["tpot_mean_s"] > live.summary["tpot_mean_s"]  # bigger batches
    assert stale.summary["e2e_mean_s"] > live.summary["e2e_mean_s"]


def test_refresh_with_pools_is_refused():
    s = _scenario(5.0)
    s["pools"] = [{"name": "p", "role": "prefill", "nodes": 1, "tp": 1, "dp": 1},
                  {"name": "d", "role": "decode", "nodes": 1, "tp": 1, "dp": 1}]
    s["cluster"]["nodes"] = 2
    with pytest.raises(ScenarioError, match="router.refresh_s: scraped router views"):
        load_scenario(s)
