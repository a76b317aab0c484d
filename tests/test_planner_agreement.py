"""The estimate's rank agreement with the simulation, on small tables ranked by hand: both
sides are ranked as the planner ranks (SLO tier first, then the objective)."""

import math

import pandas as pd
import pytest

from simulator.planner.ranking import agreement_ranks, group_correlations, rank_correlation


def table(rows):
    cols = ["est_slo", "est_objective", "slo_met", "goodput_req_per_s_per_gpu"]
    t = pd.DataFrame(rows, columns=cols)
    t["status"] = "ok"
    t["kind"] = "colocated"
    return t


#: A and B meet on both sides; D may miss by the estimate but meets; C misses on both
#: sides, and its estimated capacity (3.0, the value of a miss) is the highest.
SPACE = table([("meets", 2.0, True, 2.0),      # A
               ("meets", 1.0, True, 1.0),      # B
               ("misses", 3.0, False, 0.5),    # C
               ("may miss", 1.5, True, 1.5)])  # D


def test_places_follow_the_planner_tiers():
    places = agreement_ranks(SPACE, "goodput_per_gpu")
    # estimate: A (0, -2), B (0, -1), D (1, -1.5), C (2, -3)
    assert list(places["est"]) == [0, 1, 3, 2]
    # simulation: A (met, -2), D (met, -1.5), B (met, -1), C (missed, -0.5)
    assert list(places["sim"]) == [0, 2, 3, 1]


def test_rank_correlation_by_hand():
    # ranks est (1, 2, 4, 3), sim (1, 3, 4, 2): sum d^2 = 2, rho = 1 - 6 * 2 / (4 * 15)
    assert rank_correlation(SPACE, "goodput_per_gpu") == pytest.approx(0.8)
    assert group_correlations(SPACE, "goodput_per_gpu") == {
        "colocated": pytest.approx(0.8)}
    # the objective columns alone rank C first on the estimate and last on the
    # simulation: ranks (3, 1, 4, 2) against (4, 2, 1, 3), sum d^2 = 12, rho = -0.2
    raw = SPACE["est_objective"].rank().corr(SPACE["goodput_req_per_s_per_gpu"].rank())
    assert raw == pytest.approx(-0.2)


def test_equal_keys_tie_and_failed_runs_are_left_out():
    t = pd.concat([SPACE, table([("meets", 1.0, True, 1.0)]),
                   table([("meets", 9.0, True, 9.0)]).assign(status="failed")],
                  ignore_index=True)
    places = agreement_ranks(t, "goodput_per_gpu")
    assert list(places.index) == [0, 1, 2, 3, 4]
    assert places.loc[4, "est"] == places.loc[1, "est"]
    assert places.loc[4, "sim"] == places.loc[1, "sim"]
    # average ranks: est (1, 2.5, 5, 4, 2.5), sim (1, 3.5, 5, 2, 3.5)
    est, sim = [1, 2.5, 5, 4, 2.5], [1, 3.5, 5, 2, 3.5]
    want = pd.Series(est).corr(pd.Series(sim))
    assert rank_correlation(t, "goodput_per_gpu") == pytest.approx(want)


def test_latency_objectives_rank_lower_first():
    t = table([("meets", 0.5, True, 1.0), ("meets", 0.7, True, 1.0),
               ("meets", 0.9, True, 1.0)])
    t["ttft_slo_q_s"] = [0.6, 0.8, 1.0]
    assert list(agreement_ranks(t, "min_ttft")["est"]) == [0, 1, 2]
    assert rank_correlation(t, "min_ttft") == pytest.approx(1.0)


def test_a_ranking_that_ties_every_point_has_no_correlation():
    t = table([("meets", 1.0, True, 1.0)] * 3)
    assert math.isnan(rank_correlation(t, "goodput_per_gpu"))
