"""Shared fixtures: the toy hardware and model in tests/data, and small scenarios."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


def benchmark_module(relpath: str):
    """A script under benchmarks/ as a module (benchmarks/ is not a package)."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / relpath
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def toy_scenario(**sections) -> dict:
    """A scenario on the toy node (2 GPUs, 1e12 B/s, 100 TFLOP/s) with the toy model."""
    s = {
        "name": "toy",
        "seed": 1,
        "model": {"name": str(DATA / "toy_model.json")},
        "cluster": {"topology": str(DATA / "toy_node.toml"), "nodes": 1},
        "parallel": {"tp": 1, "pp": 1, "dp": 1},
        "engine": {"step_overhead_s": 0.001, "max_num_seqs": 64,
                   "max_num_batched_tokens": 2048},
        "workload": {"arrival": "constant", "rate_per_s": 1.0, "num_requests": 1,
                     "prompt_tokens": 100, "output_tokens": 3},
    }
    for name, values in sections.items():
        s[name] = {**s.get(name, {}), **values} if isinstance(values, dict) else values
    return s


def rejecting_scenario() -> dict:
    """The toy with max_model_len 300 and prompts of 100-400 tokens plus 20 outputs: the
    requests whose prompt + output exceed 300 tokens are rejected at admission."""
    return toy_scenario(
        engine={"max_model_len": 300},
        workload={"arrival": "constant", "rate_per_s": 4.0, "num_requests": 20,
                  "prompt_tokens": {"dist": "uniform", "min": 100, "max": 400},
                  "output_tokens": 20})


def with_kv_tokens(scenario: dict, tokens: int) -> dict:
    """Set gpu_memory_utilization so that one replica's KV cache holds about ``tokens``."""
    import simulator

    plan = simulator.build_plan(simulator.load_scenario(scenario))
    mem = plan.memory
    per_token = mem.block_bytes_per_gpu[0] / mem.block_size
    used = mem.weights_per_gpu[0] + (scenario["engine"].get("runtime_reserve_gib", 1.0)) * 2**30
    act = plan.node.gpu.memory_bytes * scenario["engine"].get("gpu_memory_utilization", 0.9)
    act -= used + mem.kv_bytes_per_gpu[0]  # activations = budget - weights - reserve - free
    util = (used + act + tokens * per_token) / plan.node.gpu.memory_bytes
    scenario["engine"]["gpu_memory_utilization"] = min(util, 1.0)
    return scenario


@pytest.fixture
def toy():
    return toy_scenario
