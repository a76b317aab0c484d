"""Hand-computed timelines on the toy model and GPU (tests/data).

Toy GPU: 100 TFLOP/s, 1 TB/s, every kernel at its roofline, no floors. Toy model: h=1024,
2 layers, 8 heads of 128 (8 KV heads), gated MLP I=4096, vocab 1024, bf16. One step costs
1 ms of CPU overhead plus, per layer, four GEMMs, the elementwise ops and the attention
kernel, each max(FLOPs / 1e14, bytes / 1e12); plus the embedding read and the LM head.
The arithmetic below is written out from those sizes, independently of the cost model code.
"""

from __future__ import annotations

import pytest
from conftest import toy_scenario

import simulator
from simulator.engine.clock import TICK

PEAK, BW, OVERHEAD = 100e12, 1e12, 0.001
# Event times sit on the clock's 2**-30 s grid: each step rounds by at most half a tick.
CLOCK = 4 * TICK
GEMMS = [(3072, 1024), (1024, 1024), (8192, 1024), (1024, 4096)]  # (n, k): QKV, O, gate_up, down
ELEMENTWISE_BYTES_PER_TOKEN = 2 * (4 * 1024 + 6 * 1024 + 2 * 16 * 128 + 3 * 4096)  # 53,248
KV_BYTES_PER_TOKEN = 2 * 8 * 128 * 2  # K and V, 8 heads of 128, bf16: 4,096 per layer


def op(flops: float, nbytes: float) -> float:
    return max(flops / PEAK, nbytes / BW)


def hand_step(tokens: int, pairs: float, decode_kv: int, sampled: int, cached: int = 0) -> float:
    """Seconds of one step on the toy replica (tp=1, pp=1); ``cached`` is the KV a prefill
    chunk reads from earlier chunks."""
    layer = sum(op(2 * tokens * n * k, 2 * (tokens * k + k * n + tokens * n)) for n, k in GEMMS)
    layer += tokens * ELEMENTWISE_BYTES_PER_TOKEN / BW
    attn_flops = 4 * 8 * 128 * (pairs + decode_kv)
    attn_bytes = 2 * tokens * 8 * 128 * 2 + (decode_kv + cached + tokens) * KV_BYTES_PER_TOKEN
    layer += op(attn_flops, attn_bytes)
    embed = tokens * 2048 / BW
    head = op(2 * sampled * 1024 * 1024, 2 * (sampled * 1024 + 1024 * 1024 + sampled * 1024))
    head += sampled * 2 * 2048 / BW  # final norm
    head = head if sampled else 0.0  # a step that samples nothing skips the LM head
    return OVERHEAD + 2 * layer + embed + head


@pytest.fixture
def toy():
    """The toy scenario with ``profile = "none"``: these timelines are of the mechanism, with
    the CPU step in line with the GPU step and no graph padding (vllm-v1, the default,
    hides the 1 ms behind GPU steps longer than it and pads to captured sizes)."""
    def make(**sections):
        sc = toy_scenario(**sections)
        sc["engine"] = {"profile": "none", **sc["engine"]}
        return sc
    return make


def test_one_request_on_one_gpu(toy):
    res = simulator.run(toy())
    r = res.requests.iloc[0]
    s1 = hand_step(100, 100 * 101 / 2, 0, 1)  # prefill of 100 tokens samples token 1
    s2 = hand_step(1, 0, 101, 1)  # decode reads 100 prompt + 1 new KV entries
    s3 = hand_step(1, 0, 102, 1)
    assert r["arrival_s"] == 1.0
    assert r["first_scheduled_s"] == 1.0
    assert r["ttft_s"] == pytest.approx(s1, abs=CLOCK)
    assert r["tpot_s"] == pytest.approx((s2 + s3) / 2, abs=CLOCK)
    assert r["e2e_s"] == pytest.approx(s1 + s2 + s3, abs=CLOCK)
    assert r["status"] == "completed"
    # A decode step reads the weights: 2 layers x 16,777,216 params x 2 bytes = 67.1 MB,
    # plus the 2.1 MB LM head, at 1 TB/s.
    assert 69e-6 < s2 - OVERHEAD < 71e-6
    steps = res.steps
    assert list(steps["prefill_tokens"]) == [100, 0, 0]
    assert list(steps["decode_tokens"]) == [0, 1, 1]


def _trace(tmp_path, arrivals, prompt=100, output=3):
    path = tmp_path / "trace.csv"
    rows = "\n".join(f"{t},{prompt},{output}" for t in arrivals)
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + rows + "\n")
    return {"arrival": "trace", "trace": str(path), "rate_per_s": None, "num_requests": None}


def test_two_requests_arriving_together_share_every_step(toy, tmp_path):
    res = simulator.run(toy(workload=_trace(tmp_path, [0.0, 0.0])))
    s1 = hand_step(200, 2 * 5050, 0, 2)
    s2 = hand_step(2, 0, 202, 2)
    s3 = hand_step(2, 0, 204, 2)
    for _, r in res.requests.iterrows():
        assert r["ttft_s"] == pytest.approx(s1, abs=CLOCK)
        assert r["e2e_s"] == pytest.approx(s1 + s2 + s3, abs=CLOCK)
    assert list(res.steps["batch_size"]) == [2, 2, 2]


def test_second_request_joins_at_the_next_step_boundary(toy, tmp_path):
    """B arrives while A prefills: B's prefill runs beside A's first decode (chunked mix)."""
    res = simulator.run(toy(workload=_trace(tmp_path, [0.0, 0.0001])))
    a, b = res.requests.iloc[0], res.requests.iloc[1]
    s1 = hand_step(100, 5050, 0, 1)  # A alone
    s2 = hand_step(101, 5050, 101, 2)  # A decodes (kv 101) + B prefills 100 tokens
    s3 = hand_step(2, 0, 102 + 101, 2)  # A's last token; B's first decode
    s4 = hand_step(1, 0, 102, 1)  # B's last token
    assert a["first_token_s"] == pytest.approx(s1, abs=CLOCK)
    assert a["finish_s"] == pytest.approx(s1 + s2 + s3, abs=CLOCK)
    assert b["first_scheduled_s"] == pytest.approx(s1, abs=CLOCK)
    assert b["ttft_s"] == pytest.approx(s1 + s2 - 0.0001, abs=CLOCK)
    assert b["finish_s"] == pytest.approx(s1 + s2 + s3 + s4, abs=CLOCK)


def test_chunked_prefill_splits_a_long_prompt_by_the_token_budget(toy, tmp_path):
    sc = toy(workload=_trace(tmp_path, [0.0], prompt=300, output=2),
             engine={"max_num_batched_tokens": 128, "max_num_seqs": 8})
    res = simulator.run(sc)
    # 300 tokens in chunks of 128, 128, 44; the causal pairs count earlier chunks in full.
    s1 = hand_step(128, 128 * 129 / 2, 0, 0)
    s2 = hand_step(128, 128 * (128 + 129 / 2), 0, 0, cached=128)
    s3 = hand_step(44, 44 * (256 + 45 / 2), 0, 1, cached=256)
    s4 = hand_step(1, 0, 301, 1)
    r = res.requests.iloc[0]
    assert list(res.steps["prefill_tokens"]) == [128, 128, 44, 0]
    assert r["ttft_s"] == pytest.approx(s1 + s2 + s3, abs=CLOCK)
    assert r["e2e_s"] == pytest.approx(s1 + s2 + s3 + s4, abs=CLOCK)


def test_tensor_parallel_adds_two_all_reduces_per_layer(toy):
    """TP2 on the toy node: each GPU does half the GEMMs; each layer pays 2 ring all-reduces
    of T*h*2 bytes over the NVSwitch path (2 hops of 1 us, 100 GB/s)."""
    one = simulator.run(toy()).steps
    two = simulator.run(toy(parallel={"tp": 2})).steps
    assert (two["comm_s"] > 0).all() and (one["comm_s"] == 0).all()
    # Decode is bandwidth-bound: half the weight bytes per GPU, so compute nearly halves.
    ratio = two["compute_s"].iloc[1] / one["compute_s"].iloc[1]
    assert 0.5 < ratio < 0.55
    # Ring all-reduce over 2 ranks of S bytes: t0 + 2(n-1)*a + 2(n-1)/n * S / (B*eta).
    from simulator.parallel import collective as c

    s_bytes = 1 * 1024 * 2
    ring = c.LAUNCH_S + 2 * 2e-6 + s_bytes / (100e9 * c.BANDWIDTH_EFFICIENCY)
    lm_gather = 0.5 * (c.LAUNCH_S + 2 * 2e-6 + 512 * 2 / (100e9 * c.BANDWIDTH_EFFICIENCY))
    assert two["comm_s"].iloc[1] == pytest.approx(2 * 2 * ring + lm_gather, rel=1e-12)
