"""Autoscaling of prefill and decode pools (docs/autoscaling.md, "Scaling prefill and decode
pools"): a step load on a 1P1D scenario grows the decode pool by the expected count after
the policy's interval plus the cold start, draining replicas take nothing new and hold
nothing when parked, every request is accounted for once, KV stays within capacity, and
the per-pool replicas and GPU-hours reach the summary, the time series and compare --day."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from simulator import load_scenario, run, sweep, write_result
from simulator.cli import main
from simulator.cluster import running
from simulator.cluster.autoscale import SOURCE_BPS, Autoscaler
from simulator.cluster.pools import build_plan
from simulator.errors import ScenarioError
from simulator.io.scenario import read_toml
from simulator.plotting import run_figures
from simulator.printout import format_summary
from simulator.sweep import parse_grid

ROOT = Path(__file__).resolve().parent.parent

SCALE = {"policy": "load", "min_replicas": 1, "max_replicas": 4, "interval_s": 20.0,
         "target": 8.0, "cooldown_down_s": 40.0, "provision_s": 10.0,
         "graph_capture_s": 5.0}


def _scenario(decode: dict | None = SCALE, prefill: dict | None = None,
              rates=(2.0, 40.0, 2.0), at=(0, 100, 200), duration=300.0,
              prompt: int = 256) -> dict:
    """Llama-3.1-8B on one DGX H100 per pool: 2 prefill replicas and 4 decode replicas of
    TP1, ``prompt`` + 256 tokens at a constant rate stepping from 2 to 40 req/s at 100 s and back
    at 200 s."""
    pools = [{"name": "p", "role": "prefill", "nodes": 1, "tp": 1, "dp": 2},
             {"name": "d", "role": "decode", "nodes": 1, "tp": 1, "dp": 4}]
    for pool, table in zip(pools, (prefill, decode), strict=True):
        if table is not None:
            pool["autoscale"] = copy.deepcopy(table)
    return {"name": "pd", "seed": 1, "model": {"name": "llama-3.1-8b"},
            "cluster": {"topology": "dgx-h100"}, "router": {"policy": "least_outstanding"},
            "pools": pools,
            "workload": {"arrival": "constant", "duration_s": duration,
                         "prompt_tokens": prompt, "output_tokens": 256,
                         "rate_profile": {"shape": "steps", "at_s": list(at),
                                          "rates_per_s": list(rates)}},
            "output": {"steps": False}}


def _spied(sc: dict, monkeypatch):
    """The run, its PoolScaling, and the KV check made at every scaling decision: every
    stream of every replica holds between 0 and its capacity of blocks."""
    captured, checks = {}, []
    real = running.PoolScaling

    class Spy(real):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            captured["scaling"] = self

    real_step = Autoscaler.step

    def step(self):
        for rep in self.cluster.replicas:
            for st in rep.streams:
                checks.append(0 <= st.kv.used <= st.kv.capacity)
        assert all(v >= 0 for v in self.cluster.handoff.holding.values())
        real_step(self)

    monkeypatch.setattr(running, "PoolScaling", Spy)
    monkeypatch.setattr(Autoscaler, "step", step)
    r = run(load_scenario(sc))
    return r, captured["scaling"], checks


def _spans(log, to_state: str) -> dict[int, list[tuple[float, float]]]:
    """Per pool replica, ``[t0, t1)`` from each change to ``to_state`` to the next change."""
    out: dict[int, list] = {}
    last: dict[int, tuple[float, str]] = {}
    for t, i, st in log.changes:
        if i in last and last[i][1] == to_state:
            out.setdefault(i, []).append((last[i][0], t))
        last[i] = (t, st)
    return out


def test_a_step_grows_the_decode_pool_after_the_interval_plus_the_cold_start(monkeypatch):
    sc = _scenario()
    r, scaling, checks = _spied(sc, monkeypatch)
    s, req = r.summary, r.requests
    plan = build_plan(load_scenario(sc))
    dec = next(p for p in plan.pools if p.role == "decode")
    # The cold start by hand: 10 s provisioning, one TP1 GPU's weights (all of Llama-3.1-8B)
    # over the node's 25 GB/s of NVMe, 5 s of graph capture.
    w = dec.memory.weights_per_gpu[0]
    cold = 10.0 + w / SOURCE_BPS["nvme"] + 5.0
    log = scaling.scalers["d"].log
    # The first decision after the step at 100 s is at 120 s: the decode backlog is far over
    # 8 per replica, so the pool grows by 3 to its max of 4, each serving a cold start later.
    starts = [(t, i) for t, i, st in log.changes if st == "starting"]
    assert starts[:3] == [(120.0, 1), (120.0, 2), (120.0, 3)]
    assert log.cold_starts_s[:3] == pytest.approx([cold] * 3)
    serving = [(t, i) for t, i, st in log.changes if st == "serving" and t > 0]
    assert [i for _, i in serving[:3]] == [1, 2, 3]
    assert [t for t, _ in serving[:3]] == pytest.approx([120.0 + cold] * 3)
    # Before then, decode replica 0 (cluster-wide 2) alone decodes; the new ones take their
    # first request once warm, not before.
    first = dec.first_replica
    for k in (1, 2, 3):
        taken = req.loc[req["decode_replica"] == first + k, "kv_transfer_start_s"]
        assert taken.min() >= 120.0 + cold
    assert (req.loc[req["kv_transfer_start_s"] < 120.0 + cold, "decode_replica"]
            == first).all()
    # The prefill pool has no table: its 2 replicas serve throughout.
    assert "p" not in scaling.scalers
    assert s["autoscale_pool_replicas_min"]["p"] == s["autoscale_pool_replicas_max"]["p"] == 2
    assert s["autoscale_pool_scale_ups"] == {"p": 0, "d": 3}
    assert s["autoscale_pool_replicas_max"]["d"] == 4
    assert s["autoscale_pool_replicas_min"]["d"] == 1
    # Every request accounted for once; KV within capacity at every decision.
    assert len(req) == req["request_id"].nunique() == s["requests_total"]
    assert (req["status"] == "completed").all()
    assert checks and all(checks)


def test_pool_gpu_hours_are_the_replica_time_paid(monkeypatch):
    r, scaling, _ = _spied(_scenario(), monkeypatch)
    s, ts = r.summary, r.timeseries
    end = s["simulated_time_s"]
    # The static prefill pool pays its 2 GPUs for the whole run; the decode pool one GPU per
    # replica from its scale-up decision until it is parked (or the end).
    assert s["autoscale_pool_gpu_hours"]["p"] == pytest.approx(2 * end / 3600.0)
    paid, since = 0.0, {}
    for t, i, st in scaling.scalers["d"].log.changes:
        if st == "parked":
            paid += t - since.pop(i)
        elif i not in since:
            since[i] = t
    paid += sum(end - t for t in since.values())
    assert s["autoscale_pool_gpu_hours"]["d"] == pytest.approx(paid / 3600.0)
    assert s["autoscale_gpu_hours"] == pytest.approx(sum(s["autoscale_pool_gpu_hours"]
                                                         .values()))
    # The time series: one column per pool, summing to replicas.
    assert (ts["replicas"] == ts["replicas_pool_p"] + ts["replicas_pool_d"]).all()
    before = ts[ts["window_end_s"] < 120.0]
    assert (before["replicas_pool_d"] == 1).all() and (before["replicas_pool_p"] == 2).all()
    assert ts["replicas_pool_d"].max() == 4


def test_draining_replicas_take_nothing_new_and_hold_nothing_when_parked(monkeypatch):
    # Both pools scale on the load policy, the prefill pool on its prompts per replica
    # (4096-token prompts keep it busy at 40 req/s), the step lasting 60 s this time.
    prefill = SCALE | {"target": 2.0, "max_replicas": 2}
    r, scaling, checks = _spied(_scenario(prefill=prefill, prompt=4096, at=(0, 100, 160),
                                          duration=500.0), monkeypatch)
    req = r.requests
    assert (req["status"] == "completed").all() and req["request_id"].is_unique
    assert checks and all(checks)
    moved_end = req["kv_transfer_start_s"] + req["kv_transfer_s"]
    for name, column, taken, held_until in (
            ("p", "prefill_replica", req["arrival_s"], moved_end),
            ("d", "decode_replica", req["kv_transfer_start_s"], req["finish_s"])):
        sc = scaling.scalers[name]
        drains = _spans(sc.log, "draining")
        assert sum(len(v) for v in drains.values()) >= 1, name
        for k, spans in drains.items():
            mine = req[column] == sc.first + k
            for t0, t1 in spans:
                # Nothing new while draining; what it took before is done (a prefill
                # replica's KV handed over) when it is parked.
                assert not (mine & (taken >= t0) & (taken < t1)).any()
                late = mine & (taken < t0) & (held_until > t1 + 1e-9)
                assert not late.any(), (name, k, t0, t1)
        assert not any(sc.state[i] == "draining" and sc.reps[i].outstanding == 0
                       for i in range(len(sc.state)))
    # Decode replicas drained while they still decoded: parked when their last request
    # finished, later than the decision.
    drains = _spans(scaling.scalers["d"].log, "draining")
    assert any(t1 > t0 for spans in drains.values() for t0, t1 in spans)


def test_compare_day_shows_gpu_hours_per_pool(tmp_path, monkeypatch, capsys):
    r, _, _ = _spied(_scenario(), monkeypatch)
    auto = tmp_path / "auto"
    write_result(r, auto)
    static = tmp_path / "static"
    write_result(run(load_scenario(_scenario(decode=None))), static)
    assert main(["compare", "--day", str(static), str(auto),
                 "--out", str(tmp_path / "cmp")]) == 0
    out = capsys.readouterr().out
    hours = r.summary["autoscale_pool_gpu_hours"]
    assert "GPU-hours paid, pool d" in out and "GPU-hours paid, pool p" in out
    line = next(x for x in out.splitlines() if "GPU-hours paid, pool d" in x)
    assert f"{hours['d']:.3g}" in line.replace(",", "") or f"{hours['d']:.2f}" in line
    assert np.isfinite(hours["d"])
    # autoscaling.png: the total and each pool's replicas on the right axis, as stored.
    fig = run_figures(auto)["autoscaling"]
    lines = {ln.get_label(): ln for ax in fig.axes for ln in ax.get_lines()}
    ts = r.timeseries
    for name in ("p", "d"):
        assert list(lines[f"replicas, pool {name}"].get_ydata()) == \
            ts[f"replicas_pool_{name}"].tolist()


def test_the_worked_run_of_the_docs(monkeypatch):
    # docs/autoscaling.md, "Scaling prefill and decode pools": every figure it quotes.
    path = ROOT / "workloads" / "day-8b-pools-step.toml"
    captured = {}
    real = running.PoolScaling

    class Spy(real):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            captured["scaling"] = self

    monkeypatch.setattr(running, "PoolScaling", Spy)
    r = run(load_scenario(path))
    s, req = r.summary, r.requests
    log = captured["scaling"].scalers["decode"].log
    w = build_plan(r.scenario).pools[1].memory.weights_per_gpu[0]
    assert round(w / 1e9, 2) == 16.06
    cold = 10.0 + w / 25e9 + 5.0
    assert round(cold, 1) == 15.6 and round(120 + cold, 1) == 135.6
    assert [(t, st) for t, _, st in log.changes if st == "starting"] == [(120.0, "starting")] * 3
    downs = [(t, i) for t, i, st in log.changes if st == "draining"]
    assert {t for t, _ in downs} == {260.0} and len(downs) == 3
    parked = [t for t, _, st in log.changes if st == "parked"]
    assert len(parked) == 3 and 0 < max(parked) - 260.0 <= 0.7
    assert len(req) == 4400 and (req["status"] == "completed").all()
    assert req["request_id"].is_unique and s["slo_attainment"] == 1.0
    end = s["simulated_time_s"]
    assert round(end, 1) == 301.7
    assert round(s["autoscale_pool_replicas_mean"]["decode"], 1) == 2.4
    assert round(s["autoscale_pool_gpu_hours"]["decode"], 2) == 0.20
    assert round(s["autoscale_pool_gpu_hours"]["prefill"], 2) == 0.17
    assert round(s["autoscale_gpu_hours"], 2) == 0.37
    # A static decode pool of 4: the 6 GPUs for its own run.
    static = read_toml(path)
    del static["pools"][1]["autoscale"]
    fixed = run(load_scenario(static | {"_base_dir": str(path.parent)})).summary
    assert round(fixed["gpus"] * fixed["simulated_time_s"] / 3600.0, 2) == 0.50
    # The printout's line per pool.
    assert ("replicas per pool              prefill 2.0 mean (2 to 2), 0.17 GPU-hours; "
            "decode 2.4 mean (1 to 4), 0.20 GPU-hours") in format_summary("pd", s, req)
    doc = (ROOT / "docs" / "autoscaling.md").read_text()
    for quoted in ("16.06 GB / 25 GB/s", "= 15.6 s", "at 135.6 s", "(220, 240 and 260 s)",
                   "within 0.7 s", "4,400 requests", "2.4 replicas", "0.20 GPU-hours",
                   "301.7 s", "= 0.17, 0.37 in all", "against 0.50"):
        assert quoted in doc, quoted


def _held_drain_scenario() -> dict:
    """A prefill pool that starts with 2 replicas and wants 1 at its first decision, while
    a static decode replica of 4 sequences keeps a backlog: prefilled KV waits on the
    prefill replicas for decode admission. Prompts go round robin, so both hold some."""
    sc = _scenario(decode=None, prefill={"policy": "load", "min_replicas": 1,
                                         "max_replicas": 2, "initial_replicas": 2,
                                         "interval_s": 20.0, "target": 1000.0,
                                         "down_intervals": 1, "cooldown_down_s": 0.0},
                   rates=(4.0,), at=(0,), duration=40.0)
    sc["pools"][0]["router"] = "round_robin"  # both prefill replicas take prompts
    sc["pools"][1] |= {"dp": 1, "engine": {"max_num_seqs": 4}}
    return sc


def test_a_draining_prefill_replica_hands_its_held_kv_over_before_it_is_parked(monkeypatch):
    r, scaling, checks = _spied(_held_drain_scenario(), monkeypatch)
    req = r.requests
    log = scaling.scalers["p"].log
    (t0, k), = [(t, i) for t, i, st in log.changes if st == "draining"]
    (t1,) = [t for t, i, st in log.changes if st == "parked" and i == k]
    assert t0 == 20.0
    mine = req["prefill_replica"] == scaling.scalers["p"].first + k
    moved_end = req["kv_transfer_start_s"] + req["kv_transfer_s"]
    # It held prefilled KV when it was told to drain: requests it prefilled before 20 s
    # whose KV left it later. It is parked when the last of them has been handed over,
    # and took no new prompt in between.
    held = mine & (req["arrival_s"] < t0) & (moved_end > t0)
    assert held.sum() >= 1
    assert t1 == pytest.approx(moved_end[mine].max())
    assert not (mine & (req["arrival_s"] >= t0)).any()
    assert (req["status"] == "completed").all() and req["request_id"].is_unique
    assert len(req) == r.summary["requests_total"] == 160
    assert checks and all(checks)


def test_the_sla_policy_sizes_a_decode_pool_from_its_capacity(monkeypatch):
    # 10 req/s flat, a decode replica serving 5 req/s within the SLOs at 80%: the first
    # decision (20 s; the arrivals at 0.1, 0.2, ..., 19.9 s before it, 199 / 20 s = 9.95
    # req/s the forecast; TPOT within its SLO so no correction) wants
    # ceil(9.95 / (5 x 0.8)) = 3, and the pool settles there.
    sla = {"policy": "sla", "min_replicas": 1, "max_replicas": 4, "interval_s": 20.0,
           "replica_capacity_per_s": 5.0, "forecaster": "last"}
    r, scaling, _ = _spied(_scenario(decode=sla, rates=(10.0,), at=(0,), duration=120.0),
                           monkeypatch)
    d = scaling.scalers["d"]
    wants = [n for _, n, _ in d.log.decisions]
    assert d.log.decisions[0][2] == pytest.approx(9.95) and wants[0] == 3
    assert set(wants[:5]) == {3}
    assert r.summary["autoscale_pool_scale_ups"]["d"] == 2
    assert r.summary["autoscale_pool_scale_downs"]["d"] == 0


def test_a_sweep_varies_a_pools_autoscale_key():
    # Two decode targets on the first 140 s of the step: the tighter one wants more decode
    # replicas. A misspelt key is named before any run.
    base = _scenario(duration=140.0)
    df = sweep(base, {"pools.d.autoscale.target": [8.0, 1000.0]}, jobs=1)
    assert df["status"].tolist() == ["ok", "ok"]
    assert df["autoscale_scale_ups"].tolist() == [3, 0]
    assert df["autoscale_gpu_hours"].iloc[0] > df["autoscale_gpu_hours"].iloc[1]
    with pytest.raises(ScenarioError, match=r"pools.d.autoscale.targt: unknown key \(did "
                                            r"you mean 'target'\?\)"):
        parse_grid({"pools.d.autoscale.targt": [1.0]})
