"""GPU and node power, energy per request and per output token (docs/metrics.md, "Power").

Model, per GPU and time window: ``P = idle_w + (tdp_w - idle_w) * a`` with the activity
``a = 1 - (1 - compute_util) * (1 - hbm_util)`` (both clipped to [0, 1]): idle power at zero
utilization, the board power (TDP) when either the tensor cores or the HBM are saturated,
and growing with each of them. ``compute_util`` and ``hbm_util`` are the per-GPU, per-window
utilizations of :func:`simulator.metrics.utilization.gpu_windows` (the FLOPs and bytes of the
steps over the peak), not re-derived here. The form is an assumption, checked against one
published point: an H200 running vLLM decode at batch 128 draws 517 W of its 700 W (80 W
idle), i.e. ``a`` = 0.70, which a memory-bound decode step (HBM ~0.7, compute ~0.05) gives.

Node overhead (CPUs, NICs, fans, NVSwitches) is a constant per powered node,
:data:`NODE_OVERHEAD_W`. GPUs of a powered node that no replica uses draw idle power.
Sources of the TDP and idle figures are in each ``topologies/gpus/*.toml`` (``tdp_w``,
``idle_w``). Without step records, :class:`StepFold` sums the steps' work per window as
the run goes, so energy (and the MoE summary) need no steps.csv.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from simulator.metrics.moe import add_moe_columns
from simulator.metrics.records import STEP_COLUMNS, STEP_DTYPE
from simulator.metrics.utilization import StageHardware, window_work, windows_frame

#: Watts per node beyond its GPUs: the DGX H100 datasheet gives 10.2 kW maximum system power,
#: 5.6 kW of it the eight 700 W GPUs; we take about half of the remaining 4.6 kW maximum as
#: the constant draw of CPUs, memory, NICs, NVSwitches and fans under inference load (an
#: assumption, documented in docs/metrics.md).
NODE_OVERHEAD_W = 2300.0


def gpu_power_w(compute_util, hbm_util, idle_w: float, tdp_w: float):
    """Power of one GPU (W) at the given utilizations (scalars or arrays in [0, 1])."""
    c = np.clip(np.asarray(compute_util, dtype=float), 0.0, 1.0)
    m = np.clip(np.asarray(hbm_util, dtype=float), 0.0, 1.0)
    return idle_w + (tdp_w - idle_w) * (1.0 - (1.0 - c) * (1.0 - m))


def add_power(gpu_ts: pd.DataFrame, idle_w: float, tdp_w: float) -> pd.DataFrame:
    """``gpu_ts`` (one row per window and GPU) with a ``power_w`` column."""
    out = gpu_ts.copy()
    out["power_w"] = gpu_power_w(out["compute_util"].to_numpy(float),
                                 out["hbm_util"].to_numpy(float), idle_w, tdp_w)
    return out


def cluster_power(gpu_ts: pd.DataFrame, edges: np.ndarray, *, gpus_per_node: int,
                  idle_w: float, overhead_w: float = NODE_OVERHEAD_W) -> np.ndarray:
    """Power of the powered nodes (those holding a used GPU; GPU ``i`` on node ``i //
    gpus_per_node``) per window (W): the used GPUs' ``power_w``, the idle power of the
    other GPUs of those nodes, and each node's overhead."""
    n = len(edges) - 1
    ids = gpu_ts["gpu"].unique() if len(gpu_ts) else np.zeros(0, dtype=int)
    used = len(ids)
    nodes = len(np.unique(ids // gpus_per_node))  # GPU i sits on node i // gpus_per_node
    idx = np.searchsorted(edges, gpu_ts["window_start_s"].to_numpy(float), side="right") - 1
    gpu = np.bincount(np.clip(idx, 0, n - 1), weights=gpu_ts["power_w"].to_numpy(float),
                      minlength=n) if used else np.zeros(n)
    return gpu + (nodes * gpus_per_node - used) * idle_w + nodes * overhead_w


def energy_summary(power_w: np.ndarray, window_s: float, requests: pd.DataFrame) -> dict:
    """Energy of the run (J, the windows' power x width), per completed request and per
    output token, and the mean power (W) over the windows; NaN without windows."""
    nan = float("nan")
    if len(power_w) == 0:
        return {"energy_j": nan, "energy_per_request_j": nan,
                "energy_per_output_token_j": nan, "power_mean_w": nan}
    energy = float(np.sum(power_w) * window_s)
    done = requests[requests["status"] == "completed"]
    tokens = float(done["output_tokens"].sum())
    return {"energy_j": energy,
            "energy_per_request_j": energy / len(done) if len(done) else nan,
            "energy_per_output_token_j": energy / tokens if tokens > 0 else nan,
            "power_mean_w": energy / (window_s * len(power_w))}


def cost_summary(requests: pd.DataFrame, gpus: int, gpu_hour_usd: float) -> dict:
    """The GPU-hour price used and the cost of a million output tokens (USD): ``gpus x
    price x span / 3600 / (output tokens / 1e6)``, span from the first arrival to the last
    completion (as the pools' ``cost_per_million_tokens_usd``)."""
    done = requests[requests["status"] == "completed"]
    span = float(done["finish_s"].max() - requests["arrival_s"].min()) if len(done) else 0.0
    tokens = float(done["output_tokens"].sum())
    cost = (gpus * gpu_hour_usd * span / 3600.0 / (tokens / 1e6)
            if tokens > 0 and span > 0 else float("nan"))
    return {"gpu_hour_usd": float(gpu_hour_usd), "cost_per_million_output_tokens_usd": cost}


def pool_power(gpu_ts: pd.DataFrame, edges: np.ndarray, pools: list[str],
               node_of: dict[int, int], node_gpus: dict[int, int],
               node_idle_w: dict[int, float],
               overhead_w: float = NODE_OVERHEAD_W) -> dict[str, np.ndarray]:
    """Power of each pool per window (W), for a cluster of pools.

    Parameters
    ----------
    gpu_ts : DataFrame
        One row per window and used GPU with ``pool``, ``gpu`` (global index) and
        ``power_w`` (:func:`add_power` with the pool's own GPU).
    edges : ndarray
        Window edges (s).
    pools : list of str
        Pool names, the keys of the result (a pool without rows draws nothing).
    node_of, node_gpus, node_idle_w : dict
        GPU index -> node; node -> its GPUs; node -> idle power of one of its GPUs (W).
    overhead_w : float
        Constant power of a powered node beyond its GPUs (W).

    Notes
    -----
    A pool draws its used GPUs' ``power_w`` and, for every node it uses, the share
    ``u_pool / u_node`` (its used GPUs there over all pools' used GPUs there) of the node's
    static power ``(gpus - u_node) * idle_w + overhead_w``: a node's overhead counts once,
    wholly to a pool alone on it, so the pools' powers add up to the powered nodes' power.
    """
    n = len(edges) - 1
    idx = np.clip(np.searchsorted(edges, gpu_ts["window_start_s"].to_numpy(float),
                                  side="right") - 1, 0, n - 1)
    used = gpu_ts[["pool", "gpu"]].drop_duplicates()
    node = used["gpu"].map(node_of)
    on_node = node.value_counts()  # used GPUs per node, every pool
    out = {}
    for name in pools:
        rows = (gpu_ts["pool"] == name).to_numpy()
        gpu = np.bincount(idx[rows], weights=gpu_ts["power_w"].to_numpy(float)[rows],
                          minlength=n)
        mine = node[(used["pool"] == name).to_numpy()].value_counts()
        static = sum(((node_gpus[k] - on_node[k]) * node_idle_w[k] + overhead_w)
                     * c / on_node[k] for k, c in mine.items())
        out[name] = gpu + static
    return out


def pool_energy_summary(power: dict[str, np.ndarray], window_s: float) -> dict:
    """Per pool: energy (J, its power x window width summed over the windows) and mean
    power (W) over the windows."""
    return {"pool_energy_j": {k: float(np.sum(p) * window_s) for k, p in power.items()},
            "pool_power_mean_w": {k: float(np.mean(p)) if len(p) else float("nan")
                                  for k, p in power.items()}}


class StepFold:
    """Per-window work of every stage (and the MoE sums), folded from the step records as
    they come, for runs that do not keep them (``output.steps = false``, ``--no-steps``).

    The engine hands it each step's record (``append``) or a decode run's columns
    (``bulk``); every ``chunk`` steps it sums their FLOPs, HBM, NVLink and NIC bytes per
    ``window_s`` window with :func:`simulator.metrics.utilization.window_work` and drops the
    records, so memory grows with windows, not steps. :meth:`gpu_windows` then gives the
    table :func:`simulator.metrics.utilization.gpu_windows` gives from kept records (the
    same sums, added in another order); if the run's time series widened its windows
    (``MAX_WINDOWS``), each folded window counts in the wide window holding its start.

    Parameters
    ----------
    stages : list of StageHardware
        Every replica stage of the run.
    window_s : float
        Window width (s): ``output.window_s``.
    moe_costs : list of list, optional
        ``moe_costs[replica][stage]``: the MoE stage costs (MoE models), for
        :meth:`moe_summary`.
    """

    def __init__(self, stages: list[StageHardware], window_s: float, moe_costs=None,
                 chunk: int = 65536) -> None:
        self.stages, self.window_s, self.moe_costs, self.chunk = stages, window_s, moe_costs, chunk
        self._at = {(st.replica, st.stage): i for i, st in enumerate(stages)}
        self._work: list[list[np.ndarray]] = [[np.zeros(0)] * 4 for _ in stages]
        self._rows: list[tuple] = []
        self._bulk: list[dict] = []
        self._held = 0  # steps in _bulk
        self._moe = np.zeros(4)  # sum of imbalance, steps, sum of a2a_s, sum of busy s

    def append(self, row: tuple) -> None:
        """One step's record (the columns of ``STEP_COLUMNS``)."""
        self._rows.append(row)
        if len(self._rows) >= self.chunk:
            self._fold()

    def bulk(self, columns: dict) -> None:
        """Many steps' records as equal-length column arrays."""
        self._bulk.append(columns)
        self._held += len(columns["start_s"])
        if self._held >= self.chunk:
            self._fold()

    def _fold(self) -> None:
        parts = list(self._bulk)
        if self._rows:
            packed = np.array(self._rows, dtype=STEP_DTYPE)
            parts.append({c: packed[c] for c in STEP_COLUMNS})
        self._rows, self._bulk, self._held = [], [], 0
        if not parts:
            return
        df = pd.DataFrame({c: np.concatenate([b[c] for b in parts]) for c in STEP_COLUMNS})
        m = int(np.ceil(float((df["end_s"].max() + df["start_s"].max()) / 2) / self.window_s)) + 1
        edges = np.arange(m + 1) * self.window_s  # the time series' edges, as far as needed
        for key, rows in df.groupby(["replica", "stage"], sort=False).indices.items():
            i = self._at[(int(key[0]), int(key[1]))]
            work = window_work(self.stages[i], df.iloc[rows], edges, m)
            self._work[i] = [_add(a, b) for a, b in zip(self._work[i], work, strict=True)]
        if self.moe_costs is not None:
            d = add_moe_columns(df, self.moe_costs)
            self._moe += [d["imbalance"].sum(), len(d), d["a2a_s"].sum(),
                          (d["compute_s"] + d["comm_s"]).sum()]

    def gpu_windows(self, stages: list[StageHardware], edges: np.ndarray) -> pd.DataFrame:
        """:func:`simulator.metrics.utilization.gpu_windows` of ``stages`` (some of this
        fold's) over the windows ``edges``."""
        self._fold()
        n = len(edges) - 1
        fine = np.arange(max(len(w[0]) for w in self._work) if self._work else 0)
        idx = (fine if edges[1] - edges[0] == self.window_s
               else np.searchsorted(edges, fine * self.window_s, side="right") - 1)
        idx = np.clip(idx, 0, n - 1)
        totals = [[np.bincount(idx[: len(a)], weights=a, minlength=n) if len(a) else
                   np.zeros(n) for a in self._work[self._at[(st.replica, st.stage)]]]
                  for st in stages]
        return windows_frame(stages, totals, edges)

    def moe_summary(self) -> dict:
        """:func:`simulator.metrics.moe.moe_summary` from the folded sums."""
        self._fold()
        imb, n, a2a, busy = self._moe
        nan = float("nan")
        return {"moe_imbalance_mean": float(imb / n) if n else nan,
                "moe_a2a_share": float(a2a / busy) if busy else nan}


def _add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise sum of two arrays of windows, the shorter padded with zeros."""
    if len(a) < len(b):
        a, b = b, a
    out = a.copy()
    out[: len(b)] += b
    return out
