"""Prefix caching end to end: Mooncake replay and its reuse ceiling, synthetic sessions,
cache-aware routers, and identity with prefix caching off or without shared prefixes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from conftest import with_kv_tokens
from test_bad_input import TRACE, assert_rejected

import simulator
from simulator.cluster.simulation import run_rngs, workload_requests
from simulator.engine.prefix import hit_rate_ceiling, infinite_cache_tokens
from simulator.errors import ScenarioError
from simulator.paths import ROOT
from simulator.workload.mooncake import load_mooncake, read_jsonl, trace_reuse
from simulator.workload.sessions import session_requests

CONV = ROOT / "workloads" / "mooncake_conversation.jsonl"
SYNTH = ROOT / "workloads" / "mooncake_synthetic.jsonl"


def mooncake(router: str = "round_robin", dp: int = 1, duration_s: float = 60.0,
             **engine) -> dict:
    return {"name": "mc", "seed": 0, "model": {"name": "llama-3.1-8b"},
            "cluster": {"topology": "dgx-h100"}, "parallel": {"tp": 1, "dp": dp},
            "router": {"policy": router}, "engine": engine,
            "workload": {"arrival": "trace", "trace": str(CONV), "duration_s": duration_s},
            "output": {"steps": False}}


def sessions(router: str = "round_robin", dp: int = 4, engine: dict | None = None,
             **workload) -> dict:
    w = {"arrival": "sessions", "rate_per_s": 2.0, "duration_s": 30.0,
         "turns": {"dist": "uniform", "min": 2, "max": 8}, "think_time_s": 5.0,
         "prompt_tokens": {"dist": "lognormal", "mean": 300, "sigma": 0.8},
         "output_tokens": {"dist": "lognormal", "mean": 200, "sigma": 0.8},
         "shared_prefix_tokens": 2048, "prefix_groups": 8, **workload}
    return {"name": "sess", "seed": 3, "model": {"name": "llama-3.1-8b"},
            "cluster": {"topology": "dgx-h100"}, "parallel": {"tp": 1, "dp": dp},
            "router": {"policy": router}, "engine": engine or {}, "workload": w,
            "output": {"steps": False}}


def _ceiling(s: dict) -> float:
    sc = simulator.load_scenario(s)
    return hit_rate_ceiling(workload_requests(sc), sc.workload.hash_block_tokens,
                            simulator.build_plan(sc).max_model_len)


# -- the traces ----------------------------------------------------------------------------
@pytest.mark.parametrize("path, blocks, tokens", [(CONV, 0.366, 0.374), (SYNTH, 0.640, 0.651)])
def test_trace_reuse_matches_the_published_figures(path, blocks, tokens):
    reuse = trace_reuse(read_jsonl(path))
    assert reuse["blocks"] == pytest.approx(blocks, abs=0.0005)
    assert reuse["tokens"] == pytest.approx(tokens, abs=0.0005)


def test_mooncake_requests_carry_their_full_blocks():
    df = load_mooncake(CONV)
    assert len(df) == 12031 and df["arrival_s"].iloc[0] == 0.0
    assert df["arrival_s"].is_monotonic_increasing
    n = df["hashes"].map(len).to_numpy()
    np.testing.assert_array_equal(n, df["prompt_tokens"].to_numpy() // 512)
    assert (df["hashes"].map(lambda h: h[:1] == (0,)) | (n == 0)).all()  # common block 0
    # The ceiling by the engine's rules (no partial blocks, never the last token's block)
    # stays below the README's block count, which counts partial blocks too.
    hits = infinite_cache_tokens(df["hashes"], df["prompt_tokens"], df["output_tokens"], 512)
    assert 0.36 < hits.sum() / df["prompt_tokens"].sum() < 0.374


def test_malformed_mooncake_trace_is_one_clear_error(tmp_path, write, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 600, "output_length": 5, '
                   '"hash_ids": [1, 2]}\n{"timestamp": 5, "input_length": 700}\n')
    with pytest.raises(ScenarioError, match="line 2 lacks output_length, hash_ids"):
        load_mooncake(bad)
    bad.write_text('{"timestamp": 0, "input_length": 600, "output_length": 5, '
                   '"hash_ids": [1]}\n')
    with pytest.raises(ScenarioError, match=r"line 1 has 1 hash_ids for 600 prompt tokens"):
        load_mooncake(bad)
    path = write(workload={**TRACE["workload"], "trace": str(bad)})
    assert_rejected(capsys, path, "workload.trace", "bad.jsonl", "hash_ids", cmd="run")


def test_hash_block_not_a_multiple_of_the_kv_block(write, capsys):
    path = write(workload={**TRACE["workload"], "trace": str(CONV), "hash_block_tokens": 500})
    assert_rejected(capsys, path, "workload.hash_block_tokens", "500", "block_size (16)")


@pytest.fixture
def write(tmp_path):
    def _write(**overrides):
        from test_bad_input import scenario_text

        path = tmp_path / "s.toml"
        path.write_text(scenario_text(**overrides))
        return path

    return _write


# -- hit rates against the ceiling -----------------------------------------------------------
@pytest.mark.parametrize("router, dp", [("round_robin", 1), ("prefix_aware", 2),
                                        ("kv_aware", 2), ("session_affinity", 2)])
def test_hit_rate_never_above_the_infinite_cache_ceiling(router, dp):
    s = mooncake(router, dp, duration_s=90.0)
    res = simulator.run(s)
    ceiling = _ceiling(s)
    hit = res.summary["prefix_hit_rate"]
    assert 0.0 < hit <= ceiling
    # Per request too: nobody finds more than an unbounded cache would give it.
    df = workload_requests(simulator.load_scenario(s))
    best = infinite_cache_tokens(df["hashes"], df["prompt_tokens"], df["output_tokens"], 512)
    got = res.requests.set_index("request_id")["cached_prompt_tokens"]
    assert (got.to_numpy() <= best[got.index.to_numpy()]).all()
    assert res.summary["prefill_tokens_saved"] == int(got.sum())
    assert res.requests["cached_prompt_tokens"].mod(512).eq(0).all()


def test_rejected_requests_leave_the_ceiling():
    # The synthetic trace has prompts beyond Llama-3.1's 131,072 positions: rejected, they
    # never reach a cache, and the hit rate counts completed requests only.
    s = mooncake("prefix_aware", duration_s=120.0, kv_offload_gib=1000.0)
    s["workload"].update(trace=str(SYNTH), time_scale=4.0)
    res = simulator.run(s)
    assert (res.requests["status"] == "rejected").sum() > 0
    assert 0.0 < res.summary["prefix_hit_rate"] <= _ceiling(s)


def test_a_large_cache_reaches_the_ceiling_of_a_light_load():
    # The first 20 s of the trace slowed 20x on one replica: little queueing and ~445k
    # tokens of KV for 0.8M prompt tokens, so hits miss only what was evicted or not yet
    # prefilled when the next turn came: within 2% of the unbounded cache.
    s = mooncake("prefix_aware", dp=1, duration_s=20.0)
    s["workload"]["time_scale"] = 20.0
    res = simulator.run(s)
    assert res.summary["prefix_hit_rate"] == pytest.approx(_ceiling(s), rel=0.02)


# -- prefix caching off, or nothing shared: today's results exactly --------------------------
def _identical(a: simulator.Result, b: simulator.Result) -> None:
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    pd.testing.assert_frame_equal(a.steps, b.steps, check_exact=True)
    for k, v in a.summary.items():
        if k not in ("wall_time_s",):
            assert str(b.summary[k]) == str(v), k


def test_prefix_caching_off_replays_the_lengths_as_a_plain_trace(tmp_path):
    s = mooncake(dp=2, duration_s=60.0, prefix_caching=False)
    s["output"] = {"steps": True}
    off = simulator.run(s)
    df = workload_requests(simulator.load_scenario(s))
    csv = tmp_path / "lengths.csv"
    df[["arrival_s", "prompt_tokens", "output_tokens"]].to_csv(csv, index=False)
    plain = simulator.run({**s, "workload": {**s["workload"], "trace": str(csv)},
                           "engine": {}})
    _identical(plain, off)
    assert off.summary["prefix_hit_rate"] == 0.0
    on = simulator.run({**s, "engine": {}})
    assert on.summary["prefix_hit_rate"] > 0.0  # the default is on
    assert on.summary["ttft_mean_s"] < off.summary["ttft_mean_s"]


def test_nothing_shared_gives_identical_results_with_prefix_caching_on():
    # One turn per session, no system prompt: every block is new, so every cached block is
    # only ever evicted (the run's KV tokens are many times the cache), and no request is
    # preempted (a preempted one would find its own blocks cached: see below). The cache
    # must not change a single step.
    kw = {"turns": 1, "shared_prefix_tokens": 0, "rate_per_s": 20.0, "duration_s": 10.0}
    on = simulator.run(_tight(sessions(dp=1, **kw), 30_000))
    off = simulator.run(_tight(sessions(dp=1, engine={"prefix_caching": False}, **kw),
                               30_000))
    tokens = on.requests["prompt_tokens"].sum() + on.requests["output_tokens"].sum()
    assert tokens > 3 * on.summary["kv_tokens_per_replica"]
    assert on.summary["preemptions_total"] == 0
    _identical(on, off)


def test_a_recomputed_request_reuses_its_own_cached_blocks():
    kw = {"turns": 1, "shared_prefix_tokens": 0, "rate_per_s": 20.0, "duration_s": 10.0}
    on = simulator.run(_tight(sessions(dp=1, **kw), 12_000))
    off = simulator.run(_tight(sessions(dp=1, engine={"prefix_caching": False}, **kw),
                               12_000))
    assert on.summary["preemptions_total"] > 0 and off.summary["preemptions_total"] > 0
    # Nothing is shared between requests, so no first admission hits; but re-prefills after
    # a preemption skip what is still cached: less prefill work per preemption.
    assert on.summary["prefix_hit_rate"] == 0.0
    extra_on = on.steps["prefill_tokens"].sum() - on.requests["prompt_tokens"].sum()
    extra_off = off.steps["prefill_tokens"].sum() - off.requests["prompt_tokens"].sum()
    assert extra_on / on.summary["preemptions_total"] < extra_off / off.summary[
        "preemptions_total"]


def _tight(s: dict, kv_tokens: int) -> dict:
    """The scenario with a KV cache of about ``kv_tokens`` and per-step records."""
    s = with_kv_tokens(s, kv_tokens)
    s["output"] = {"steps": True}
    return s


def test_fast_forward_identical_with_prefix_caching():
    s = _tight(sessions(dp=1, rate_per_s=6.0), 30_000)
    fast = simulator.run(s)
    slow = simulator.run({**s, "engine": {**s["engine"], "fast_forward": False}})
    assert fast.summary["prefix_hit_rate"] > 0.3
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)


# -- sessions --------------------------------------------------------------------------------
def test_sessions_conserve_every_turn():
    s = simulator.load_scenario(sessions())
    w = s.workload
    df = session_requests(w, run_rngs(s.seed))
    starts = df.groupby("session")["turn"].agg(["count", "max"])
    assert (starts["max"] + 1 == starts["count"]).all()  # turns 0..T-1, none lost
    assert starts["count"].between(2, 8).all()
    for _, g in df.groupby("session"):
        g = g.sort_values("turn")
        assert g["arrival_s"].is_monotonic_increasing
        p, o, h = (g[c].tolist() for c in ("prompt_tokens", "output_tokens", "hashes"))
        for j in range(1, len(g)):
            assert p[j] > p[j - 1] + o[j - 1]  # the answer and new user tokens appended
            assert h[j][: len(h[j - 1])] == h[j - 1]  # the context is a prefix of the next
        assert all(x < 0 for x in h[0][:4]) and all(x >= 0 for x in h[0][4:])  # group, own
        assert len(h[0]) == (p[0] + o[0]) // 512
    # Sessions of a group share exactly the system prompt's full blocks (2048 = 4 blocks).
    firsts = df[df["turn"] == 0]["hashes"].map(lambda h: h[:5])
    groups = {h[:4] for h in firsts}
    assert 1 < len(groups) <= 8 and all(len(g) == 4 for g in groups)
    assert len({h[4] for h in firsts if len(h) > 4}) == sum(len(h) > 4 for h in firsts)
    res = simulator.run(sessions())
    assert len(res.requests) == len(df)
    assert (res.requests["status"] == "completed").all()
    assert res.requests["prompt_tokens"].sum() == df["prompt_tokens"].sum()


# -- routers ---------------------------------------------------------------------------------
def test_cache_aware_routers_hit_more_than_round_robin():
    rates = {r: simulator.run(sessions(r)).summary["prefix_hit_rate"]
             for r in ("round_robin", "prefix_aware", "kv_aware", "session_affinity")}
    ceiling = _ceiling(sessions())
    for r in ("prefix_aware", "kv_aware", "session_affinity"):
        assert rates["round_robin"] < rates[r] <= ceiling, rates
    assert rates["prefix_aware"] > rates["round_robin"] + 0.1, rates


def test_session_affinity_keeps_a_session_on_one_replica():
    res = simulator.run(sessions("session_affinity"))
    df = workload_requests(simulator.load_scenario(sessions()))
    rep = res.requests.set_index("request_id")["replica"]
    per = pd.Series(rep.to_numpy(), index=df["session"].to_numpy()).groupby(level=0).nunique()
    assert (per == 1).all() and rep.nunique() == 4


def test_host_tier_raises_hits_under_memory_pressure():
    base = simulator.run(_tight(sessions(dp=1, rate_per_s=4.0), 30_000))
    tier = simulator.run(_tight(sessions(dp=1, engine={"kv_offload_gib": 64.0},
                                         rate_per_s=4.0), 30_000))
    assert tier.summary["prefix_hit_rate"] > base.summary["prefix_hit_rate"]
    assert (tier.requests["status"] == "completed").all()


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_preemption_under_pressure_with_prefix_caching(preemption):
    s = _tight(sessions(dp=1, engine={"preemption": preemption, "swap_space_gib": 2.0},
                        rate_per_s=8.0), 12_000)
    res = simulator.run(s)
    assert res.summary["preemptions_total"] > 0
    assert (res.requests["status"] == "completed").all()
    assert res.summary["prefix_hit_rate"] <= _ceiling(s)


def test_timeseries_has_the_hit_rate():
    res = simulator.run(sessions(dp=2))
    ts = res.timeseries
    assert "prefix_hit_rate" in ts
    done = res.requests
    w = ts["window_end_s"].iloc[0] - ts["window_start_s"].iloc[0]
    i = int(ts["prefix_hit_rate"].fillna(-1).to_numpy().argmax())
    sel = done[(done["finish_s"] >= i * w) & (done["finish_s"] < (i + 1) * w)]
    assert ts["prefix_hit_rate"].iloc[i] == pytest.approx(
        sel["cached_prompt_tokens"].sum() / sel["prompt_tokens"].sum())
    per = res.summary["prefix_hit_rate_per_replica"]
    assert len(per) == 2 and all(0 < x < 1 for x in per)

