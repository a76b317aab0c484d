"""The planner's typed candidates and its one search loop (simulator.planner.search): each
kind read from a table row, the rounds' caps per group and per layout, the rule of thumb in
the first round, the stop once a candidate meets the SLOs, by hand."""

from __future__ import annotations

import importlib

import pandas as pd
from test_planner_search import CONST, search_setup

from simulator.io.schema import SloKeys
from simulator.planner.disagg import pools_of
from simulator.planner.nearmiss import group_of, groups_of
from simulator.planner.search import (
    Colocated,
    Disaggregated,
    Rounds,
    candidate,
    candidates_of,
    enumerate_candidates,
    group_series,
    simulate_best,
)
from simulator.planner.space import Layout, Limits

search = importlib.import_module("simulator.planner.search")
SLO = SloKeys(ttft_s=1.0, tpot_s=0.05)


def test_candidates_of_a_plan_read_as_their_kind():
    """Every row of a colocated + disaggregated candidates table is the kind its ``kind``
    says, in its simulation group; a disaggregated one gives the pools of its row."""
    base, s, st = search_setup(CONST)
    c = enumerate_candidates(base, s, 2, st, "goodput_per_gpu", 1, disagg=True)
    typed = candidates_of(c)
    assert [t.group for t in typed.values()] == [group_of(r) for _, r in c.iterrows()]
    assert group_series(typed).equals(groups_of(c))  # what rerank takes instead
    kinds = {type(t).__name__ for t in typed.values()}
    assert kinds == {"Colocated", "Disaggregated"}
    disagg = [i for i, t in typed.items() if isinstance(t, Disaggregated)]
    assert len(disagg) == (c["kind"] == "disaggregated").sum() > 0
    for i in disagg:
        assert pools_of(typed[i].row(), 1, s) == pools_of(c.loc[i], 1, s)


def test_candidate_by_hand():
    row = {"tp": 2, "pp": 1, "dp": 3, "max_num_seqs": 64, "max_num_batched_tokens": 2048,
           "chunk_size": pd.NA, "kind": "colocated", "spec_k": 3.0}
    c = candidate(row)
    assert c == Colocated(Layout(2, 1, 3), Limits(64, 2048, None), 3)
    assert c.group == "colocated+spec" == group_of(pd.Series(row))
    pre = {"prefill_tp": 4, "prefill_pp": 1, "prefill_dp": 1,
           "prefill_max_num_seqs": float("nan"), "prefill_max_num_batched_tokens": 8192}
    d = candidate({**row, **pre, "kind": "disaggregated", "spec_k": 0,
                   "decode_node": "dgx-a100"})
    assert d == Disaggregated(Layout(2, 1, 3), Limits(64, 2048, None), Layout(4, 1, 1),
                              None, 0, "dgx-a100")
    assert d.group == "disaggregated+cross"
    assert c.key() != d.key()


def _table(n: int) -> pd.DataFrame:
    """``n`` feasible TP1 candidates: dp 1, 1, 2, 2, ... in ranking order (two with each
    layout, at two max_num_seqs)."""
    return pd.DataFrame([{"tp": 1, "pp": 1, "dp": 1 + i // 2, "max_num_seqs": 32 << (i % 2),
                          "max_num_batched_tokens": 2048, "chunk_size": None,
                          "kind": "colocated", "spec_k": 0, "status": "feasible",
                          "est_ttft_p99_s": 0.1, "est_tpot_s": 0.01, "gpus": 1 + i // 2}
                         for i in range(n)])


def _run(monkeypatch, cands, how, meeting=()):
    """simulate_best on ``cands`` ranked as they are, the simulations of the candidates
    ``meeting`` meeting the SLOs; what it found and the batches it simulated."""
    batches = []

    def fake(todo, *args):
        batches.append(list(todo))
        for i in todo:
            ok = i in meeting
            yield i, {"status": "ok", "ttft_q_s": 0.5 if ok else 9.0, "tpot_q_s": 0.01,
                      "keep_up_ratio": 1.0, "keep_up_least": 0.9}

    monkeypatch.setattr(search, "simulate_many", fake)
    found = simulate_best(cands, candidates_of(cands), lambda m: cands, lambda i: {"i": i},
                          "goodput_per_gpu", SLO, how, 0.99, 1)
    return found, batches


def test_rounds_keep_their_caps(monkeypatch):
    """Caps: 2 a round (one group), 1 per layout (dp): round 1 takes candidates 0 and 2
    (1 and 3 share their layouts), round 2 the next layouts, 4 and 6; none meets, so the
    rounds run out. The rule of thumb (5) joins round 1."""
    cands = _table(8)
    found, batches = _run(monkeypatch, cands, Rounds(2, 1, rounds=2, first=5))
    assert batches == [[0, 2, 5], [4, 6]]
    assert found.picked == [0, 2, 5, 4, 6] and not found.interrupted


def test_rounds_stop_once_one_but_the_rule_meets(monkeypatch):
    """Candidate 2 meets in round 1: without chase rounds the search stops there. The rule
    of thumb meeting does not stop it: with the rule 0 meeting alone, 1 a round and 2 per
    layout, the three rounds take 0, then 1 (0's layout), then 2."""
    cands = _table(8)
    found, batches = _run(monkeypatch, cands, Rounds(2, 1, rounds=3), meeting={2})
    assert batches == [[0, 2]] and found.picked == [0, 2]
    found, batches = _run(monkeypatch, cands, Rounds(1, 2, rounds=3, first=0), meeting={0})
    assert batches == [[0], [1], [2]]
