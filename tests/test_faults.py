"""Failures: replicas go down with their GPUs, nodes or links; requests are never lost."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import DATA, toy_scenario
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import simulator
from simulator.cli import main

STATUSES = {"completed", "rejected", "dropped", "failed_after_retries"}


def _accounted(res: simulator.Result, n: int) -> None:
    req = res.requests
    assert len(req) == n and sorted(req["request_id"]) == list(range(n))
    assert set(req["status"]) <= STATUSES
    not_done = req[req["status"] != "completed"]
    assert (not_done["reason"] != "").all()


def _two_nodes(placement: str, faults: list, **recovery) -> dict:
    sc = toy_scenario(cluster={"nodes": 2}, parallel={"tp": 1, "dp": 2, "placement": placement},
                      router={"policy": "least_outstanding"},
                      workload={"arrival": "poisson", "rate_per_s": 20.0, "num_requests": 400,
                                "prompt_tokens": 300, "output_tokens": 600},
                      recovery={"restart_s": 1.0, **recovery})
    sc["faults"] = faults
    return sc


def test_node_failure_spread_keeps_serving_packed_stops():
    fault = [{"at_s": 5.0, "target": "node:0"}]  # permanent
    spread = simulator.run(_two_nodes("spread", fault))
    packed = simulator.run(_two_nodes("packed", fault))
    for res in (spread, packed):
        _accounted(res, 400)
    # Spread: one replica per node; the survivor serves everything, the rerouted included.
    assert (spread.requests["status"] == "completed").all()
    assert (spread.requests.loc[spread.requests["finish_s"] > 5.1, "replica"] == 1).all()
    span = spread.summary["simulated_time_s"]
    assert spread.summary["availability_min"] == pytest.approx(5.0 / span, rel=1e-6)
    # Packed: both replicas on node 0; nothing completes after the failure.
    req = packed.requests
    assert not ((req["status"] == "completed") & (req["finish_s"] > 5.0)).any()
    assert (req.loc[req["arrival_s"] > 5.0, "status"] == "dropped").all()
    assert packed.summary["availability_mean"] < 1.0
    assert packed.summary["requests_dropped"] > 300


def test_temporary_failure_reroutes_then_restarts_after_repair_and_reload():
    sc = _two_nodes("spread", [{"at_s": 5.0, "target": "gpu:0", "duration_s": 2.0}],
                    restart_s=3.0)
    res = simulator.run(sc)
    _accounted(res, 400)
    req = res.requests
    assert (req["status"] == "completed").all()
    assert req["retries"].sum() > 0 and res.summary["retries_total"] == req["retries"].sum()
    # Down from 5 s to repair (7 s) plus reload (3 s): no new work lands on replica 0.
    on0 = req[req["replica"] == 0]
    assert not on0["first_scheduled_s"].between(5.0, 10.0, inclusive="neither").any()
    assert (on0["first_scheduled_s"] > 10.0).any()  # and it serves again afterwards
    span = res.summary["simulated_time_s"]
    assert res.summary["availability_min"] == pytest.approx(1 - 5.0 / span, rel=1e-6)


def test_a_step_cut_short_by_a_failure_is_not_recorded():
    calm = simulator.run(_two_nodes("spread", []))
    st = calm.steps
    # A prefill step of replica 0 after 4 s; the same run with a failure in its middle.
    step = st[(st["replica"] == 0) & (st["prefill_tokens"] > 0) & (st["start_s"] > 4.0)].iloc[0]
    at = float(step["start_s"] + step["end_s"]) / 2
    res = simulator.run(_two_nodes("spread", [{"at_s": at, "target": "gpu:0",
                                               "duration_s": 1.0}], restart_s=1.0))
    st0 = res.steps[res.steps["replica"] == 0]
    assert ((st0["end_s"] <= at) | (st0["start_s"] >= at + 2.0)).all()
    assert (st0["start_s"] >= at + 2.0).any()  # it serves again after repair and reload
    before = st[(st["replica"] == 0) & (st["end_s"] <= at)]
    assert len(st0[st0["end_s"] <= at]) == len(before)  # everything before is kept


def test_drop_and_retry_limits_give_their_statuses():
    fault = [{"at_s": 5.0, "target": "gpu:0"}]
    dropped = simulator.run(_two_nodes("spread", fault, retry="drop"))
    _accounted(dropped, 400)
    assert (dropped.requests["status"] == "dropped").sum() > 0
    assert dropped.requests.loc[dropped.requests["status"] == "dropped", "reason"] \
        .str.contains("gpu:0").all()
    failed = simulator.run(_two_nodes("spread", fault, max_retries=0))
    assert (failed.requests["status"] == "failed_after_retries").sum() > 0
    assert failed.summary["requests_failed"] == (failed.requests["status"]
                                                 == "failed_after_retries").sum()


def _link_scenario(tmp_path, gpus_per_node: int, tp: int) -> dict:
    node = (DATA / "toy_node.toml").read_text().replace("gpus_per_node = 2",
                                                       f"gpus_per_node = {gpus_per_node}")
    node = node.replace('gpu = "toy_gpu.toml"', f'gpu = "{DATA / "toy_gpu.toml"}"')
    (tmp_path / "node.toml").write_text(node)
    sc = toy_scenario(cluster={"topology": str(tmp_path / "node.toml"), "nodes": 2},
                      parallel={"tp": tp, "pp": 2},
                      engine={"max_inflight_microbatches": 1},
                      workload={"arrival": "poisson", "rate_per_s": 20.0, "num_requests": 200,
                                "prompt_tokens": 300, "output_tokens": 60})
    sc["faults"] = [{"at_s": 3.0, "target": "link:nic0-switch"}]
    return sc


def test_link_failure_with_a_redundant_path_keeps_the_replica_up(tmp_path):
    # Stage 0 on node 0 (gpu0, gpu1), stage 1 on node 1: gpu0's hand-off detours over
    # NVLink to gpu1 and its NIC.
    res = simulator.run(_link_scenario(tmp_path, gpus_per_node=2, tp=2))
    _accounted(res, 200)
    assert (res.requests["status"] == "completed").all()
    assert res.summary["availability_min"] == 1.0


def test_link_failure_without_a_redundant_path_takes_the_replica_down(tmp_path):
    # One GPU per node: gpu0 reaches node 1 only through nic0.
    res = simulator.run(_link_scenario(tmp_path, gpus_per_node=1, tp=1))
    _accounted(res, 200)
    req = res.requests
    assert (req.loc[req["arrival_s"] > 3.0, "status"] == "dropped").all()
    assert res.summary["availability_min"] < 1.0


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 10_000), mtbf_s=st.floats(2.0, 60.0),
       repair_s=st.floats(0.1, 10.0), restart_s=st.floats(0.0, 5.0),
       retry=st.sampled_from(["reroute", "drop"]), retries=st.integers(0, 3),
       node_faults=st.booleans())
def test_every_request_is_accounted_for_under_random_faults(seed, mtbf_s, repair_s, restart_s,
                                                              retry, retries, node_faults):
    rnd = {"repair_s": repair_s, ("node_mtbf_h" if node_faults else "gpu_mtbf_h"):
           mtbf_s / 3600 * (2 if node_faults else 4)}
    sc = toy_scenario(seed=seed, cluster={"nodes": 2}, parallel={"dp": 4},
                      workload={"arrival": "poisson", "rate_per_s": 30.0, "num_requests": 150,
                                "prompt_tokens": {"dist": "uniform", "min": 10, "max": 500},
                                "output_tokens": {"dist": "uniform", "min": 1, "max": 100}},
                      recovery={"retry": retry, "max_retries": retries,
                                "restart_s": restart_s})
    sc["faults"] = {"random": rnd}
    res = simulator.run(sc)
    _accounted(res, 150)
    req = res.requests
    done = req[req["status"] == "completed"]
    assert (done["finish_s"] >= done["first_token_s"]).all()
    if retry == "drop":
        assert (req["status"] != "failed_after_retries").all()
    assert 0.0 <= res.summary["availability_min"] <= res.summary["availability_mean"] <= 1.0
    assert np.isfinite(res.summary["simulated_time_s"])


def test_unknown_fault_targets_are_refused(tmp_path, capsys):
    import tomli_w

    sc = toy_scenario()
    sc["faults"] = [{"at_s": 1.0, "target": "node:7"}]
    path = tmp_path / "s.toml"
    path.write_text(tomli_w.dumps(sc))
    assert main(["run", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "faults: target 'node:7': no such node (0..0)" in err
    sc["faults"] = [{"at_s": 1.0, "target": "link:gpu0-gpu1"}]
    path.write_text(tomli_w.dumps(sc))
    assert main(["run", str(path), "--out", str(tmp_path / "o")]) == 2
    assert "no link between 'gpu0' and 'gpu1'" in capsys.readouterr().err
    assert main(["validate", str(path)]) == 2  # validate checks the targets too
    assert "no link between" in capsys.readouterr().err


def test_a_detour_is_priced_from_the_fault_on(toy):
    """TP2 on the toy node: when gpu0's NVLink fails, the ring detours over PCIe (10 GB/s
    instead of 100 GB/s): the replica stays up and its all-reduces get slower."""
    sc = toy(parallel={"tp": 2}, engine={"custom_allreduce": False},
             workload={"arrival": "poisson", "rate_per_s": 20.0, "num_requests": 200,
                       "prompt_tokens": 2000, "output_tokens": 20})
    sc["faults"] = [{"at_s": 4.0, "target": "link:gpu0-nvswitch0", "duration_s": 3.0}]
    res = simulator.run(sc)
    _accounted(res, 200)
    assert (res.requests["status"] == "completed").all()
    assert res.summary["availability_min"] == 1.0
    steps = res.steps[res.steps["prefill_tokens"] == 2000]
    before = steps[steps["end_s"] < 4.0]["comm_s"].median()
    during = steps[steps["start_s"].between(4.0, 7.0)]["comm_s"].median()
    after = steps[steps["start_s"] > 7.0]["comm_s"].median()
    assert during > 3 * before
    assert after == pytest.approx(before)


def test_inter_token_gaps_across_a_failure_run_from_the_last_token():
    # Three requests decoding together when the only replica's GPU fails; after repair and
    # reload they re-prefill elsewhere in time and finish. Every gap between consecutive
    # tokens is counted once, so the gaps of each request sum to its decode span:
    # itl_mean * sum(output - 1) = sum(finish - first_token).
    sc = toy_scenario(workload={"arrival": "constant", "rate_per_s": 100.0, "num_requests": 3,
                                "prompt_tokens": 100, "output_tokens": 400})
    calm = simulator.run(sc)
    req = calm.requests
    at = float(req["first_token_s"].max() + req["finish_s"].min()) / 2  # mid-decode
    sc["faults"] = [{"at_s": at, "target": "gpu:0", "duration_s": 0.5}]
    sc["recovery"] = {"restart_s": 0.25}
    res = simulator.run(sc)
    req = res.requests
    assert (req["status"] == "completed").all() and (req["retries"] == 1).all()
    span = float((req["finish_s"] - req["first_token_s"]).sum())
    assert res.summary["itl_mean_s"] * float((req["output_tokens"] - 1).sum()) == \
        pytest.approx(span, rel=1e-9)
    assert (req["finish_s"] > at + 0.75).all()  # the pause is inside those gaps
    # The decode steps that ended before the failure happened (one event advanced them
    # all): they are recorded, as in the calm run, and their tokens were not generated twice.
    before = calm.steps[calm.steps["end_s"] <= at]
    assert len(res.steps[res.steps["end_s"] <= at]) == len(before) > 10
    # Tokens: 3 first tokens, the decodes before the failure, 3 first tokens again after
    # the re-prefills, and the decodes after: nothing twice, nothing missing.
    after = res.steps[res.steps["start_s"] >= at]["decode_tokens"].sum()
    assert 3 + before["decode_tokens"].sum() + 3 + after == 3 * 400


def test_clients_give_up_on_requests_pending_longer_than_the_timeout():
    # Both replicas on node 0, down from 5 s to 7 s, back after a 3 s reload at 10 s.
    sc = _two_nodes("packed", [{"at_s": 5.0, "target": "node:0", "duration_s": 2.0}],
                    restart_s=3.0, pending_timeout_s=2.0)
    res = simulator.run(sc)
    _accounted(res, 400)
    req = res.requests
    gave_up = req[req["reason"].str.contains("pending_timeout_s")]
    # Arrivals from 5 s to 8 s wait more than 2 s: dropped exactly 2 s after they queued
    # (in-flight requests queued at the failure, 5 s).
    queued = np.maximum(gave_up["arrival_s"], 5.0)
    assert len(gave_up) > 30 and (gave_up["status"] == "dropped").all()
    assert np.allclose(gave_up["finish_s"], queued + 2.0, atol=1e-6)
    assert (gave_up["arrival_s"] < 8.0 + 1e-6).all()
    # Arrivals after 8 s wait less than 2 s for the restart at 10 s and are served.
    late = req[(req["arrival_s"] > 8.0) & (req["arrival_s"] < 10.0)]
    assert len(late) > 10 and (late["status"] == "completed").all()
    assert (late["first_scheduled_s"] >= 10.0 - 1e-6).all()
    # Without the timeout nobody gives up.
    sc["recovery"].pop("pending_timeout_s")
    assert (simulator.run(sc).requests["status"] == "completed").all()
    with pytest.raises(simulator.ScenarioError, match="recovery.pending_timeout_s: must be > 0"):
        simulator.load_scenario({**sc, "recovery": {"pending_timeout_s": 0}})
