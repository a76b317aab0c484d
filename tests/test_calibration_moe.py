"""The MoE cost families: accuracy on the measured H100 rows, roofline bounds, monotonicity,
load imbalance, all-to-all bytes by hand, and ``calibrate check`` listing the families."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from simulator.calibration import check, moe_check, moe_forms
from simulator.calibration.params import Calibration
from simulator.cli import main
from simulator.hardware.specs import load_gpu
from simulator.paths import ROOT

DATA = ROOT / "simulator" / "calibration" / "data" / "h100_sxm"
H100 = load_gpu("h100_sxm")
NEW = ("moe", "mla_context", "mla_generation", "alltoall")
#: Stated tolerances (median |error| %, on a fixed 3,000-row subsample; full data in
#: docs/cost-model.md: moe 8.2, mla_context 5.7, mla_generation 4.6, alltoall 12.7).
TOLERANCE = {"moe": 9.0, "mla_context": 7.0, "mla_generation": 5.5, "alltoall": 14.0}
NVLINK = 450e9


@pytest.fixture(scope="module")
def sample() -> dict[str, pd.DataFrame]:
    data = {f: check.read_family(DATA, f) for f in NEW}
    return {f: df if len(df) <= 3000 else df.sample(3000, random_state=0)
            for f, df in data.items()}


@pytest.fixture(scope="module")
def report(sample) -> pd.DataFrame:
    return check.check(H100, sample)


def test_median_error_per_family_within_its_bound(report):
    table = check.summarize(report)
    for family, bound in TOLERANCE.items():
        assert table.loc[family, "median_abs_error_pct"] <= bound, table.loc[family]


@pytest.fixture(scope="module")
def full() -> dict[str, pd.DataFrame]:
    return {f: check.read_family(DATA, f) for f in NEW}


def test_moe_never_beats_its_roofline_on_any_measured_shape(full):
    df = full["moe"]
    t = check.predict(H100, "moe", df)
    inp = moe_check.moe_inputs(df)
    h = df["hidden_size"].to_numpy(float)
    inter = df["inter_size"].to_numpy(float) / df["moe_tp_size"].to_numpy(float)
    shape = zip(*(df[c] for c in ("hidden_size", "inter_size", "num_experts", "topk")),
                strict=True)
    n1 = np.array([1.0 if s in moe_check.NON_GATED else 2.0 for s in shape]) * inter
    a = inp["a"].to_numpy(float)
    flops = 2 * inp["rows"] * (n1 + inter) * h
    nbytes = (inp["active"] * (n1 + inter) * h * inp["w"]
              + inp["rows"] * (h * a + 2 * n1 * 2 + 2 * inter * a + 2 * h * 2))
    peak = np.where(inp["peak"] == "fp8", H100.peak("fp8"), H100.peak("bf16"))
    roof = np.maximum(flops / peak, nbytes / H100.hbm_bandwidth_Bps).to_numpy()
    assert (t >= roof).all() and (roof > 0).mean() > 0.9
    # The same bound as the public companion on a few rows.
    for i in (0, len(df) // 2, len(df) - 1):
        row = df.iloc[i]
        local = moe_check.local_counts(row.num_tokens, row.num_experts, row.topk,
                                       row.moe_ep_size, row.distribution)
        gated = (row.hidden_size, row.inter_size, row.num_experts,
                 row.topk) not in moe_check.NON_GATED
        assert roof[i] == pytest.approx(float(moe_forms.expert_roofline(
            local, row.hidden_size, row.inter_size / row.moe_tp_size, row.moe_dtype, H100,
            gated)), rel=1e-3)


def test_mla_never_beats_its_roofline_on_any_measured_shape(full):
    for family in ("mla_context", "mla_generation"):
        df = full[family]
        t = check.predict(H100, family, df)
        kv, n, tokens, pairs, ctx, seqs, gemm = moe_check.mla_aggregates(df, family)
        for k in np.unique(kv):
            cut = moe_check.ABSORBED_MAX_Q[k] if family == "mla_context" else math.inf
            absorbed = tokens / seqs <= cut
            for g in np.unique(gemm):
                r = (kv == k) & (gemm == g)
                roof = moe_forms.mla_roofline(H100, n[r], tokens[r], pairs[r], ctx[r], k, g,
                                              absorbed[r])
                assert (t[r] >= roof).all(), family


def test_alltoall_never_beats_the_link_roofline(full):
    df = full["alltoall"]
    t = check.predict(H100, "alltoall", df)
    for i, row in enumerate(df.itertuples()):
        mode = moe_check.A2A_DATA_MODES[row.mode]
        roof = moe_forms.a2a_roofline(mode, row.num_tokens_per_rank, row.hidden_size,
                                      row.topk, row.num_experts, row.ep_size, NVLINK)
        assert t[i] >= roof > 0


@pytest.mark.parametrize("dtype", ["bf16", "fp8", "fp8_block", "int4_wo", "w4a16_mxfp4"])
def test_neutral_parameters_reduce_expert_time_to_the_roofline(dtype):
    bare = replace(H100, calibration=Calibration())
    tokens = np.array([0, 3, 40, 977, 5000])
    t = moe_forms.expert_time(tokens, 4096, 1536, dtype, bare)
    roof = float(moe_forms.expert_roofline(tokens, 4096, 1536, dtype, bare))
    # Up to the last partial wave of 1 x 1 tiles over 132 SMs.
    assert roof <= t == pytest.approx(roof, rel=1e-5)


def test_expert_time_is_monotone_in_tokens():
    for dtype in ("bf16", "fp8", "fp8_block", "int4_wo", "w4a16_mxfp4"):
        times = [moe_forms.expert_time(np.full(32, m), 7168, 2048, dtype, H100, ep=8)
                 for m in (0, 1, 2, 8, 64, 256, 1024, 4096)]
        assert all(b >= a for a, b in zip(times, times[1:], strict=False)), dtype
        assert times[-1] > 10 * times[1]


def test_skewed_load_costs_more_than_balanced_at_equal_total():
    balanced = np.full(16, 64)
    skewed = np.array([64 * 16 - 15 * 3] + [3] * 15)  # same experts active, same total
    assert skewed.sum() == balanced.sum()
    for dtype in ("bf16", "fp8_block"):
        tb = moe_forms.expert_time(balanced, 4096, 1536, dtype, H100, ep=8)
        ts = moe_forms.expert_time(skewed, 4096, 1536, dtype, H100, ep=8)
        assert ts > tb, dtype
    # The measured imbalance: the GPU holding the most loaded experts is slower.
    df = check.read_family(DATA, "moe")
    pick = df[(df.hidden_size == 4096) & (df.inter_size == 1536) & (df.moe_dtype == "bfloat16")
              & (df.moe_ep_size == 8) & (df.num_tokens == 8192)]
    t = dict(zip(pick.distribution, check.predict(H100, "moe", pick), strict=True))
    assert t["power_law_1.2"] > t["balanced"]


def test_expert_time_per_rank_matches_one_rank_at_a_time():
    rng = np.random.default_rng(1)
    ranks = rng.integers(0, 300, size=(8, 32))
    each = [moe_forms.expert_time(r, 7168, 2048, "fp8_block", H100, ep=8) for r in ranks]
    both = moe_forms.expert_time(ranks, 7168, 2048, "fp8_block", H100, ep=8)
    assert both.shape == (8,) and np.allclose(both, each, rtol=1e-12)


def test_a2a_bytes_by_hand():
    # Low latency: one copy per expert, 7 of 8 ranks remote: 16 x 7168 x 2 x 8 x 7/8.
    assert moe_forms.a2a_bytes("low_latency", 16, 7168, 8, 256, 8, 2) == 16 * 7168 * 2 * 7
    # Normal: distinct destination ranks. E = 4, ep = 2 (2 experts per rank), k = 2: a
    # token misses a given rank with probability C(2, 2) / C(4, 2) = 1/6, so it reaches
    # 2 (1 - 1/6) = 5/3 ranks, of which half are remote: 5/6 copies.
    b = moe_forms.a2a_bytes("normal", 6, 100, 2, 4, 2, 1)
    assert b == pytest.approx(6 * 100 * 5 / 6)
    assert moe_forms.a2a_bytes("normal", 10, 100, 2, 4, 1, 1) == 0
    # Time = latency + per-token work + bytes / (B eta); an 8x slower link (NIC vs NVLink)
    # scales only the bandwidth term.
    p = H100.calibration.alltoall_for("normal", "dispatch")
    t_nv = moe_forms.a2a_time("normal", "dispatch", 4096, 7168, 8, 256, 8, 450e9, H100)
    t_ib = moe_forms.a2a_time("normal", "dispatch", 4096, 7168, 8, 256, 8, 50e9, H100)
    fixed = p.launch_s + 4096 * p.token_sm_s / H100.sm_count
    nbytes = moe_forms.a2a_bytes("normal", 4096, 7168, 8, 256, 8, 2)
    assert t_nv == pytest.approx(fixed + nbytes / (450e9 * p.link_eff))
    assert t_ib - fixed == pytest.approx(9 * (t_nv - fixed))


def test_a2a_across_nodes_by_hand():
    # EP16 over 2 nodes of 8. Low latency: per token 8 x 7/16 copies stay in the node,
    # 8 x 8/16 cross it.
    up, out = moe_forms.a2a_split_bytes("low_latency", 10, 100, 8, 256, 16, 1, 8)
    assert up == pytest.approx(10 * 100 * 8 * 7 / 16) and out == pytest.approx(10 * 100 * 4)
    # Normal: once per distinct remote node. E = 4 over 2 nodes, k = 2: a token misses a
    # node with probability C(2, 2) / C(4, 2) = 1/6: 2 (5/6) nodes, half of them remote.
    _, out = moe_forms.a2a_split_bytes("normal", 6, 100, 2, 4, 4, 1, 2)
    assert out == pytest.approx(6 * 100 * 5 / 6)
    # The slower of the two link classes sets the time; never beats its roofline.
    args = ("normal", "dispatch", 4096, 7168, 8, 256, 16)
    p = H100.calibration.alltoall_for("normal", "dispatch")
    fixed = p.launch_s + 4096 * p.token_sm_s / H100.sm_count
    t = moe_forms.a2a_time(*args, 50e9, H100, 1.0, ranks_per_node=8, scale_up_Bps=450e9)
    up, out = moe_forms.a2a_split_bytes("normal", 4096, 7168, 8, 256, 16, 1.0, 8)
    assert t == pytest.approx(fixed + max(up / 450e9, out / 50e9) / p.link_eff)
    assert t >= moe_forms.a2a_roofline("normal", 4096, 7168, 8, 256, 16, 50e9, 1.0, 8, 450e9)
    # One node: the split reduces to the single-node bytes.
    assert moe_forms.a2a_split_bytes("normal", 5, 7, 8, 256, 8, 2, 8)[0] == pytest.approx(
        moe_forms.a2a_bytes("normal", 5, 7, 8, 256, 8, 2))


def test_mla_decode_grows_with_cache_and_prefill_with_prompt():
    kv = [moe_forms.mla_decode_time(H100, 16, 64, 64 * s, "bf16", "fp8_block")
          for s in (2, 1024, 16384, 131072)]
    assert all(b > a for a, b in zip(kv, kv[1:], strict=False))
    # 64 x 131072 latent entries of 576 bf16 values cannot stream faster than HBM.
    assert kv[-1] >= 64 * 131072 * 576 * 2 / H100.hbm_bandwidth_Bps
    # Prefill: monotone within each kernel path; vLLM switches from the absorbed kernel to
    # FlashAttention above 128 tokens (fp8 KV). The data has no FlashAttention rows below
    # 256 tokens, so the switch is a step of up to 25% either way, not a cliff.
    def pre(q):
        return float(moe_forms.mla_prefill_time(H100, 16, q, q * (q + 1) / 2, 0, 1, "fp8",
                                                "bf16"))
    for path in ((1, 16, 64, 128), (129, 256, 1024, 8192, 32768)):
        times = [pre(q) for q in path]
        assert all(b > a for a, b in zip(times, times[1:], strict=False)), path
    assert pre(129) == pytest.approx(pre(128), rel=0.25)


def test_calibrate_check_lists_the_new_families(sample, tmp_path, capsys):
    for family, df in sample.items():
        df.sample(min(len(df), 200), random_state=1).to_csv(tmp_path / f"{family}.csv",
                                                            index=False)
    assert main(["calibrate", "check", "--gpu", "h100_sxm", "--data", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for family in NEW:
        assert family in out


def test_unknown_moe_dtype_or_distribution_is_one_line_exit_2(tmp_path, capsys):
    df = check.read_family(DATA, "moe").head(3).copy()
    df.loc[df.index[0], "distribution"] = "zipf_9"
    df.to_csv(tmp_path / "moe.csv", index=False)
    assert main(["calibrate", "check", "--gpu", "h100_sxm", "--data", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "zipf_9" in err
    mla = check.read_family(DATA, "mla_generation").head(2).copy()
    mla.loc[mla.index[1], "kv_cache_dtype"] = "int3"
    mla.to_csv(tmp_path / "mla_generation.csv", index=False)
    (tmp_path / "moe.csv").unlink()
    assert main(["calibrate", "check", "--gpu", "h100_sxm", "--data", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "int3" in err and "kv_cache_dtype" in err
    with pytest.raises(ValueError, match="fp6"):
        moe_forms.expert_time([1, 2], 1024, 512, "fp6", H100)
