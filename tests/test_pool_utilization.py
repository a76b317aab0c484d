"""Link and per-GPU utilization of runs with pools, by hand: a disaggregated 1P1D run's KV
transfers load the fabric, its TP all-reduces the NVLink of each GPU, as a colocated run's
figures are defined (docs/metrics.md)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from simulator import run
from simulator.cluster.outcome import pool_hardware
from simulator.metrics.links import KEYS as LINK_KEYS
from simulator.metrics.pools import pool_energy
from simulator.metrics.utilization import GPU_COLUMNS

LAYERS, HIDDEN = 32, 4096  # Llama-3.1-8B
NIC_BPS, PCIE_BPS, NVLINK_BPS = 50e9, 64e9, 450e9  # dgx-h100: per direction


def one_p_one_d(window_s: float) -> dict:
    """Llama-3.1-8B, a TP8 prefill node and a TP8 decode node of a DGX H100 pair."""
    return {"name": "pu", "seed": 2, "model": {"name": "llama-3.1-8b"},
            "cluster": {"topology": "dgx-h100"},
            "pools": [{"name": "p", "role": "prefill", "nodes": 1, "tp": 8},
                      {"name": "d", "role": "decode", "nodes": 1, "tp": 8}],
            "engine": {"profile": "vllm-v0.6"},
            "workload": {"arrival": "constant", "rate_per_s": 8.0, "num_requests": 16,
                         "prompt_tokens": 800, "output_tokens": 24},
            "output": {"window_s": window_s}}


def test_kv_transfers_load_one_nic_per_rank():
    """Eight KV heads over TP8 -> TP8: rank q sends its head to rank q, through its own
    NIC; each of the 8 busiest fabric links (NIC to switch, switch to NIC) carries 1/8 of
    the bytes moved over the run, and so does the GPU's PCIe link to its NIC."""
    r = run(one_p_one_d(100.0))
    s = r.summary
    assert s["requests_completed"] == 16 and s["kv_transfers"] == 16
    moved, span = s["kv_bytes_moved"], s["simulated_time_s"]
    assert moved > 0
    assert s["fabric_util_max"] == pytest.approx(moved / 8 / (NIC_BPS * span), rel=1e-9)
    assert s["pcie_util_max"] == pytest.approx(moved / 8 / (PCIE_BPS * span), rel=1e-9)
    # Over time: the mean is additive over windows (a transfer counts where it starts).
    ts = run(one_p_one_d(0.25)).timeseries
    assert set(LINK_KEYS) <= set(ts.columns)
    assert float(ts["fabric_util_mean"].sum()) * 0.25 == pytest.approx(
        s["fabric_util_mean"] * span, rel=1e-9)
    assert (ts["fabric_util_max"] >= ts["fabric_util_mean"]).all()


def test_per_gpu_nvlink_of_each_pool_by_hand():
    """One window longer than the run: a GPU of a TP8 replica sends ``2 (n-1)/n x S`` bytes
    per all-reduce, two per layer, ``S = T x hidden x 2`` for the T tokens its replica
    stepped; over its 450 GB/s NVLink port and the window."""
    w = 100.0
    r = run(one_p_one_d(w))
    g, steps = r.gpu_timeseries, r.steps
    assert len(g) == 16 and set(g["pool"]) == {"p", "d"}
    assert (g.groupby("pool")["gpu"].nunique() == 8).all()
    for replica, pool in ((0, "p"), (1, "d")):
        first = steps[(steps["replica"] == replica) & (steps["stage"] == 0)]
        tokens = float((first["prefill_tokens"] + first["decode_tokens"]).sum())
        sent = 2 * LAYERS * 2 * 7 / 8 * tokens * HIDDEN * 2
        mine = g[g["pool"] == pool]
        assert mine["nvlink_util"].to_numpy() == pytest.approx(
            np.full(8, sent / (NVLINK_BPS * w)), rel=1e-12)
        assert (mine["replica"] == replica).all()
    # The prefill replica stepped every prompt once and one sampled token per request.
    first = steps[(steps["replica"] == 0) & (steps["stage"] == 0)]
    assert float(first["prefill_tokens"].sum()) == 16 * 800


def test_pools_keep_per_gpu_utilization_without_power_figures():
    """A pool GPU without ``tdp_w``: the per-GPU table keeps its utilizations and pool
    column, without ``power_w``; every energy key is NaN."""
    w = 100.0
    r = run(one_p_one_d(w))
    g = r.gpu_timeseries[GPU_COLUMNS]
    plan = r.plan
    node_of = {d["index"]: d["node"] for _, d in plan.graph.nodes(data=True)
               if d["kind"] == "gpu"}
    pools = [(p.name, pool_hardware(plan.graph, p),
              replace(p.node.gpu, tdp_w=None) if p.name == "d" else p.node.gpu)
             for p in plan.pools]
    gpu_ts, power, keys = pool_energy(g, pools, node_of, np.array([0.0, w]), r.requests)
    assert power == {} and list(gpu_ts.columns) == [*GPU_COLUMNS, "pool"]
    pd.testing.assert_frame_equal(gpu_ts[GPU_COLUMNS], g)
    assert gpu_ts["pool"].tolist() == r.gpu_timeseries["pool"].tolist()
    assert math.isnan(keys["energy_j"]) and math.isnan(keys["pool_power_mean_w"]["p"])
