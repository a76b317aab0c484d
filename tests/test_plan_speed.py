"""The planner's speed-ups change no number: every memoized path returns the bits of the
plain definition it stands for (GEMM form per shape, MLA projections per shape, routing
built once per argument set, routing tables shared by alike MoE stages), for any shape
(hypothesis), and a cache never mixes up two GPUs, parameter sets or routings."""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.calibration import forms, moe_forms
from simulator.cluster.pools import build_plan
from simulator.hardware.specs import load_gpu
from simulator.io.scenario import load_scenario
from simulator.model import moe_stage
from simulator.model.routing import DRAWS, Routing, placement, popularity, step_index

H100 = load_gpu("h100_sxm")
H200 = load_gpu("h200_sxm")
DIMS = st.integers(1, 20_000)


def _plain_absorbed(gpu, heads, tokens, pairs, kv_read, seqs, kv_dtype, gemm_dtype):
    """:func:`moe_forms.mla_absorbed_time` as written before memoization."""
    d = moe_forms.DSV3
    n, T = np.asarray(heads, float), np.asarray(tokens, float)
    c, r = d["kv_lora_rank"], d["qk_rope"]
    g = moe_forms._gemm
    proj = (g(gpu, gemm_dtype, T, d["q_lora_rank"] + c + r, d["hidden"])
            + g(gpu, gemm_dtype, T, n * (d["qk_nope"] + r), d["q_lora_rank"])
            + g(gpu, "bf16", T, n * c, d["qk_nope"]) + g(gpu, "bf16", T, n * d["v_head"], c)
            + g(gpu, gemm_dtype, T, d["hidden"], n * d["v_head"]))
    p = gpu.calibration.mla_for("decode", kv_dtype)
    nbytes = ((np.asarray(kv_read, float) + T) * (c + r) * moe_forms._kv_bytes(kv_dtype)
              + T * n * (c + r + c) * moe_forms.ACT)
    return proj + moe_forms._mla_core(gpu, p, n, T, np.asarray(pairs, float),
                                      np.asarray(seqs, float), nbytes, 2.0 * (c + r) + 2.0 * c)


@settings(max_examples=60, deadline=None)
@given(m=DIMS, n=DIMS, k=DIMS, dtype=st.sampled_from(["bf16", "fp8"]),
       quantize=st.booleans())
def test_memoized_gemm_equals_the_plain_form(m, n, k, dtype, quantize):
    p = H100.calibration.gemm_for(dtype)
    args = (p, H100.peak(dtype), H100.hbm_bandwidth_Bps, H100.sm_count,
            1 if dtype == "fp8" else 2, 1 if dtype == "fp8" else 2, quantize)
    plain = forms._gemm(m, n, k, *args)
    assert forms.gemm_time(m, n, k, *args) == plain  # first call fills the cache
    assert forms.gemm_time(float(m), np.int64(n), np.float64(k), *args) == plain  # a hit
    assert forms.gemm_time(np.asarray(m), n, np.asarray(k, float), *args) == plain  # 0-d


def test_gemm_cache_tells_parameter_sets_apart():
    p = H100.calibration.gemm_for("bf16")
    slow = replace(p, compute_eff=p.compute_eff / 2)
    args = (H100.peak("bf16"), H100.hbm_bandwidth_Bps, H100.sm_count, 2)
    fast_t = forms.gemm_time(4096, 7168, 7168, p, *args)
    slow_t = forms.gemm_time(4096, 7168, 7168, slow, *args)
    assert slow_t > fast_t
    assert slow_t == forms._gemm(4096, 7168, 7168, slow, *args, 2, False)


@settings(max_examples=60, deadline=None)
@given(heads=st.sampled_from([8, 16, 32, 64, 128]), tokens=st.integers(1, 4096),
       kv_per=st.integers(1, 8000), kv_dtype=st.sampled_from(["bf16", "fp8"]),
       gemm_dtype=st.sampled_from(["bf16", "fp8_block"]),
       gpu=st.sampled_from([H100, H200]))
def test_memoized_mla_absorbed_equals_the_plain_form(heads, tokens, kv_per, kv_dtype,
                                                     gemm_dtype, gpu):
    kv = np.array([tokens * kv_per, tokens * kv_per + 17.0])
    plain = _plain_absorbed(gpu, heads, tokens, kv, kv - tokens, tokens, kv_dtype,
                            gemm_dtype)
    for _ in range(2):  # a miss, then a hit
        got = moe_forms.mla_absorbed_time(gpu, heads, tokens, kv, kv - tokens, tokens,
                                          kv_dtype, gemm_dtype)
        np.testing.assert_array_equal(got, plain)


def test_mla_projection_cache_keeps_gpus_apart():
    """Same shape on two GPUs (different peaks and calibrations): two entries, each the
    plain value of its GPU; a GPU dropped and rebuilt at the same address cannot hit an
    entry of the old one, which the cache keeps alive."""
    args = (128, 64, np.array([64 * 900.0]), np.array([64 * 899.0]), 64, "fp8", "fp8_block")
    a = moe_forms.mla_absorbed_time(H100, *args)
    b = moe_forms.mla_absorbed_time(H200, *args)
    assert not np.array_equal(a, b)
    np.testing.assert_array_equal(b, _plain_absorbed(H200, *args))
    keys = [k for k, (g, _) in moe_forms._ABSORBED_PROJ.items() if k[1:3] == ("fp8_block",
                                                                              64.0)]
    assert {id(H100), id(H200)} <= {k[0] for k in keys}
    assert all(g is not None and id(g) == k[0] for k, (g, _) in
               moe_forms._ABSORBED_PROJ.items())


@pytest.mark.parametrize("dist, ranks, redundant", [("uniform", 8, 0), ("zipf", 8, 8),
                                                    ("zipf", 16, 0), ("zipf", 4, 4)])
def test_memoized_routing_equals_a_fresh_build(dist, ranks, redundant):
    p = popularity(256, dist, 1.2, seed=3)
    r = Routing.build(p, ranks, redundant, 8, seed=5)
    # The plain definition: the draws of the run's seed and the greedy placement.
    z = np.random.default_rng([5, 14]).standard_normal((DRAWS, 256))
    np.testing.assert_array_equal(r.z, z)
    np.testing.assert_array_equal(r.share, placement(p, ranks, redundant))
    np.testing.assert_array_equal(r.p, p)
    assert r.top_k == 8
    again = Routing.build(p.copy(), ranks, redundant, 8, seed=5)
    assert again is r  # one instance per argument set: its cached tables are shared
    for a in (r.z, r.share, r.p):
        assert not a.flags.writeable  # shared, so nobody may write into it
    assert Routing.build(p, ranks, redundant, 8, seed=6) is not r
    other = Routing.build(popularity(256, dist, 1.2, seed=4), ranks, redundant, 8, seed=5)
    assert dist == "uniform" or not np.array_equal(other.share @ other.p, r.share @ r.p)


def _moe_stage(routing: dict | None = None, **parallel):
    model = {"name": "qwen3-30b-a3b", **({"routing": routing} if routing else {})}
    s = load_scenario({"model": model, "cluster": {"topology": "dgx-h100"},
                       "parallel": {"tp": 8, "ep": 8, **parallel},
                       "workload": {"rate_per_s": 1.0, "num_requests": 4}})
    return s, build_plan(s).replicas[0].stages[0]


@pytest.mark.parametrize("parallel", [{"attention_dp": True}, {"ep": 1}])
def test_shared_routing_tables_equal_unshared_ones(parallel):
    """Two stages of one routing share one table set; rows filled in pieces from both
    stages equal the rows of a fresh, unshared stage filled at once."""
    zipf = {"distribution": "zipf", "skew": 1.2}
    s, c = _moe_stage(zipf, **parallel)
    twin = copy.copy(c)
    assert moe_stage._shared_tables(twin) is c._tables
    idx = step_index(np.arange(5000, 5300))
    for n, mode in ((64, "low_latency"), (3000, "normal")):
        c.table(n, mode, idx[:40])
        twin.table(n, mode, idx[40:])
    pieces = {k: (t.expert_s.copy(), t.a2a_s.copy(), t.imbalance.copy())
              for k, t in c._tables.items()}
    moe_stage._SHARED.clear()
    fresh = build_plan(s).replicas[0].stages[0]
    assert fresh._tables is not c._tables and not fresh._tables
    for (n, mode), (e, a, i) in pieces.items():
        tab = fresh.table(n, mode)  # every row at once
        rows = np.unique(idx)
        np.testing.assert_array_equal(tab.expert_s[rows], e[rows])
        np.testing.assert_array_equal(tab.a2a_s[rows], a[rows])
        np.testing.assert_array_equal(tab.imbalance[rows], i[rows])
    _, other = _moe_stage({"distribution": "zipf", "skew": 0.5}, **parallel)
    assert other._tables is not fresh._tables  # another routing: its own tables
