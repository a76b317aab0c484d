"""Prefix caching per engine profile: on for vllm-v1, sglang and trtllm, off for vllm-v0.6
(each engine's own default), inert on workloads without shared prefixes."""

from __future__ import annotations

import pytest
from test_prefix_workloads import sessions
from test_profiles import _files, _scenario

import simulator
from simulator.io.profiles import PROFILES


@pytest.mark.parametrize(("name", "on"), [("vllm-v0.6", False), ("vllm-v1", True),
                                          ("sglang", True), ("trtllm", True)])
def test_each_profile_sets_its_engines_prefix_caching_default(name, on):
    assert PROFILES[name]["prefix_caching"] is on
    assert simulator.load_scenario(_scenario(profile=name)).engine.prefix_caching is on
    # An explicit key still wins.
    flipped = simulator.load_scenario(_scenario(profile=name, prefix_caching=not on))
    assert flipped.engine.prefix_caching is (not on)


def test_without_shared_prefixes_vllm_v06_writes_the_same_files_either_way(tmp_path):
    # Constant arrivals carry no block hashes: the cache has nothing to act on, so turning
    # it off in the vllm-v0.6 profile changes no byte of any output.
    sc = _scenario(profile="vllm-v0.6")
    sc["workload"] = {**sc["workload"], "rate_per_s": 40.0, "num_requests": 40}
    sc["output"] = {"steps": True, "trace_gzip": False}
    off = _files(sc, tmp_path / "off")
    sc["engine"] = {"profile": "vllm-v0.6", "prefix_caching": True}
    on = _files(sc, tmp_path / "on")
    assert off.keys() == on.keys()
    # scenario.toml records the resolved key itself; every result file is identical.
    assert {k: v for k, v in off.items() if k != "scenario.toml"} == \
        {k: v for k, v in on.items() if k != "scenario.toml"}
    assert b"prefix_caching = false" in off["scenario.toml"]
    assert b"prefix_caching = true" in on["scenario.toml"]


def test_shared_prefixes_hit_only_where_the_profile_caches():
    # Sessions with a 2,048-token system prompt: vLLM 0.6 prefills every prompt in full,
    # vLLM V1 reuses the cached blocks and prefills less.
    kw = {"duration_s": 15.0}
    v06 = simulator.run(sessions(dp=1, engine={"profile": "vllm-v0.6"}, **kw))
    v1 = simulator.run(sessions(dp=1, engine={"profile": "vllm-v1"}, **kw))
    assert v06.summary["prefix_hit_rate"] == 0.0
    assert v1.summary["prefix_hit_rate"] > 0.3
    assert v1.summary["ttft_mean_s"] < v06.summary["ttft_mean_s"]
