"""Where two features meet: MoE layouts per pool and the MLA KV transfer, pool keys
in sweeps, the DeepSeek-V3 prefix-caching example, rerouted requests counted as queued
during an outage, and batch efficiency as the binding-resource fill."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import tomllib
from conftest import toy_scenario

from simulator import ScenarioError, build_plan, load_scenario, run
from simulator.cluster.simulation import workload_requests
from simulator.cluster.transfer import kv_flows
from simulator.engine.prefix import hit_rate_ceiling, infinite_cache_tokens
from simulator.io.scenario import to_dict
from simulator.metrics.pools import POOL_SUMMARY_KEYS
from simulator.metrics.summary import SUMMARY_KEYS
from simulator.metrics.timeseries import request_windows, window_edges
from simulator.model.spec import load_model
from simulator.paths import ROOT
from simulator.sweep import STATUS_COLUMNS, sweep

WORKLOADS = ROOT / "workloads"
MLA_FP8 = 61 * (512 + 64) * 1  # DeepSeek-V3 latent cache, FP8: layers x width x bytes


# -- 1. MoE keys per pool, the MLA transfer --------------------------------------------------
def test_mla_kv_flows_move_the_latent_once_per_holding_rank():
    m = load_model("deepseek-v3")
    src = [[f"p{i}" for i in range(8)]]
    dst = [[f"d{i}" for i in range(8)]]
    # TP attention on both sides: every rank holds the whole latent; decode rank q reads
    # it from prefill rank q.
    flows = kv_flows(m, 1, src, dst)
    assert flows == [(f"p{q}", f"d{q}", MLA_FP8) for q in range(8)]
    # DP attention on the decode side: only the serving rank (3) takes it, from rank 3.
    assert kv_flows(m, 1, src, dst, None, 3) == [("p3", "d3", MLA_FP8)]
    # DP attention on both sides: from the prefill rank that served it (5).
    assert kv_flows(m, 1, src, dst, 5, 3) == [("p5", "d3", MLA_FP8)]
    # The dense, head-sharded path is unchanged by rank arguments it does not use.
    ll = load_model("llama-3.1-8b")
    assert kv_flows(ll, 2, src, dst) == [(f"p{q}", f"d{q}", 2 * 32 * 128 * 2)
                                         for q in range(8)]


def _ds_pools(n: int = 40):
    return load_scenario(WORKLOADS / "disagg-deepseek-v3.toml",
                         [f"workload.num_requests={n}"])


def test_moe_pools_run_conserve_requests_and_move_the_latent():
    s = _ds_pools()
    assert (s.pools[1].ep, s.pools[1].attention_dp) == (8, True)
    res = run(s, keep_steps=False)
    req = res.requests
    assert len(req) == 40
    assert (req["status"] == "completed").all()
    assert res.summary["requests_completed"] == 40
    assert res.summary["kv_transfers"] == 40
    # Each request's latent went once to the one decode rank serving it (DP attention).
    assert (req["kv_bytes"] == req["prompt_tokens"] * MLA_FP8).all()
    # Outputs complete on the decode pool, prefills on the prefill pool.
    assert set(req["decode_replica"]) == {1}


def test_moe_pool_layout_is_checked_per_pool():
    d = to_dict(_ds_pools())
    d["pools"][1]["ep"] = 3  # EP3 over 8 GPUs: not a divisor (EP4 x MoE-TP2 would run)
    with pytest.raises(ScenarioError, match=r"pools\[1\] \(decode\): parallel.ep: 3 does not "
                                            r"divide parallel.tp"):
        run(load_scenario(d))
    dense = tomllib.loads((WORKLOADS / "disagg-70b-1p1d-short.toml").read_text())
    dense["pools"][0]["ep"] = 8
    with pytest.raises(ScenarioError, match=r"pools\[0\] \(prefill\): parallel.ep: 8 needs a "
                                            r"mixture-of-experts model"):
        run(load_scenario(dense))


# -- 2. pool keys in sweeps ------------------------------------------------------------------
def _short_pools(n: int = 30) -> dict:
    d = tomllib.loads((WORKLOADS / "disagg-70b-1p1d-short.toml").read_text())
    d["workload"]["num_requests"] = n
    return d


def test_sweep_over_pools_writes_pool_keys_and_varies_a_pool(tmp_path):
    out = tmp_path / "sweep.csv"
    df = sweep(_short_pools(), {"pools.decode.tp": [4, 8]}, jobs=1, out=out)
    assert list(df["status"]) == ["ok", "ok"]
    for k in [*POOL_SUMMARY_KEYS, "pool_utilization_prefill", "pool_utilization_decode"]:
        assert k in df.columns
    assert (df["kv_transfers"] == 30).all()
    gpus = [json.loads(c) for c in df["pool_gpus"]]
    assert gpus == [{"prefill": 8, "decode": 4}, {"prefill": 8, "decode": 8}]
    util = [json.loads(c) for c in df["pool_utilization"]]
    assert list(df["pool_utilization_decode"]) == pytest.approx([u["decode"] for u in util])
    assert (df["pool_utilization_decode"].between(0, 1)).all()
    # TP8 -> TP4: each decode GPU gathers 2 heads from 2 prefill GPUs; the KV still moves
    # once per request, the same bytes whatever the decode TP.
    assert df["kv_bytes_moved"].iloc[0] == pytest.approx(df["kv_bytes_moved"].iloc[1])


def test_sweep_without_pools_keeps_its_columns_and_pool_keys_need_pools(tmp_path):
    base = {"model": {"name": "llama-3.1-8b"}, "cluster": {"topology": "dgx-h100"},
            "workload": {"arrival": "constant", "rate_per_s": 1.0, "num_requests": 2,
                         "prompt_tokens": 64, "output_tokens": 4}}
    df = sweep(base, {"engine.max_num_seqs": [8]}, jobs=1)
    assert list(df.columns) == ["run_id", "engine.max_num_seqs", *STATUS_COLUMNS,
                                *SUMMARY_KEYS]
    with pytest.raises(ScenarioError, match=r"pools.decode.tp: 'decode' is not a pool"):
        sweep(base, {"pools.decode.tp": [4]}, jobs=1)
    with pytest.raises(ScenarioError, match=r"pools.decode.tq: unknown key .*tp, pp"):
        sweep(_short_pools(), {"pools.decode.tq": [4]}, jobs=1)


# -- 5. batch efficiency: the binding resource's fill ----------------------------------------
def _small_decode_heavy() -> dict:
    return {"name": "be", "seed": 2, "model": {"name": "llama-3.1-8b"},
            "cluster": {"topology": "dgx-h100"}, "parallel": {"tp": 1},
            "engine": {"max_num_seqs": 16, "max_num_batched_tokens": 2048},
            "workload": {"arrival": "poisson", "rate_per_s": 40.0, "num_requests": 120,
                         "prompt_tokens": 128, "output_tokens": 128}}


def test_batch_efficiency_mean_is_the_binding_fill_of_the_steps():
    res = run(_small_decode_heavy())
    first = res.steps[res.steps["stage"] == 0]
    blocks = res.summary["kv_blocks_per_replica"]  # one stream per replica (pp = 1)
    by_hand = np.maximum.reduce([
        first["batch_size"].to_numpy() / 16,
        (first["prefill_tokens"] + first["decode_tokens"]).to_numpy() / 2048,
        first["kv_blocks"].to_numpy() / blocks]).mean()
    assert res.summary["batch_efficiency_mean"] == pytest.approx(by_hand, rel=1e-12)
    # Decode-heavy and sequence-bound: 16 sequences fill the batch while one decode token
    # each uses under 1 % of the token budget; the old token-only figure read that.
    tokens_only = (first["prefill_tokens"] + first["decode_tokens"]).sum() / (len(first) * 2048)
    assert res.summary["batch_efficiency_mean"] > 5 * tokens_only
    assert 0 < res.summary["batch_efficiency_mean"] <= 1


def test_batch_efficiency_without_steps_is_the_token_fill_lower_bound():
    with_steps = run(_small_decode_heavy())
    without = run(_small_decode_heavy(), keep_steps=False)
    first = with_steps.steps[with_steps.steps["stage"] == 0]
    tokens_only = (first["prefill_tokens"] + first["decode_tokens"]).sum() / (len(first) * 2048)
    assert without.summary["batch_efficiency_mean"] == pytest.approx(tokens_only, rel=1e-12)
    assert without.summary["batch_efficiency_mean"] < with_steps.summary["batch_efficiency_mean"]
    pd.testing.assert_frame_equal(with_steps.requests, without.requests)


# -- 4. rerouted requests queue during an outage ---------------------------------------------
def test_rerouted_requests_count_as_queued_until_admitted_again():
    # One replica whose node is down from 5 s to 9 s, weights reloaded by 10 s: nothing can
    # run in [5, 10); every request that has arrived and not finished waits.
    sc = toy_scenario(workload={"arrival": "poisson", "rate_per_s": 20.0, "num_requests": 400,
                                "prompt_tokens": 300, "output_tokens": 600},
                      recovery={"restart_s": 1.0}, output={"window_s": 1.0})
    sc["faults"] = [{"at_s": 5.0, "target": "node:0", "duration_s": 4.0}]
    res = run(sc)
    assert res.summary["downtime_spans"] == [[0, 5.0, 10.0, "node:0"]]
    ts, req = res.timeseries, res.requests
    outstanding = ts["arrivals"].cumsum() - ts["completions"].cumsum()
    # Every outstanding request is either queued or running, in every window.
    assert (ts["queue_len"] + ts["running"] == outstanding).all()
    during = ts[(ts["window_end_s"] >= 5.0) & (ts["window_end_s"] < 10.0)]
    assert len(during) == 5
    assert (during["running"] == 0).all()
    assert (during["queue_len"] == outstanding[during.index]).all()
    before = ts.loc[ts["window_end_s"] == 4.0].iloc[0]
    assert during["queue_len"].iloc[0] > before["queue_len"]
    # At 5 s the queue holds the requests never admitted plus those running at the failure,
    # rerouted back to the queue until the restart admits them again.
    running_at_fail = int(((req["first_scheduled_s"] <= 5.0) & (req["finish_s"] > 5.0)).sum())
    never_admitted = int((req["arrival_s"] <= 5.0).sum() - (req["first_scheduled_s"] <= 5.0).sum())
    assert running_at_fail > 0
    assert during["queue_len"].iloc[0] == never_admitted + running_at_fail
    # Without the reroute records the old count shows them running through the outage.
    old = request_windows(req, window_edges(float(ts["window_end_s"].iloc[-1]), 1.0))
    assert (old.loc[during.index, "running"] == running_at_fail).all()
    assert set(req["status"]) == {"completed"}


# -- 3. Mooncake on DeepSeek-V3 --------------------------------------------------------------
def test_mooncake_deepseek_v3_hit_rate_within_the_ceiling_and_a_larger_cache():
    sc = load_scenario(WORKLOADS / "mooncake-deepseek-v3.toml", ["workload.duration_s=90.0"])
    plan = build_plan(sc)
    # MLA: one 576-value latent per token and layer, in FP8, on every GPU of the TP group;
    # Llama-3.1-70B at TP4 holds 2 of 8 KV heads, bf16, per GPU.
    assert plan.model.kv_bytes_per_token(1, tp=8) == MLA_FP8
    llama = build_plan(load_scenario(WORKLOADS / "mooncake-70b.toml"))
    assert llama.model.kv_bytes_per_token(2, tp=4) == 2 * 80 * 2 * 128 * 2
    assert plan.memory.kv_tokens > 2.5 * llama.memory.kv_tokens
    res = run(sc)
    ceiling = hit_rate_ceiling(workload_requests(sc), sc.workload.hash_block_tokens,
                               plan.max_model_len)
    assert 0.0 < res.summary["prefix_hit_rate"] <= ceiling
    df = workload_requests(sc)
    best = infinite_cache_tokens(df["hashes"], df["prompt_tokens"], df["output_tokens"], 512)
    got = res.requests.set_index("request_id")["cached_prompt_tokens"]
    assert (got.to_numpy() <= best[got.index.to_numpy()]).all()
    assert (res.requests["status"] == "completed").all()
