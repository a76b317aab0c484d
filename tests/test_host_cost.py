"""Host CPU cost per step: a fixed part plus parts per scheduled sequence and per token,
overlapped with the GPU (``max(GPU, host)``) or in line (``GPU + host``); the fast decode
paths price it exactly as stepping does; small models at high TP come out host-bound."""

from __future__ import annotations

import numpy as np
import pytest
from test_profiles import _cost

import simulator
from simulator.engine.host import host_keys
from simulator.io.profiles import HOST, PROFILES
from simulator.io.schema import EngineKeys

FIXED, PER_SEQ, PER_TOKEN = 0.003, 56e-6, 1e-7
KV = 1024  # KV entries each decoding sequence reads


def _decode(cost, n: int) -> float:
    """Step seconds (compute + communication) of a decode step of ``n`` sequences."""
    compute, comm = cost.step(n, 0.0, 0, n * KV, n)
    return compute + comm


@pytest.mark.parametrize("n", [1, 16, 128, 256])
def test_overlapped_host_grows_per_sequence_and_the_step_takes_the_larger(n):
    gpu = _decode(_cost(tp=8), n)  # no host floor: the GPU's time alone
    host = FIXED + PER_SEQ * n + PER_TOKEN * n  # by hand: 3 ms + 56 us x n + 0.1 us x n
    cost = _cost(tp=8, cpu_floor_s=FIXED, host_seq_s=PER_SEQ, host_token_s=PER_TOKEN)
    assert _decode(cost, n) == pytest.approx(max(gpu, host), rel=1e-12)


@pytest.mark.parametrize("n", [1, 64, 256])
def test_in_line_host_adds_its_per_sequence_and_per_token_parts(n):
    gpu = _decode(_cost(tp=2), n)
    cost = _cost(tp=2, host_seq_s=PER_SEQ, host_token_s=PER_TOKEN, host_inline=True)
    # The fixed part in line is the replica's step overhead, outside the stage cost.
    assert _decode(cost, n) == pytest.approx(gpu + PER_SEQ * n + PER_TOKEN * n, rel=1e-12)


def test_a_prefill_step_pays_per_token_and_per_sampled_sequence():
    tokens, pairs = 4096, 4 * 1024 * 1025 / 2  # four 1024-token prompts, all sampled
    base = sum(_cost(tp=1).step(tokens, pairs, 0.0, 0, 4))
    cost = _cost(tp=1, host_seq_s=PER_SEQ, host_token_s=PER_TOKEN, host_inline=True)
    assert sum(cost.step(tokens, pairs, 0.0, 0, 4)) == pytest.approx(
        base + 4 * PER_SEQ + tokens * PER_TOKEN, rel=1e-12)


@pytest.mark.parametrize("inline", [False, True])
def test_fast_decode_paths_match_stepping_bit_for_bit(inline):
    kw = {"host_seq_s": PER_SEQ, "host_token_s": PER_TOKEN, "host_inline": inline}
    if not inline:
        kw["cpu_floor_s"] = FIXED
    cost = _cost(tp=8, **kw)
    for n in (3, 40, 200):
        kv0 = n * 500
        run, comm = cost.decode_run(n, kv0, 5)
        many, comm2 = cost.decode_steps(n, kv0 + n * np.arange(1, 6))
        for j in range(5):
            compute, c = cost.step(n, 0.0, 0, kv0 + n * (j + 1), n)
            assert run[j] == compute and many[j] == compute and comm == comm2 == c


def test_only_the_first_stage_carries_the_host_and_overlap_selects_the_rule():
    over = EngineKeys(cpu_overlap=True, host_seq_s=PER_SEQ)
    inline = EngineKeys(cpu_overlap=False, host_seq_s=PER_SEQ)
    assert host_keys(over, 0) == {"cpu_floor_s": 0.003, "host_seq_s": PER_SEQ,
                                  "host_token_s": 0.0, "host_inline": False}
    assert host_keys(inline, 0)["cpu_floor_s"] == 0.0 and host_keys(inline, 0)["host_inline"]
    assert host_keys(over, 1) == {}


def test_profiles_declare_their_engines_host_cost_and_none_declares_none():
    assert PROFILES["vllm-v1"]["host_seq_s"] == HOST["vllm"]["host_seq_s"] == 56e-6
    assert PROFILES["vllm-v0.6"]["host_seq_s"] == 56e-6
    assert PROFILES["sglang"]["host_seq_s"] < PROFILES["trtllm"]["host_seq_s"] < 56e-6
    assert "host_seq_s" not in PROFILES["none"] and EngineKeys().host_seq_s == 0.0


def _tpot_ms(tp: int, **engine) -> float:
    """TPOT (ms) of benchmarks/docs/host_cost.py's closed loop (the same scenario)."""
    res = simulator.run({
        "name": "host-cost", "seed": 0, "model": {"name": "llama-3.1-8b"},
        "cluster": {"topology": "dgx-h100"}, "parallel": {"tp": tp},
        "engine": {"profile": "vllm-v1", **engine},
        "workload": {"arrival": "closed_loop", "concurrency": 128, "num_requests": 256,
                     "prompt_tokens": 1024, "output_tokens": 512},
        "output": {"steps": False}})
    return res.summary["tpot_mean_s"] * 1e3


def test_a_small_model_at_high_tp_is_host_bound_under_vllm():
    # Llama-3.1-8B at 128 sequences: the host's 3 ms + 128 x 56 us = 10.17 ms per step is
    # above the GPU's step at TP4 and TP8, so both give about the same TPOT (the engine is
    # host-bound); without the per-sequence part TP8 is clearly faster than TP4. The
    # figures are docs/cost-model.md's ("Host CPU cost per engine").
    tp4, tp8 = _tpot_ms(4), _tpot_ms(8)
    assert tp8 >= 3 + 128 * 0.056 - 1e-9
    assert tp4 == pytest.approx(tp8, rel=0.05)
    assert (round(tp4, 2), round(tp8, 2)) == (11.45, 11.02)
    flat4, flat8 = _tpot_ms(4, host_seq_s=0.0), _tpot_ms(8, host_seq_s=0.0)
    assert (round(flat4, 2), round(flat8, 2)) == (7.07, 5.04)
    assert flat8 < 0.8 * flat4 and flat8 < tp8 - 3
