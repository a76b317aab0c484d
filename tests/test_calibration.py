"""The calibrated cost model: accuracy on measured H100 kernels, roofline bounds,
monotonicity, precision effects, and the ``calibrate`` command line."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

import simulator
from simulator.calibration import check, forms
from simulator.calibration.engines import engine_gpu
from simulator.calibration.params import GemmParams
from simulator.cli import main
from simulator.hardware.specs import load_gpu, load_node
from simulator.model.cost import StageCost, roofline_time
from simulator.model.memory import plan_memory, weight_bytes_per_gpu
from simulator.model.spec import load_model
from simulator.parallel.collective import allreduce
from simulator.paths import ROOT
from simulator.topology.graph import Paths, build_graph

DATA = ROOT / "simulator" / "calibration" / "data" / "h100_sxm"
H100 = load_gpu("h100_sxm")
#: Stated tolerances on the H100 data (docs/cost-model.md): median and p90 of |error| %.
#: The attention families sit at the issue's 10% / 25% targets on the full data (8.8 / 24.8
#: and 9.5 / 24.7); a subsample gets one point of slack on the p90.
TOLERANCE = {"gemm bfloat16": (10, 25), "gemm fp8": (10, 25),
             "attention_context": (10, 26), "attention_generation": (10, 26),
             "nccl all_reduce": (10, 25)}


@pytest.fixture(scope="module")
def sample() -> dict[str, pd.DataFrame]:
    """A fixed subsample of every family (all rows of the small collective files)."""
    data = check.load_data(DATA)
    return {f: df if len(df) < 5000 else df.sample(4000, random_state=0)
            for f, df in data.items()}


def test_every_family_within_its_tolerance(sample):
    report = check.check(H100, sample)
    table = pd.concat([check.summarize(report), check.breakdown(report)])
    for name, (med, p90) in TOLERANCE.items():
        row = table.loc[name]
        assert row["median_abs_error_pct"] <= med, (name, row.to_dict())
        assert row["p90_abs_error_pct"] <= p90, (name, row.to_dict())


def test_every_form_stays_above_its_roofline(sample):
    g = sample["gemm"]
    for dt, rows in g.groupby("dtype"):
        name = {"bfloat16": "bf16", "fp8": "fp8"}[dt]
        b = 1 if name == "fp8" else 2
        m, n, k = (rows[c].to_numpy(float) for c in "mnk")
        t = check.predict_gemm(H100, rows)
        roof = np.maximum(2 * m * n * k / H100.peak(name),
                          (m * k * b + k * n * b + m * n * 2) / H100.hbm_bandwidth_Bps)
        assert (t >= roof).all()
    for family in ("attention_context", "attention_generation"):
        df = sample[family]
        t = check.predict_attention(H100, df, family)
        for _dt, rows, shape, agg in check.attention_inputs(H100, df, family):
            if family == "attention_context":
                tokens, pairs = agg[0], agg[1]
                flops = 4 * shape.hq * shape.d * pairs
                nbytes = tokens * (shape.qo_token_bytes + shape.kv_token_bytes)
            else:
                flops = 4 * shape.hq * shape.d * agg[1]
                nbytes = agg[1] * shape.kv_token_bytes
            roof = np.maximum(flops / H100.peak("bf16"), nbytes / H100.hbm_bandwidth_Bps)
            assert (t[rows] >= roof).all()


def test_calibration_parameters_are_physical():
    for gpu in ("a100_sxm", "h100_sxm", "h200_sxm", "b200"):
        cal = load_gpu(gpu).calibration
        for p in [*cal.gemm.values(), *cal.prefill.values(), *cal.decode.values(),
                  cal.collectives, cal.elementwise]:
            for name, v in vars(p).items():
                assert v >= 0, (gpu, name)
                if name.endswith("_eff"):
                    assert v <= 1, (gpu, name)


@pytest.mark.parametrize("gpu,dtype,profile", [
    ("h100_sxm", "bf16", "none"), ("h100_sxm", "fp8", "none"), ("a100_sxm", "int4", "none"),
    ("b200", "fp4", "none"), ("h100_sxm", "bf16", "sglang"), ("h100_sxm", "fp8", "trtllm"),
    *(("b200", dt, p) for dt in ("bf16", "fp8", "fp4") for p in ("vllm-v1", "sglang",
                                                                 "trtllm"))])
@pytest.mark.parametrize("tp", [1, 8])
def test_a_step_never_beats_the_roofline(gpu, dtype, profile, tp):
    """Every engine's fit too (calibration/engines.py)."""
    m = load_model("llama-3.1-70b" if tp == 8 else "llama-3.1-8b")
    g = engine_gpu(load_gpu(gpu), profile)
    cost = StageCost(m, g, tp, m.layers, True, True, dtype, "fp8", _ring(tp))
    rng = np.random.default_rng(0)
    for _ in range(200):
        chunk, ctx, n_dec = (int(x) for x in rng.integers([0, 0, 0], [4096, 8192, 256]))
        kv = int(n_dec * rng.integers(1, 8192)) if n_dec else 0
        tokens = chunk + n_dec
        if not tokens:
            continue
        pairs = chunk * (ctx + (chunk + 1) / 2)
        sampled = n_dec + int(rng.integers(0, 2)) if chunk else n_dec
        compute, _ = cost.step(tokens, pairs, ctx if chunk else 0, kv, sampled)
        assert compute >= roofline_time(m, g, tp, dtype, "fp8", tokens, pairs,
                                        ctx if chunk else 0, kv, sampled)


def _ring(tp: int):
    node = load_node("dgx-h100")
    paths = Paths(build_graph(node, 1))
    return allreduce(paths, tuple(f"gpu{i}" for i in range(tp)),
                     H100.calibration.collectives, True, True)


def _h100_cost(tp=8, weight="bf16", kv="bf16", **kw) -> StageCost:
    m = load_model("llama-3.1-70b")
    return StageCost(m, H100, tp, m.layers, True, True, weight, kv, _ring(tp), **kw)


def test_more_tokens_or_longer_kv_is_never_cheaper():
    cost = _h100_cost()
    prefill = [sum(cost.step(s, s * (s + 1) / 2, 0, 0, 1)) for s in range(1, 9000, 37)]
    assert np.all(np.diff(prefill) >= 0)
    for kv in (1, 100, 5000):  # more sequences at the same KV length
        dec = [sum(cost.step(n, 0, 0, n * kv, n)) for n in range(1, 300)]
        assert np.all(np.diff(dec) >= 0)
    for n in (1, 16, 256):  # longer KV at the same batch
        dec = [sum(cost.step(n, 0, 0, n * kv, n)) for kv in range(1, 20000, 97)]
        assert np.all(np.diff(dec) >= 0)
    for p in (GemmParams(), H100.calibration.gemm_for("bf16"), H100.calibration.gemm_for("fp8")):
        for n, k in itertools.product((32, 1000, 8192, 28672), (64, 4096, 16384)):
            t = forms.gemm_time(np.arange(1, 5000), n, k, p, 989e12, 3.35e12, 132, 2)
            assert np.all(np.diff(t) >= 0)


def test_decode_steps_is_bit_identical_to_step_on_the_calibrated_model():
    for kw in ({}, {"layer_launch_s": 2e-4}):
        cost = _h100_cost(tp=4, weight="fp8", kv="fp8", **kw)
        for n in (1, 7, 64, 255):
            kv = np.arange(n * 300 + n, n * 300 + n * 200, n)
            fast, comm = cost.decode_steps(n, kv)
            slow = [cost.step(n, 0.0, 0, int(x), n) for x in kv]
            assert [c for c, _ in slow] == fast.tolist()
            assert all(c == comm for _, c in slow)


def test_precision_changes_bytes_capacity_and_peak():
    m = load_model("llama-3.1-70b")
    # Embeddings, LM head and norms stay 16-bit; the linear layers take the dtype.
    sixteen = 2 * m.vocab * m.hidden / 8 * 2 + (2 * m.layers + 1) * m.hidden * 2
    w = {d: weight_bytes_per_gpu(m, 8, m.layers, True, True, d) - sixteen
         for d in ("bf16", "fp8", "int8", "int4", "fp4")}
    assert w["fp8"] == w["bf16"] / 2 == w["int8"]
    assert w["int4"] == w["bf16"] / 4 == w["fp4"]
    args = dict(model=m, gpu_memory_bytes=H100.memory_bytes, tp=8, pp=1, weight_dtype="bf16",
                block_size=16, utilization=0.9, max_tokens=8192, max_seqs=256,
                reserve_bytes=2**30)
    kv16 = plan_memory(kv_dtype="bf16", **args).kv_blocks
    assert plan_memory(kv_dtype="fp8", **args).kv_blocks in (2 * kv16, 2 * kv16 + 1)
    # fp8 weights halve the bytes a bandwidth-bound decode GEMM streams, and run at the fp8
    # peak when compute-bound; weight-only int4 streams a quarter but computes in 16-bit.
    bf16, fp8, int4 = (_h100_cost(weight=d) for d in ("bf16", "fp8", "int4"))
    assert bf16.shapes.w_bytes == 2 * fp8.shapes.w_bytes == 4 * int4.shapes.w_bytes
    assert fp8.gemm_peak == H100.peak_flops["fp8"] and int4.gemm_peak == bf16.gemm_peak
    assert sum(fp8.step(1, 0, 0, 1000, 1)) < sum(bf16.step(1, 0, 0, 1000, 1))
    assert sum(int4.step(1, 0, 0, 1000, 1)) < sum(fp8.step(1, 0, 0, 1000, 1))


@pytest.mark.parametrize("topology,key,dtype,ok", [
    ("dgx-a100", "weight_dtype", "fp8", False), ("dgx-a100", "weight_dtype", "int8", True),
    ("dgx-a100", "weight_dtype", "int4", True), ("dgx-h100", "weight_dtype", "fp4", False),
    ("hgx-b200", "weight_dtype", "fp4", True), ("dgx-h100", "kv_dtype", "int4", False),
    ("dgx-a100", "kv_dtype", "fp8", True)])
def test_unsupported_precision_is_a_clear_error(topology, key, dtype, ok):
    sc = {"model": {"name": "llama-3.1-8b", key: dtype}, "cluster": {"topology": topology},
          "workload": {"arrival": "constant", "rate_per_s": 1.0, "num_requests": 2,
                       "prompt_tokens": 64, "output_tokens": 4}}
    if ok:
        assert simulator.run(sc).summary["requests_completed"] == 2
    else:
        with pytest.raises(simulator.ScenarioError, match=f"model.{key}: {dtype} is not "
                                                          f"supported.*allowed: bf16, fp16"):
            simulator.build_plan(simulator.load_scenario(sc))


@pytest.fixture(scope="module")
def small_data(tmp_path_factory, sample):
    folder = tmp_path_factory.mktemp("measured")
    for family, df in sample.items():
        df.sample(min(len(df), 300), random_state=1).to_csv(folder / f"{family}.csv",
                                                            index=False)
    return folder


def test_calibrate_fit_then_check_round_trip(small_data, tmp_path, capsys):
    gpu_file = tmp_path / "my_h100.toml"
    assert main(["calibrate", "fit", "--gpu", "h100_sxm", "--data", str(small_data),
                 "--out", str(gpu_file)]) == 0
    fitted = load_gpu(str(gpu_file))
    assert fitted.sm_count == 132 and fitted.peak_flops == H100.peak_flops
    assert "fitted" in fitted.calibration.source
    assert set(fitted.calibration.gemm) == {"bf16", "fp8"}
    report = tmp_path / "report.csv"
    assert main(["calibrate", "check", "--gpu", str(gpu_file), "--data", str(small_data),
                 "--out", str(report)]) == 0
    out = capsys.readouterr().out
    for family in check.FAMILIES:
        assert family in out
    df = pd.read_csv(report)
    assert {"family", "predicted_us", "error_pct"} <= set(df.columns)
    assert len(df) == sum(len(pd.read_csv(f)) for f in small_data.glob("*.csv"))
    # The refit on its own data is at least as good as the model it started from.
    again = check.summarize(df)
    assert (again["median_abs_error_pct"] < 15).all()


@pytest.mark.parametrize("case", ["no_dir", "empty_dir", "bad_gpu", "missing_column",
                                  "bad_value"])
def test_bad_calibration_input_exits_2_with_one_line(case, tmp_path, capsys):
    data, gpu = tmp_path / "d", "h100_sxm"
    if case != "no_dir":
        data.mkdir()
    if case == "bad_gpu":
        gpu = "h900_sxm"
        pd.DataFrame({"dtype": ["fp8"], "m": [1], "n": [2], "k": [3],
                      "latency_us": [4.0]}).to_csv(data / "gemm.csv", index=False)
    if case == "missing_column":
        (data / "gemm.csv").write_text("dtype,m,n,latency_us\nfp8,1,2,3\n")
    if case == "bad_value":
        (data / "nccl.csv").write_text("op_name,dtype,num_gpus,message_bytes,latency_us\n"
                                       "all_reduce,half,8,1024,fast\n")
    assert main(["calibrate", "check", "--gpu", gpu, "--data", str(data)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    expect = {"no_dir": "not found", "empty_dir": "holds none", "bad_gpu": "h900_sxm",
              "missing_column": "missing column(s) k", "bad_value": "latency_us"}[case]
    assert expect in err


def test_allreduce_picks_the_fastest_algorithm_and_matches_measurements():
    node = load_node("dgx-h100")
    paths = Paths(build_graph(node, 2))
    cal = node.gpu.calibration.collectives
    nccl = pd.read_csv(DATA / "nccl.csv").query("op_name == 'all_reduce' and dtype == 'half'")
    custom = pd.read_csv(DATA / "vllm_custom_allreduce.csv").query(
        "kernel_source == 'vLLM_custom_graph'")
    for n in (2, 4, 8):
        group = tuple(f"gpu{i}" for i in range(n))
        plain, fast = allreduce(paths, group, cal, True, False), allreduce(paths, group, cal,
                                                                          True, True)
        for size in (8192, 2**20, 16 * 2**20, 256 * 2**20):
            measured = nccl[(nccl.num_gpus == n) & (nccl.message_bytes == size)].latency_us
            assert plain.time(size) * 1e6 == pytest.approx(measured.mean(), rel=0.2)
        for size in (8192, 2**20):  # vLLM's custom all-reduce, below its 8 MiB limit
            measured = custom[(custom.num_gpus == n) & (custom.message_bytes == size)]
            assert fast.time(size) * 1e6 == pytest.approx(measured.latency_us.mean(), rel=0.15)
            assert fast.time(size) < plain.time(size)
        assert fast.time(64 * 2**20) == plain.time(64 * 2**20)  # above it: NCCL
    # In-switch reduction needs NVSwitch 3: large messages use it on H100, never on A100.
    assert allreduce(paths, tuple(f"gpu{i}" for i in range(8)), cal, True).algorithm(
        2**28) == "nvls"
    a100 = load_node("dgx-a100")
    a100_paths = Paths(build_graph(a100, 1))
    ring = allreduce(a100_paths, tuple(f"gpu{i}" for i in range(8)),
                     a100.gpu.calibration.collectives, a100.scale_up.in_switch_reduction)
    assert ring.algorithm(2**28) == "ring"


def test_the_engine_and_the_check_evaluate_the_same_forms():
    """StageCost's scalar hot path and the vectorized forms the fit and check use agree."""
    for kv in ("bf16", "fp8"):
        cost = _h100_cost(tp=4, kv=kv)
        sh = cost.shapes
        shape = forms.AttentionShape(sh.q_heads, sh.kv_heads, sh.model.head_dim, sh.kv_bytes,
                                     H100.peak("bf16"), H100.hbm_bandwidth_Bps, H100.sm_count)
        for tokens, ctx, seqs in ((1, 0, 1), (512, 0, 1), (3000, 9000, 2), (8192, 0, 16)):
            pairs = tokens * (ctx / seqs + (tokens / seqs + 1) / 2)
            expect = forms.prefill_time(shape, H100.calibration.prefill_for(kv), tokens, pairs,
                                        ctx, seqs)
            assert cost.prefill_attention(tokens, pairs, ctx, seqs) == pytest.approx(
                float(expect), rel=1e-12)
        for n, kvlen in ((1, 10), (64, 2000), (256, 30000)):
            expect = forms.decode_time(shape, H100.calibration.decode_for(kv), n, n * kvlen)
            stream = max(cost._dkv * n * kvlen + cost._dtok * n, cost._dflop * n * kvlen)
            assert cost._decode(n, stream) == pytest.approx(float(expect), rel=1e-12)
        for n, k in sh.gemms:
            p = H100.calibration.gemm_for("bf16")
            assert cost.gemm_time(100, n, k) == forms.gemm_time(100, n, k, p, 989e12, 3.35e12,
                                                                132, 2)
