"""Engine profiles, CUDA-graph padding, CPU overlap and the token delay."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

import simulator
from simulator.default_scenario import DEFAULT_SCENARIO
from simulator.errors import ScenarioError
from simulator.hardware.specs import load_gpu, load_node
from simulator.io import schema
from simulator.io.profiles import (
    PROFILES,
    capture_sizes,
    sglang_sizes,
    trtllm_sizes,
    vllm_v1_sizes,
)
from simulator.io.schema import EngineKeys
from simulator.io.writers import write_result
from simulator.model.cost import StageCost
from simulator.model.spec import load_model
from simulator.parallel.collective import allreduce
from simulator.topology.graph import Paths, build_graph

H100 = load_gpu("h100_sxm")


def _cost(tp=2, model="llama-3.1-8b", **kw) -> StageCost:
    m = load_model(model)
    paths = Paths(build_graph(load_node("dgx-h100"), 1))
    ar = allreduce(paths, tuple(f"gpu{i}" for i in range(tp)), H100.calibration.collectives,
                   True, True)
    return StageCost(m, H100, tp, m.layers, True, True, "bf16", "bf16", ar, **kw)


def _scenario(**engine):
    return {"name": "p", "model": {"name": "llama-3.1-8b"}, "engine": engine,
            "workload": {"arrival": "constant", "rate_per_s": 2.0, "num_requests": 6,
                         "prompt_tokens": 300, "output_tokens": 40},
            "output": {"steps": False}}


# -- capture sizes, by hand ------------------------------------------------------------
def test_capture_sizes_of_each_engine_by_hand():
    v1 = vllm_v1_sizes(1024)  # min(2 * 1024, 512) = 512
    assert v1[:6] == (1, 2, 4, 8, 16, 24) and v1[-4:] == (464, 480, 496, 512)
    assert 248 in v1 and 256 in v1 and 264 not in v1 and 272 in v1
    assert len(v1) == 3 + 31 + 17  # 1,2,4; 8..248 by 8; 256..512 by 16
    assert vllm_v1_sizes(20) == (1, 2, 4, 8, 16, 24, 32, 40)  # up to 2 x 20
    v06, mixed = capture_sizes("vllm-v0.6", 256)
    assert v06 == (1, 2, 4, *range(8, 257, 8)) and not mixed
    assert capture_sizes("vllm-v0.6", 20)[0] == (1, 2, 4, 8, 16, 24)  # 20 -> 24
    assert capture_sizes("vllm-v1", 1024) == (v1, True)
    assert sglang_sizes(40) == (1, 2, 4, 8, 12, 16, 24, 32, 40)
    assert capture_sizes("sglang", 256, tp=2)[0][-3:] == (240, 248, 256)
    assert capture_sizes("sglang", 256, tp=8)[0][-4:] == (464, 480, 496, 512)
    assert trtllm_sizes(128) == (1, 2, 4, *range(8, 129, 8))
    assert trtllm_sizes(300) == (1, 2, 4, *range(8, 129, 8), 256, 300)
    assert capture_sizes("none", 256) == ((), False)
    assert capture_sizes("trtllm", 256, max_batch=16) == ((1, 2, 4, 8, 16), False)


# -- padding in the step cost ------------------------------------------------------------
def test_decode_batches_pad_to_the_next_captured_size():
    sizes = (1, 2, 4, 8, 16)
    cost = _cost(graph_sizes=sizes, layer_launch_s=1e-3)
    assert [cost.graph_tokens(n, True)[0] for n in (1, 2, 3, 4, 5, 8, 9, 16)] == \
        [1, 2, 4, 4, 8, 8, 16, 16]
    assert cost.graph_tokens(5, True)[1] == 0.0  # graphed: no launch floor
    assert cost.graph_tokens(17, True) == (17, 32 * 1e-3)  # eager beyond the largest
    assert cost.graph_tokens(5, False) == (5, 32 * 1e-3)  # prefill: eager (vLLM 0.6)
    mixed = _cost(graph_sizes=sizes, graph_mixed=True)
    assert mixed.graph_tokens(5, False) == (8, 0.0)


def test_padding_prices_dense_kernels_and_all_reduces_at_the_padded_size():
    plain, graphed = _cost(), _cost(graph_sizes=(1, 2, 4, 8, 16))
    n, kv = 5, 5 * 700
    c0, m0 = plain.step(n, 0.0, 0, kv, n)
    c1, m1 = graphed.step(n, 0.0, 0, kv, n)
    layers, h2 = plain.layers, plain.hidden_bytes
    # The GEMMs, elementwise kernels and embedding run 8 rows instead of 5; attention and
    # the LM head see the 5 real sequences.
    dense = layers * (plain.dense_layer_time(8) - plain.dense_layer_time(5))
    embed = (8 - 5) * h2 / plain.elem_bw
    assert c1 - c0 == pytest.approx(dense + embed, rel=1e-9)
    ar = 2 * layers * (plain.allreduce.time(8 * h2) - plain.allreduce.time(5 * h2))
    assert m1 - m0 == pytest.approx(ar, rel=1e-9)
    assert graphed.step(8, 0.0, 0, kv, 8)[0] > c1  # 8 real sequences read more KV
    assert graphed.step(4, 0.0, 0, kv, 4) == plain.step(4, 0.0, 0, kv, 4)  # captured size


@pytest.mark.parametrize("n", [3, 5, 16, 17, 300])
def test_decode_run_and_decode_steps_stay_bit_identical_to_step(n):
    cost = _cost(graph_sizes=(1, 2, 4, 8, 16), layer_launch_s=2e-4, cpu_floor_s=1e-3)
    kv0 = n * 500
    run, comm_run = cost.decode_run(n, kv0, 20)
    vec, comm_vec = cost.decode_steps(n, np.arange(kv0 + n, kv0 + 20 * n + 1, n))
    for j in range(20):
        c, m = cost.step(n, 0.0, 0, kv0 + (j + 1) * n, n)
        assert run[j] == c and vec[j] == c
        assert comm_run == m and comm_vec == m


def test_cpu_overlap_floors_the_step_at_the_cpu_time():
    plain, overlapped = _cost(), _cost(cpu_floor_s=0.03)
    c, m = plain.step(1, 0.0, 0, 100, 1)
    assert c < 0.03
    # The floor covers the whole GPU step (compute and the all-reduces), as the CPU's work
    # for the next step overlaps all of it: compute + comm = 0.03, comm unchanged.
    assert m > 0 and overlapped.step(1, 0.0, 0, 100, 1) == (0.03 - m, m)
    big = plain.step(8192, 8192 * 8193 / 2, 0, 0, 1)
    assert big[0] > 0.03
    assert overlapped.step(8192, 8192 * 8193 / 2, 0, 0, 1) == big  # GPU-bound: hidden


# -- profiles in the scenario ----------------------------------------------------------
def test_schema_allows_every_profile_and_rule():
    fields = {f.name: f.metadata for f in dataclasses.fields(schema.EngineKeys)}
    assert fields["profile"]["choices"] is PROFILES
    assert set(fields["cuda_graphs"]["choices"]) == {"none", *(p.get("cuda_graphs", "none")
                                                             for p in PROFILES.values())}


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_a_profile_changes_only_what_it_declares(name):
    base = simulator.load_scenario(_scenario(profile="none")).engine
    eng = simulator.load_scenario(_scenario(profile=name)).engine
    changed = {f.name for f in dataclasses.fields(EngineKeys)
               if getattr(eng, f.name) != getattr(base, f.name)}
    assert changed <= set(PROFILES[name]) | {"profile"}
    for key, value in PROFILES[name].items():
        assert getattr(eng, key) == value
    # Explicit keys override the profile.
    eng = simulator.load_scenario(_scenario(profile=name, max_num_seqs=7,
                                            cuda_graphs="none", cpu_overlap=False)).engine
    assert (eng.max_num_seqs, eng.cuda_graphs, eng.cpu_overlap) == (7, "none", False)


def test_profile_none_keeps_the_engine_keys_defaults():
    eng = simulator.load_scenario(_scenario(profile="none")).engine
    assert eng.profile == "none" and eng.cuda_graphs == "none" and not eng.cpu_overlap
    assert eng.token_delay_s == 0.0 and eng.step_overhead_s == 0.003
    assert eng.max_num_seqs == 256 and eng.max_num_batched_tokens == 8192
    assert eng.scheduler == "vllm"
    defaults = {f.name: f.default for f in dataclasses.fields(EngineKeys)}
    assert dataclasses.asdict(eng) == defaults | {"profile": "none"}


def test_a_scenario_without_profile_gets_vllm_v1():
    eng = simulator.load_scenario(_scenario()).engine
    assert eng.profile == "vllm-v1"
    for key, value in PROFILES["vllm-v1"].items():
        assert getattr(eng, key) == value
    # Explicit keys still win over the default profile.
    eng = simulator.load_scenario(_scenario(max_num_seqs=7, cpu_overlap=False)).engine
    assert (eng.profile, eng.max_num_seqs, eng.cpu_overlap) == ("vllm-v1", 7, False)


def test_unknown_profile_is_one_clear_error():
    with pytest.raises(ScenarioError, match=r"engine.profile: 'vllm-v2' is not allowed"):
        simulator.load_scenario(_scenario(profile="vllm-v2"))
    # A name close to none lists every allowed one, "none" included.
    with pytest.raises(ScenarioError, match=r"engine.profile: 'tgi' is not allowed \(allowed: "
                       r"vllm-v0.6, vllm-v1, sglang, trtllm, none\)"):
        simulator.load_scenario(_scenario(profile="tgi"))


def test_profile_survives_a_round_trip_of_the_resolved_scenario():
    sc = simulator.load_scenario(_scenario(profile="vllm-v1"))
    assert simulator.load_scenario(sc) == sc


# -- the engine around the steps -----------------------------------------------------------
def test_token_delay_shifts_ttft_and_e2e_not_tpot():
    a = simulator.run(_scenario()).requests
    b = simulator.run(_scenario(token_delay_s=0.05)).requests
    assert np.allclose(b["ttft_s"] - a["ttft_s"], 0.05)
    assert np.allclose(b["e2e_s"] - a["e2e_s"], 0.05)
    assert np.allclose(b["tpot_s"], a["tpot_s"])


def test_cpu_overlap_hides_the_step_overhead_behind_the_gpu_step():
    # One request alone: each decode step takes GPU time + 3 ms without overlap, and
    # max(3 ms, GPU compute + communication) with it.
    one = {"arrival": "constant", "rate_per_s": 1.0, "num_requests": 1,
           "prompt_tokens": 64, "output_tokens": 33}
    sc = _scenario(profile="none", step_overhead_s=0.003)  # overlap off, then on
    sc["workload"] = one
    serial = simulator.run(sc).requests.iloc[0]
    sc["engine"]["cpu_overlap"] = True
    hidden = simulator.run(sc).requests.iloc[0]
    cost = simulator.build_plan(simulator.load_scenario(sc)).replicas[0].stages[0]
    c, m = cost.step(1, 0.0, 0, 64 + 16, 1)
    assert serial["tpot_s"] - hidden["tpot_s"] == pytest.approx(
        0.003 + c + m - max(c + m, 0.003), abs=2e-5)


def test_default_profile_switch_applies_to_scenarios_that_name_none(monkeypatch):
    from simulator.io import profiles
    monkeypatch.setattr(profiles, "DEFAULT_PROFILE", "sglang")
    eng = simulator.load_scenario(_scenario()).engine
    assert eng.profile == "sglang" and eng.cuda_graphs == "sglang"
    eng = simulator.load_scenario(_scenario(profile="vllm-v1")).engine
    assert eng.profile == "vllm-v1" and eng.cpu_overlap and eng.max_num_seqs == 1024


# -- the default profile: outputs ----------------------------------------------------------
def _files(sc: dict, out) -> dict[str, bytes]:
    """Every output file of a run of ``sc`` (summary.json without its wall time)."""
    res = simulator.run(sc)
    res.summary.pop("wall_time_s")
    write_result(res, out)
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def test_no_profile_writes_the_same_files_as_vllm_v1(tmp_path):
    sc = _scenario()
    sc["workload"] = {**sc["workload"], "rate_per_s": 40.0, "num_requests": 40}
    sc["output"] = {"steps": True, "trace_gzip": False}
    implicit = _files(sc, tmp_path / "implicit")
    sc["engine"] = {"profile": "vllm-v1"}
    named = _files(sc, tmp_path / "named")
    assert {"requests.csv", "steps.csv", "trace.json", "summary.json",
            "scenario.toml"} <= set(implicit)
    assert implicit == named


def test_the_default_moves_from_none_by_exactly_what_vllm_v1_declares():
    # The default scenario (its first 400 requests) with no profile, and with "none" plus
    # the vllm-v1 keys it does not set itself (it sets max_num_seqs 256 and the 8192
    # budget): the same run, step for step.
    base = {**DEFAULT_SCENARIO, "workload": {**DEFAULT_SCENARIO["workload"],
                                             "num_requests": 400}}
    default = simulator.run(base)
    keys = {**PROFILES["vllm-v1"], **base["engine"], "profile": "none"}
    spelled = simulator.run({**base, "engine": keys})
    pd.testing.assert_frame_equal(default.requests, spelled.requests)
    pd.testing.assert_frame_equal(default.steps, spelled.steps)
    none = simulator.run({**base, "engine": {**base["engine"], "profile": "none"}})
    # Async scheduling hides the 3 ms CPU step behind every GPU step longer than it (a
    # 70B TP4 stage: all of them), so each token comes sooner; padding adds a little back.
    assert default.summary["tpot_mean_s"] < none.summary["tpot_mean_s"] - 0.002
    assert (default.steps["compute_s"] > 0.003).all()


def test_cpu_overlap_floors_moe_steps_too():
    """MoE stages carry the same CPU floor as dense ones: with async scheduling a decode
    step of a small batch takes max(CPU time, compute + all-reduce), on every path."""
    import tomllib

    from simulator.paths import ROOT as REPO

    sc = tomllib.loads((REPO / "workloads" / "moe-qwen3-30b-1gpu.toml").read_text())
    sc["parallel"] = {"tp": 2}
    sc["engine"].update(cpu_overlap=True, step_overhead_s=0.05)
    stage = simulator.build_plan(simulator.load_scenario(sc)).replicas[0].stages[0]
    c, m = stage.step(2, 0.0, 0, 2000, 2)
    floor = 0.05 + 2 * 56e-6  # vllm-v1's host: the fixed part and 56 us per sequence
    assert m > 0 and c + m == pytest.approx(floor, rel=1e-12)
    run, comm = stage.decode_run(2, 2000, 3)
    assert comm == m and all(x + comm == pytest.approx(floor, rel=1e-12) for x in run)
    sc["engine"]["cpu_overlap"] = False
    plain = simulator.build_plan(simulator.load_scenario(sc)).replicas[0].stages[0]
    c0, m0 = plain.step(2, 0.0, 0, 2000, 2)
    assert m0 == m and c0 + m0 < 0.05  # below the floor without it


def test_vllm_v1_batch_limits_follow_the_gpu_as_vllm_does():
    """vLLM V1 (arg_utils.get_batch_defaults, API server): 8192 tokens and 1024 sequences
    on GPUs with >= 70 GiB other than A100; 2048 and 256 on A100 and smaller GPUs."""
    from simulator.io.profiles import vllm_v1_batch_limits

    def limits(**cluster):
        e = simulator.load_scenario({**_scenario(), "cluster": cluster}).engine
        return e.max_num_batched_tokens, e.max_num_seqs

    assert limits(topology="dgx-h100") == limits(topology="hgx-h200") == (8192, 1024)
    assert limits(topology="dgx-a100") == (2048, 256)
    assert vllm_v1_batch_limits("l40s", 48 * 2**30) == {"max_num_batched_tokens": 2048,
                                                        "max_num_seqs": 256}
    # Explicit keys win; other profiles keep their own values on any GPU.
    e = simulator.load_scenario({**_scenario(max_num_seqs=512),
                                 "cluster": {"topology": "dgx-a100"}}).engine
    assert (e.max_num_batched_tokens, e.max_num_seqs) == (2048, 512)
    e = simulator.load_scenario({**_scenario(profile="sglang"),
                                 "cluster": {"topology": "dgx-a100"}}).engine
    assert e.max_num_batched_tokens == 8192
    # A pool on other nodes gets its own GPU's limits as overrides; a round trip keeps them.
    from simulator.paths import ROOT

    s = simulator.load_scenario(ROOT / "workloads" / "disagg-hetero-h100-a100.toml")
    pools = {p.name: p.engine for p in s.pools}
    assert (s.engine.max_num_batched_tokens, s.engine.max_num_seqs) == (8192, 1024)
    assert pools["h100"] is None
    assert pools["a100"] == {"max_num_batched_tokens": 2048, "max_num_seqs": 256}
    assert {p.name: p.engine for p in simulator.load_scenario(s).pools} == pools
