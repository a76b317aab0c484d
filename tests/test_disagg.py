"""Pools and disaggregated prefill/decode: KV transfer pricing checked by hand, admission
backpressure, conservation of requests across pools, contention on a shared NIC, the
no-pools path unchanged, and one clear error per invalid combination."""

from __future__ import annotations

import doctest
import gzip
import json
import re

import numpy as np
import pandas as pd
import pytest
import simpy
import tomli_w

import simulator
from simulator import DEFAULT_SCENARIO, ScenarioError, load_scenario, run, write_result
from simulator.cli import main
from simulator.cluster.build import build_colocated
from simulator.cluster.disagg import POOL_COLUMNS
from simulator.cluster.pools import build_plan
from simulator.cluster.running import check
from simulator.cluster.simulation import Cluster, open_loop_workload, run_rngs
from simulator.cluster.transfer import KVTransfers, kv_flows
from simulator.engine.clock import TICK
from simulator.io.chrome_trace import TRANSFER_PID
from simulator.io.scenario import to_dict
from simulator.metrics.links import KEYS as LINK_KEYS
from simulator.metrics.records import Recorder
from simulator.metrics.utilization import GPU_COLUMNS
from simulator.model.spec import load_model
from simulator.paths import ROOT
from simulator.planner import plan
from simulator.planner.objectives import label
from simulator.planner.simulate import without_pools

EFF = 0.75  # BANDWIDTH_EFFICIENCY: links run at 75 % of line rate for point-to-point sends
KV_8B = 2 * 32 * 8 * 128 * 2  # Llama-3.1-8B, bf16: 2 x layers x kv heads x d x bytes


DROP = object()  # in a section override: remove the key


def _toml(folder, scenario: dict):
    path = folder / "scenario.toml"
    path.write_text(tomli_w.dumps(scenario))
    return path


def pools_scenario(prefill: dict, decode: dict, **sections) -> dict:
    """Llama-3.1-8B on DGX H100 pools: one request of 1000 prompt tokens unless told."""
    s = {"name": "dg", "seed": 3, "model": {"name": "llama-3.1-8b"},
         "cluster": {"topology": "dgx-h100"},
         "pools": [{"name": "p", "role": "prefill", **prefill},
                   {"name": "d", "role": "decode", **decode}],
         "workload": {"arrival": "constant", "rate_per_s": 1.0, "num_requests": 1,
                      "prompt_tokens": 1000, "output_tokens": 4}}
    for k, v in sections.items():
        s[k] = {kk: vv for kk, vv in {**s.get(k, {}), **v}.items() if vv is not DROP}
    return s


# -- transfer pricing ---------------------------------------------------------------------
def test_kv_flows_split_by_heads_and_layers():
    m = load_model("llama-3.1-8b")
    g = [f"s{i}" for i in range(8)]
    # TP8 -> TP8: rank q sends its one KV head to rank q, all 32 layers.
    same = kv_flows(m, 2, [g], [[f"d{i}" for i in range(8)]])
    assert sorted(same) == [(f"s{i}", f"d{i}", KV_8B / 8) for i in range(8)]
    # TP8 -> TP2: each decode rank gathers its 4 heads from 4 prefill ranks.
    gather = kv_flows(m, 2, [g], [["d0", "d1"]])
    assert {(a, b) for a, b, _ in gather} == {(f"s{i}", f"d{i // 4}") for i in range(8)}
    assert all(x == KV_8B / 8 for _, _, x in gather)
    # TP2 x PP2 -> TP4: layers 0-15 from stage 0, 16-31 from stage 1; 2 heads per rank.
    pp = kv_flows(m, 2, [["a0", "a1"], ["b0", "b1"]], [["d0", "d1", "d2", "d3"]])
    assert sorted(pp) == sorted([(f"{st}{q // 2}", f"d{q}", 16 * 2 * 2 * 128 * 2)
                                 for st in "ab" for q in range(4)])
    # Every case moves the whole KV once (decode TP <= KV heads: no replication).
    for flows in (same, gather, pp):
        assert sum(x for _, _, x in flows) == KV_8B


def one_request(scenario: dict) -> pd.Series:
    r = run(scenario)
    assert r.requests["status"].tolist() == ["completed"]
    return r.requests.iloc[0]


def test_transfer_time_nvlink_hand_computed():
    # Prefill TP4 on GPUs 0-3, decode TP4 on GPUs 4-7 of one DGX H100: 4 flows of 2 heads,
    # each GPU -> NVSwitch -> GPU on its own links: 1000 x 32768 B at 450 GB/s x 0.75,
    # plus two 0.4 us hops.
    row = one_request(pools_scenario({"nodes": 1, "tp": 4},
                                     {"same_nodes_as": "p", "tp": 4}))
    expected = 1000 * KV_8B / 4 / (450e9 * EFF) + 2 * 0.4e-6
    assert expected == pytest.approx(97.89e-6, rel=1e-3)
    assert row["kv_transfer_s"] == pytest.approx(expected, abs=3 * TICK)
    assert row["kv_bytes"] == 1000 * KV_8B
    assert row["decode_wait_s"] == 0.0
    # TTFT ends on the prefill instance; the transfer starts there and then.
    assert row["kv_transfer_start_s"] == row["first_token_s"]
    assert row["prefill_replica"] == 0 and row["decode_replica"] == 1


def test_transfer_time_across_the_fabric_hand_computed():
    # One node each, TP8 -> TP8: 8 flows of one head, each GPU -> NIC (PCIe 64 GB/s) ->
    # switch (50 GB/s) -> NIC -> GPU: bottleneck 50 GB/s x 0.75; latency 0.5 + 1.3 + 1.3
    # + 0.5 us (PCIe half-hop, NIC 1 us + half of the 0.6 us switch, twice).
    row = one_request(pools_scenario({"nodes": 1, "tp": 8}, {"nodes": 1, "tp": 8}))
    expected = 1000 * KV_8B / 8 / (50e9 * EFF) + 3.6e-6
    assert expected == pytest.approx(440.5e-6, rel=1e-3)
    assert row["kv_transfer_s"] == pytest.approx(expected, abs=3 * TICK)


def test_layerwise_transfer_leaves_the_last_layer_exposed():
    # The NVLink transfer (98 us) is far shorter than the prefill of 1000 tokens: only the
    # last of 32 layers remains after the prefill ends.
    row = one_request(pools_scenario({"nodes": 1, "tp": 4, "kv_transfer": "layerwise"},
                                     {"same_nodes_as": "p", "tp": 4}))
    expected = 1000 * KV_8B / 4 / 32 / (450e9 * EFF) + 2 * 0.4e-6
    assert row["kv_transfer_s"] == pytest.approx(expected, abs=3 * TICK)


def test_the_public_build_plan_builds_pools_and_colocated_alike():
    """``simulator.build_plan`` is the one build entry point: a ``[[pools]]`` scenario gets
    its pools (a 1-GPU prefill pool on node 0, a TP2 decode pool on node 1: 3 GPUs, two
    nodes joined by the fabric switch), as ``check`` and ``run`` build it; a colocated one
    is a cluster of one mixed pool."""
    s = load_scenario(pools_scenario({"nodes": 1, "tp": 1}, {"nodes": 1, "tp": 2}))
    built = simulator.build_plan(s)
    assert [(p.name, p.role, p.gpus) for p in built.pools] == [
        ("p", "prefill", 1), ("d", "decode", 2)]
    assert built.gpus_used == 3 and "switch" in built.graph
    assert [p.spec.name for p in check(s)[0].pools] == ["p", "d"]
    one = simulator.build_plan(load_scenario(DEFAULT_SCENARIO))
    assert len(one.pools) == 1 and one.pools[0].role == "mixed"
    with pytest.raises(ValueError, match="build_plan builds it"):
        build_colocated(s)  # the one-pool step refuses pools rather than drop them


def test_two_transfers_sharing_a_nic_split_its_bandwidth():
    # Two prefill GPUs of node 0 send to the one decode GPU of node 1 at the same time:
    # both flows cross that GPU's NIC link, so each gets half of it and takes twice as long.
    plan = build_plan(load_scenario(pools_scenario({"nodes": 1, "tp": 1, "dp": 2},
                                                    {"nodes": 1, "tp": 1})))
    env = simpy.Environment()
    kv = KVTransfers(env, plan.graph, plan.model, 0.0)
    src = [p.replicas for p in plan.pools]
    a, b = ([r.placement.stages for r in src[0]])
    d = src[1][0].placement.stages
    alone = kv.time_alone(1000, a, d, 2)
    assert alone == pytest.approx(1000 * KV_8B / (50e9 * EFF) + 3.6e-6, rel=1e-9)
    done = {}
    for name, s in (("a", a), ("b", b)):
        ev, _ = kv.start(1000, s, d, 2)
        ev.callbacks.append(lambda _, n=name: done.__setitem__(n, env.now))
    env.run()
    both = 2 * 1000 * KV_8B / (50e9 * EFF) + 3.6e-6
    assert done["a"] == pytest.approx(both, rel=1e-9)
    assert done["b"] == pytest.approx(both, rel=1e-9)
    # The same through a run: two requests 1 us apart on two prefill replicas. The first
    # moves alone for 1 us, then both share the NIC; each ends 1 us sooner than ``both``
    # after its start (the first has a 1 us head start, the second 1 us alone at the end).
    sc = pools_scenario({"nodes": 1, "tp": 1, "dp": 2}, {"nodes": 1, "tp": 1},
                        workload={"rate_per_s": 1e6, "num_requests": 2})
    req = run(sc).requests
    assert sorted(req["prefill_replica"]) == [0, 1]
    assert (req["decode_replica"] == 2).all()
    assert req["kv_transfer_start_s"].diff().iloc[1] == pytest.approx(1e-6, abs=2 * TICK)
    assert req["kv_transfer_s"].to_numpy() == pytest.approx([both - 1e-6] * 2,
                                                            abs=4 * TICK)


# -- admission and conservation ----------------------------------------------------------
def test_decode_admission_backpressure():
    # The decode instance runs one sequence at a time: each request's KV waits on the
    # prefill side until the previous one finishes, and moves the moment it does.
    sc = pools_scenario({"nodes": 1, "tp": 1}, {"nodes": 1, "tp": 1,
                                                "engine": {"max_num_seqs": 1}},
                        workload={"rate_per_s": 50.0, "num_requests": 6,
                                  "output_tokens": 64})
    req = run(sc).requests.sort_values("kv_transfer_start_s")
    assert (req["status"] == "completed").all()
    start, finish = req["kv_transfer_start_s"].to_numpy(), req["finish_s"].to_numpy()
    assert np.allclose(start[1:], np.maximum(finish[:-1], req["first_token_s"].to_numpy()[1:]),
                       atol=2 * TICK)
    wait = req["decode_wait_s"].to_numpy()
    assert wait[0] == 0.0 and (wait[1:] > 0).all()
    assert np.allclose(wait, start - req["first_token_s"].to_numpy(), atol=2 * TICK)
    # Nothing overlaps on the decode side.
    assert (start[1:] >= finish[:-1] - 2 * TICK).all()


def test_every_request_is_accounted_for_across_pools():
    sc = pools_scenario({"nodes": 1, "tp": 2, "dp": 2}, {"nodes": 1, "tp": 4, "dp": 1},
                        workload={"arrival": "poisson", "rate_per_s": 30.0,
                                  "num_requests": 150,
                                  "prompt_tokens": {"dist": "lognormal", "mean": 1500,
                                                    "sigma": 0.8, "max": 6000},
                                  "output_tokens": {"dist": "uniform", "min": 1,
                                                    "max": 60}},
                        router={"policy": "least_outstanding"})
    r = run(sc)
    req = r.requests
    assert sorted(req["request_id"]) == list(range(150))
    assert (req["status"] == "completed").all()
    moved = req["output_tokens"] > 1
    assert set(req["prefill_replica"]) == {0, 1}
    assert set(req.loc[moved, "decode_replica"]) == {2}
    assert (req.loc[~moved, "decode_replica"] == -1).all()  # one token: done on prefill
    assert req.loc[~moved, "kv_transfer_s"].isna().all()
    # Each moved request carries its whole prompt's KV once (TP2 -> TP4, 8 KV heads).
    assert req.loc[moved, "kv_bytes"].tolist() == (req.loc[moved, "prompt_tokens"]
                                                   * KV_8B).tolist()
    assert r.summary["kv_bytes_moved"] == float((req.loc[moved, "prompt_tokens"]
                                                 * KV_8B).sum())
    # Time order: arrival <= first token <= transfer start <= transfer end <= finish.
    m = req[moved]
    assert (m["first_token_s"] >= m["arrival_s"]).all()
    assert (m["kv_transfer_start_s"] >= m["first_token_s"]).all()
    end = m["kv_transfer_start_s"] + m["kv_transfer_s"]
    assert (m["finish_s"] > end).all()
    s = r.summary
    assert s["requests_completed"] == 150 and s["kv_transfers"] == int(moved.sum())
    assert set(s["pool_utilization"]) == {"p", "d"}
    assert 0 < s["pool_utilization"]["p"] <= 1 and 0 < s["pool_utilization"]["d"] <= 1
    assert s["goodput_req_per_s_per_gpu"] == pytest.approx(s["goodput_req_per_s"] / 8)
    assert np.isnan(s["cost_per_million_tokens_usd"])  # no prices given


def test_cost_per_million_tokens():
    sc = pools_scenario({"nodes": 1, "tp": 1, "gpu_hour_usd": 3.0},
                        {"nodes": 1, "tp": 1, "gpu_hour_usd": 1.0},
                        workload={"num_requests": 3})
    r = run(sc)
    done = r.requests
    span = done["finish_s"].max() - done["arrival_s"].min()
    usd = (3.0 + 1.0) * span / 3600
    assert r.summary["cost_per_million_tokens_usd"] == pytest.approx(
        usd / (done["output_tokens"].sum() / 1e6))


def test_heterogeneous_mixed_pools_share_one_router():
    sc = {"name": "het", "seed": 2, "model": {"name": "llama-3.1-8b"},
          "cluster": {"topology": "dgx-h100"},
          "pools": [{"name": "h100", "role": "mixed", "nodes": 1, "tp": 1, "dp": 2},
                    {"name": "a100", "role": "mixed", "topology": "dgx-a100", "nodes": 1,
                     "tp": 1, "dp": 2}],
          "router": {"policy": "round_robin"},
          "workload": {"arrival": "poisson", "rate_per_s": 20.0, "num_requests": 80,
                       "prompt_tokens": 512, "output_tokens": 32}}
    r = run(sc)
    req = r.requests
    assert (req["status"] == "completed").all()
    assert req["replica"].value_counts().to_dict() == {0: 20, 1: 20, 2: 20, 3: 20}
    assert (req["pool"] == np.where(req["replica"] < 2, "h100", "a100")).all()
    assert req["kv_transfer_s"].isna().all() and r.summary["kv_bytes_moved"] == 0
    # The same prompt prefills faster on an H100 than on an A100.
    ttft = req.groupby("pool")["ttft_s"].min()
    assert ttft["h100"] < ttft["a100"]


# -- no pools: today's results -----------------------------------------------------------
def test_one_mixed_pool_is_the_scenario_without_pools():
    s = load_scenario(dict(DEFAULT_SCENARIO), overrides=["workload.num_requests=200"])
    assert s.pools == () and "pools" not in to_dict(s)
    plain = run(s)
    d = to_dict(s)
    p = d["parallel"]
    d["pools"] = [{"name": "all", "role": "mixed", "nodes": d["cluster"]["nodes"],
                   "tp": p["tp"], "pp": p["pp"], "dp": p["dp"]}]
    pooled = run(d)
    pd.testing.assert_frame_equal(plain.requests, pooled.requests.drop(columns=POOL_COLUMNS))
    pd.testing.assert_frame_equal(plain.steps, pooled.steps)
    # the same link figures, link columns and per-GPU table (less its pool column)
    for key in LINK_KEYS:
        assert pooled.summary[key] == plain.summary[key], key
    assert plain.summary["nvlink_util_mean"] > 0
    pd.testing.assert_frame_equal(plain.timeseries[list(LINK_KEYS)],
                                  pooled.timeseries[list(LINK_KEYS)])
    assert len(plain.gpu_timeseries) > 0
    pd.testing.assert_frame_equal(plain.gpu_timeseries[GPU_COLUMNS],
                                  pooled.gpu_timeseries[GPU_COLUMNS])
    assert (pooled.gpu_timeseries["pool"] == "all").all()


# -- invalid combinations: one clear error each -------------------------------------------
@pytest.mark.parametrize("change, message", [
    (lambda s: s["pools"].pop(0), "pools.role: a decode pool needs a prefill pool"),
    (lambda s: s["pools"][1].update(role="mixed"),
     "pools.role: mixed pools cannot be combined"),
    (lambda s: s["pools"][1].update(kv_dtype="fp8"),
     "pools[1] (d).kv_dtype: fp8 differs from bf16 of pool 'p'"),
    (lambda s: (s["model"].update(name="llama-3.1-70b"), s["pools"][1].update(tp=1)),
     "pools[1] (d): model.name: llama-3.1-70b (bf16) does not fit with tp=1"),
    (lambda s: s["pools"][1].update(same_nodes_as="x"),
     "pools[1] (d).same_nodes_as: 'x' is not an earlier pool"),
    (lambda s: s["pools"][1].update(name="p"), "pools.name: 'p' names more than one pool"),
    (lambda s: s["pools"][1].update(engine={"max_num_seqz": 4}),
     "pools[1].engine.max_num_seqz: unknown key (did you mean 'max_num_seqs'?)"),
    (lambda s: s["pools"][0].update(first_token="client"),
     "pools[0].first_token: 'client' is not allowed (allowed: prefill, decode)"),
])
def test_invalid_pool_combinations(change, message):
    s = pools_scenario({"nodes": 1, "tp": 8}, {"nodes": 1, "tp": 8})
    change(s)
    with pytest.raises(ScenarioError) as err:
        check(s)
    assert len(err.value.problems) == 1
    assert err.value.problems[0].startswith(message), err.value.problems[0]


# -- outputs -------------------------------------------------------------------------------
def test_transfers_have_their_own_trace_track(tmp_path):
    sc = pools_scenario({"nodes": 1, "tp": 2}, {"nodes": 1, "tp": 2},
                        workload={"num_requests": 4, "rate_per_s": 20.0})
    r = run(sc)
    write_result(r, tmp_path)
    events = json.loads(gzip.decompress((tmp_path / "trace.json.gz").read_bytes()))[
        "traceEvents"]
    moved = [e for e in events if e.get("cat") == "transfer"]
    assert len(moved) == 4 and all(e["pid"] == TRANSFER_PID and e["tid"] == 1 for e in moved)
    req = r.requests.set_index("request_id")
    for e in moved:
        row = req.loc[e["args"]["request"]]
        assert e["ts"] == pytest.approx(row["kv_transfer_start_s"] * 1e6, abs=1e-3)
        assert e["dur"] == pytest.approx(row["kv_transfer_s"] * 1e6, abs=1e-3)
        assert e["args"]["bytes"] == row["kv_bytes"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["pid"] == TRANSFER_PID}
    assert names == {"KV transfers", "to replica 1"}
    csv = pd.read_csv(tmp_path / "requests.csv")
    assert set(POOL_COLUMNS) <= set(csv.columns)
    ts = pd.read_csv(tmp_path / "timeseries.csv")
    assert ts["arrivals"].sum() == 4 and {"kv_util_r0", "kv_util_r1"} <= set(ts.columns)


def test_closed_loop_and_same_seed_same_results():
    sc = pools_scenario({"nodes": 1, "tp": 1, "dp": 2}, {"nodes": 1, "tp": 2},
                        workload={"arrival": "closed_loop", "concurrency": 6,
                                  "num_requests": 40, "rate_per_s": DROP,
                                  "prompt_tokens": {"dist": "uniform", "min": 100,
                                                    "max": 3000},
                                  "output_tokens": {"dist": "uniform", "min": 2, "max": 50}})
    a, b = run(sc), run(sc)
    assert (a.requests["status"] == "completed").all() and len(a.requests) == 40
    pd.testing.assert_frame_equal(a.requests, b.requests)
    assert a.summary["kv_transfers"] == 40


@pytest.mark.parametrize("name", ["disagg-70b-1p1d", "disagg-70b-colocated",
                                  "disagg-70b-1p1d-short", "disagg-70b-colocated-short",
                                  "disagg-hetero-h100-a100", "disagg-splitwise-h100-a100"])
def test_example_scenarios_run(name):
    s = load_scenario(ROOT / "workloads" / f"{name}.toml",
                      overrides=["workload.num_requests=12"])
    r = run(s, keep_steps=False)
    assert (r.requests["status"] == "completed").all()
    assert r.summary["cost_per_million_tokens_usd"] > 0


def test_waiting_requests_hold_their_blocks_on_the_prefill_side():
    # Six 1000-token prompts arrive together; the decode instance takes one at a time.
    s = load_scenario(pools_scenario({"nodes": 1, "tp": 1},
                                     {"nodes": 1, "tp": 1, "engine": {"max_num_seqs": 1}},
                                     workload={"rate_per_s": 1e6, "num_requests": 6,
                                               "output_tokens": 200}))
    env = simpy.Environment()
    rngs = run_rngs(s.seed)
    cluster = Cluster(env, build_plan(s), Recorder(), rngs)
    cluster.expected = 6
    env.process(cluster.arrive(open_loop_workload(s, rngs)))
    prefill, decode = cluster.replicas
    per = -(-1000 // 16)  # blocks of one prompt
    env.run(until=0.5)  # every prefill is done (~0.1 s); the first decode (~1.3 s) is not
    assert len(cluster.handoff.queue) == 5
    assert prefill.streams[0].kv.used == 5 * per  # held for the five waiting requests
    assert decode.streams[0].kv.used >= per  # the one admitted
    assert prefill.outstanding == 0 and decode.outstanding == 1
    env.run()
    assert cluster.completed == 6 and not cluster.handoff.queue and not cluster.handoff._held
    assert prefill.streams[0].kv.used == 0 and decode.streams[0].kv.used == 0


# -- planner -------------------------------------------------------------------------------
def test_plan_compares_colocated_and_disaggregated_layouts(tmp_path):
    # 8B on one node, 2k-token prompts at 20 req/s, 32-token replies: a colocated replica
    # runs each prompt's prefill (~50 ms for 2k tokens on one H100) inside the steps of
    # the running decodes, so its TPOT tail passes 50 ms; a decode pool never prefills.
    sc = {"name": "pl", "seed": 1, "model": {"name": "llama-3.1-8b"},
          "cluster": {"topology": "dgx-h100", "nodes": 1},
          "workload": {"arrival": "poisson", "rate_per_s": 20.0, "num_requests": 40,
                       "prompt_tokens": 2048, "output_tokens": 32},
          "slo": {"ttft_s": 1.0, "tpot_s": 0.05}}
    r = plan(sc, requests=40, disagg=True, top=4, jobs=1)
    c = r.candidates
    dis = c[c["kind"] == "disaggregated"]
    pg = dis["prefill_tp"] * dis["prefill_pp"] * dis["prefill_dp"]
    dg = dis["tp"] * dis["pp"] * dis["dp"]
    # The one search holds every prefill:decode split of the node at GPU granularity
    # (the whole-node-or-half splits the old pools planner enumerated among them), each
    # pool at most the node, and the colocated layouts beside them.
    assert set(zip(pg.astype(int), dg.astype(int), strict=True)) == {
        (p, d) for p in range(1, 8) for d in range(1, 9 - p)}
    assert ((dis["gpus"] == pg + dg) & (dis["gpus"] <= 8)).all()
    assert {1, 2, 4, 8} <= set(c.loc[c["kind"] == "colocated", "tp"])
    t = r.table
    assert set(t["kind"]) == {"colocated", "disaggregated"} and (t["status"] == "ok").all()
    best = {}
    for kind in ("colocated", "disaggregated"):
        met = t[(t["kind"] == kind) & t["slo_met"]]
        assert len(met)
        best[kind] = met.iloc[0]  # the ranking puts each kind's best SLO-meeting point first
        assert best[kind]["goodput_req_per_s_per_gpu"] == met["goodput_req_per_s_per_gpu"].max()
    # Same GPUs per replica, the two kinds apart: colocated TP1 misses the TPOT target that
    # the TP1 decode pool meets with room to spare.
    col1 = t[(t["kind"] == "colocated") & (t["tp"] == 1) & (t["dp"] == 1)]
    assert len(col1) and (col1["tpot_slo_q_s"] > 0.05).all() and not col1["slo_met"].any()
    dis_, col = best["disaggregated"], best["colocated"]
    assert dis_["tpot_slo_q_s"] < 0.5 * 0.05
    # The answer: disaggregated wins, by the goodput per GPU the two bests simulated.
    assert r.best["kind"] == "disaggregated" and r.best["rank"] == 1
    a, b = dis_["goodput_req_per_s_per_gpu"], col["goodput_req_per_s_per_gpu"]
    assert a > b
    assert (f"the pick (disaggregated) {a / b - 1:+.0%} goodput per GPU over the best "
            f"colocated, {label(col)} ({a:.3g} vs {b:.3g})") in r.comparison
    # plan --disagg writes the same ranking (docs/planner.md).
    assert main(["plan", "--disagg", "--requests", "20", "--top", "2", "--out",
                 str(tmp_path), str(_toml(tmp_path, sc))]) == 0
    assert "disaggregated" in set(pd.read_csv(tmp_path / "candidates.csv")["kind"])


def test_plan_searches_the_nodes_of_a_scenarios_pools():
    # A scenario with [[pools]] plans on its pools' own nodes; a shared pool adds none.
    base = {"cluster": {"topology": "dgx-h100"},
            "pools": [{"name": "p", "nodes": 1}, {"name": "d", "nodes": 2}]}
    assert without_pools(base) == {"cluster": {"topology": "dgx-h100", "nodes": 3}}
    # A pool sharing another's nodes is on that pool's preset, whatever [cluster] says.
    base = {"cluster": {"topology": "dgx-h100"},
            "pools": [{"name": "p", "nodes": 2, "topology": "hgx-h200"},
                      {"name": "d", "same_nodes_as": "p"}]}
    assert without_pools(base)["cluster"] == {"topology": "hgx-h200", "nodes": 2}
    base = {"cluster": {"topology": "dgx-h100"},
            "pools": [{"name": "p", "nodes": 2, "topology": "hgx-h200"},
                      {"name": "d", "nodes": 1}]}
    with pytest.raises(ScenarioError, match=r"several node presets \(dgx-h100, hgx-h200\)"):
        without_pools(base)  # the search lays its layouts on one preset


def test_the_keep_up_example_of_the_planner_section_runs_as_written(monkeypatch):
    # docs/disaggregation.md settles where plan --disagg and the old pools planner
    # disagreed with longer runs: colocated TP4 x DP4 holds 80 req/s of short prompts and
    # falls behind at 96 (TTFT p99 past 1 s over 6,000 requests). Its numbers are checked.
    monkeypatch.chdir(ROOT)
    page = (ROOT / "docs" / "disaggregation.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", page, re.S) if ">>>" in b]
    test = doctest.DocTestParser().get_doctest(block, {}, "disaggregation.md", None, 0)
    result = doctest.DocTestRunner(optionflags=doctest.REPORT_NDIFF).run(test)
    assert result.attempted == 3 and result.failed == 0


def test_admission_leaves_the_blocks_a_decode_run_has_planned():
    # Decode replicas of a few thousand tokens each, long prompts: admissions land while
    # decode runs are under way; a run's planned blocks stay its own (a regression: the
    # reservation once took them, and the run's end overflowed the cache).
    sc = {"name": "dg", "seed": 1, "model": {"name": "llama-3.1-70b"},
          "cluster": {"topology": "dgx-h100"},
          "pools": [{"name": "p", "role": "prefill", "nodes": 1, "tp": 2, "dp": 4},
                    {"name": "d", "role": "decode", "nodes": 1, "tp": 2, "dp": 4}],
          "workload": {"arrival": "poisson", "rate_per_s": 4.0, "num_requests": 60,
                       "prompt_tokens": {"dist": "lognormal", "mean": 4096, "sigma": 0.5,
                                         "max": 16384},
                       "output_tokens": {"dist": "lognormal", "mean": 256, "sigma": 0.5,
                                         "max": 2048}}}
    r = run(sc, keep_steps=False)
    assert (r.requests["status"] == "completed").all()
    assert r.summary["preemptions_total"] > 0  # the decode caches do fill up


# -- failures ------------------------------------------------------------------------------
@pytest.mark.parametrize("target, retry", [("node:0", "reroute"), ("gpu:0", "reroute"),
                                           ("node:1", "reroute"), ("node:0", "drop"),
                                           ("node:1", "drop")])
def test_failures_of_either_pool_follow_the_recovery_rules(target, retry):
    # Prefill replicas on node 0 (GPUs 0, 1), decode replicas on node 1; long prompts keep
    # the prefill replicas busy, so the fault catches requests in prefill, waiting for
    # admission, in transfer and decoding.
    sc = pools_scenario({"nodes": 1, "tp": 1, "dp": 2}, {"nodes": 1, "tp": 1, "dp": 2},
                        recovery={"restart_s": 2.0, "retry": retry},
                        workload={"arrival": "poisson", "rate_per_s": 40.0,
                                  "num_requests": 150,
                                  "prompt_tokens": {"dist": "uniform", "min": 6000,
                                                    "max": 12000},
                                  "output_tokens": {"dist": "uniform", "min": 1,
                                                    "max": 200}})
    healthy = run(sc).requests
    sc["faults"] = [{"at_s": 1.0, "target": target, "duration_s": 3.0}]
    r = run(sc)
    req = r.requests
    # Every request is accounted for once, with the lengths it was drawn with.
    assert req["request_id"].tolist() == list(range(150))
    assert (req["output_tokens"] == healthy["output_tokens"]).all()
    assert r.summary["retries_total"] == int(req["retries"].sum()) > 0
    if retry == "reroute":
        assert (req["status"] == "completed").all()
    else:
        dropped = req["status"] == "dropped"
        assert dropped.sum() == r.summary["retries_total"]
        assert set(req.loc[~dropped, "status"]) == {"completed"}
        assert req.loc[dropped, "reason"].str.contains("went down|lost an end").all()
    # Replicas of the failed part were down 3 s and reloaded for 2 s.
    assert r.summary["availability_min"] < 1.0
    moved = req[(req["status"] == "completed") & (req["output_tokens"] > 1)]
    assert (moved["finish_s"] > moved["kv_transfer_start_s"]).all()


def test_second_token_waits_for_the_transfer_and_a_decode_step():
    # TTFT ends on the prefill replica; the decode replica starts its step when the KV has
    # arrived and its CPU overhead (3 ms, in line with the GPU step: profile "none") has
    # passed; that step makes the second token.
    r = run(pools_scenario({"nodes": 1, "tp": 4}, {"same_nodes_as": "p", "tp": 4},
                           workload={"output_tokens": 2}, engine={"profile": "none"}))
    q = r.requests.iloc[0]
    decode = r.steps[r.steps["replica"] == 1]
    assert len(decode) == 1 and decode["decode_tokens"].iloc[0] == 1
    arrived = q["kv_transfer_start_s"] + q["kv_transfer_s"]
    assert decode["start_s"].iloc[0] == pytest.approx(arrived + 0.003, abs=3 * TICK)
    assert decode["end_s"].iloc[0] == q["finish_s"]
    # One inter-token gap: first token (prefill side) to second (decode side).
    assert r.summary["itl_mean_s"] == pytest.approx(q["finish_s"] - q["first_token_s"])
    assert q["tpot_s"] == pytest.approx(q["finish_s"] - q["first_token_s"])


def test_invalid_pools_exit_2_with_one_line(tmp_path, capsys):
    s = pools_scenario({"nodes": 1, "tp": 8}, {"nodes": 1, "tp": 8, "kv_dtype": "fp8"})
    path = _toml(tmp_path, s)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pools[1] (d).kv_dtype: fp8 differs" in err[0]
    assert "Traceback" not in err[0]
    s["pools"][1]["kv_dtype"] = "bf16"
    assert main(["validate", str(_toml(tmp_path, s))]) == 0
    out = capsys.readouterr().out
    assert "pool p (prefill)" in out and "pool d (decode)" in out


def test_a_front_end_streaming_from_the_decode_side_sees_the_first_token_with_the_kv():
    # Across the fabric, TP8 -> TP8 (440.5 us transfer), 4 requests of 4 tokens, one at a
    # time: with first_token = "decode" the first token reaches the client when the KV has
    # reached the decode instance (TTFT grows by the admission wait and the transfer), the
    # later tokens and the finish do not move, and TPOT loses that gap.
    kw = {"workload": {"num_requests": 4}, "engine": {"profile": "none"}}
    base = run(pools_scenario({"nodes": 1, "tp": 8}, {"nodes": 1, "tp": 8}, **kw))
    streamed = run(pools_scenario({"nodes": 1, "tp": 8, "first_token": "decode"},
                                  {"nodes": 1, "tp": 8}, **kw))
    a, b = base.requests, streamed.requests
    assert (a["finish_s"] == b["finish_s"]).all()
    assert (a["kv_transfer_s"] == b["kv_transfer_s"]).all()
    gap = a["decode_wait_s"] + a["kv_transfer_s"]
    assert gap.min() == pytest.approx(1000 * KV_8B / 8 / (50e9 * EFF) + 3.6e-6, abs=3 * TICK)
    assert np.allclose(b["ttft_s"], a["ttft_s"] + gap, atol=1e-12)
    assert (b["first_token_s"] == b["kv_transfer_start_s"] + b["kv_transfer_s"]).all()
    assert np.allclose(b["tpot_s"] * 3, a["tpot_s"] * 3 - gap, atol=1e-12)
    # the ITL of the second token starts at the KV's arrival, not at the prefill's end
    assert streamed.summary["itl_mean_s"] < base.summary["itl_mean_s"]
