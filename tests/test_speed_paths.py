"""The engine's speed paths give the results of stepping one by one.

``DecodeSet.run_blocks`` sums residue slices instead of looping over steps, and a decode
run's aggregates and records are applied inline on a one-stage replica: checked against the
per-step definition and against ``fast_forward = false`` on small scenarios whose runs end
at completions, are cut by arrivals and by a fault, and on a one-stream pipeline (prefix
caching and MoE have their own fast-vs-slow tests in test_prefix_workloads.py and
test_moe.py).
"""

from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from conftest import toy_scenario
from test_fast_forward import _assert_identical, _both

import simulator
from simulator.engine.clock import SCALE
from simulator.engine.decoders import DecodeSet
from simulator.engine.request import Request
from simulator.io import chrome_trace, writers
from simulator.metrics import alerts as alerts_module
from simulator.metrics.gaps import GapHistogram
from simulator.metrics.records import (
    REQUEST_DTYPE,
    REQUEST_RECORD,
    STEP_COLUMNS,
    STEP_DTYPE,
    Recorder,
    _stable_order,
)

ROOT = Path(__file__).resolve().parent.parent


class _Stream(DecodeSet):
    """Just the aggregates run_blocks reads."""

    def __init__(self, bs: int, residue: list[int], k: int):
        self.bs, self.residue, self.k = bs, residue, k
        self.decoding = dict.fromkeys(range(sum(residue)))


def _per_step(st: _Stream, steps: int) -> int:
    """The definition: the decoders needing a block at each step after the scheduled one."""
    return sum(st.residue[-step % st.bs] for step in range(st.k + 2, st.k + 2 + steps))


def test_run_blocks_equals_the_per_step_sum_including_wrap_around():
    rng = random.Random(7)
    for _ in range(3000):
        bs = rng.choice([1, 2, 3, 16, 32])
        st = _Stream(bs, [rng.randint(0, 4) for _ in range(bs)], rng.randint(0, 200))
        steps = rng.randint(0, 3 * bs + 5)
        assert st.run_blocks(steps) == _per_step(st, steps), (bs, st.k, steps)


def test_run_needs_equal_the_per_step_residues_including_wrap_around():
    rng = random.Random(11)
    for _ in range(3000):
        bs = rng.choice([1, 2, 3, 16, 32])
        st = _Stream(bs, [rng.randint(0, 4) for _ in range(bs)], rng.randint(0, 200))
        steps = rng.randint(0, 3 * bs + 5)
        expected = [st.residue[-step % bs] for step in range(st.k + 2, st.k + 2 + steps)]
        assert st.run_needs(steps) == expected, (bs, st.k, steps)
        assert sum(expected) == st.run_blocks(steps)


def test_run_blocks_hand_computed():
    # Block size 4, residues [1, 2, 3, 4] (10 decoders), k = 0: steps 2, 3, 4 read residues
    # -2 % 4 = 2, -3 % 4 = 1, -4 % 4 = 0 -> 3 + 2 + 1 = 6; five steps: one period (10) + 3.
    st = _Stream(4, [1, 2, 3, 4], 0)
    assert st.run_blocks(3) == 6
    assert st.run_blocks(5) == 10 + 3
    assert st.run_blocks(0) == 0
    assert st.run_needs(6) == [3, 2, 1, 4, 3, 2]


LONE = toy_scenario(
    workload={"arrival": "poisson", "rate_per_s": 12.0, "num_requests": 250,
              "prompt_tokens": {"dist": "uniform", "min": 20, "max": 400},
              "output_tokens": {"dist": "uniform", "min": 1, "max": 90}})


@pytest.mark.parametrize("steps", [True, False])
def test_lone_replica_runs_with_completions_equal_stepping(steps):
    # One replica running ahead of the clock: short runs end at completions and arrivals.
    sc = {**LONE, "output": {"steps": steps}}
    fast, slow = _both(sc)
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    if steps:
        _assert_identical(fast, slow)
        assert (fast.steps["prefill_tokens"] == 0).sum() > 1000  # decode steps in runs
    assert fast.summary["steps_total"] == slow.summary["steps_total"]
    assert fast.summary["simpy_events"] < slow.summary["simpy_events"] / 3


def test_runs_cut_by_a_fault_equal_stepping():
    sc = toy_scenario(
        router={"policy": "least_outstanding"}, recovery={"restart_s": 0.5},
        workload={"arrival": "poisson", "rate_per_s": 15.0, "num_requests": 200,
                  "prompt_tokens": 200, "output_tokens": {"dist": "uniform", "min": 1,
                                                          "max": 150}})
    sc["faults"] = [{"at_s": 4.0, "target": "gpu:0", "duration_s": 1.0}]
    fast, slow = _both(sc)
    assert (slow.requests["retries"] > 0).any()  # the fault hit requests in flight
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)
    assert fast.summary["downtime_spans"] == slow.summary["downtime_spans"]
    assert fast.summary["steps_total"] == slow.summary["steps_total"]


def test_one_stream_pipeline_runs_equal_stepping():
    sc = toy_scenario(
        parallel={"pp": 2}, engine={"max_inflight_microbatches": 1, "max_num_seqs": 8},
        workload={"arrival": "poisson", "rate_per_s": 25.0, "num_requests": 150,
                  "prompt_tokens": 120, "output_tokens": {"dist": "uniform", "min": 1,
                                                          "max": 120}})
    fast, slow = _both(sc)
    _assert_identical(fast, slow)


def test_step_table_order_equals_pandas_stable_sort():
    """``_stable_order`` (None when already sorted, else ``np.lexsort``) gives the order of
    ``sort_values(["start_s", "replica", "stage"], kind="stable")``, ties and NaN included."""
    rng = np.random.default_rng(3)
    for n in (0, 1, 2, 5, 50, 400):
        for sorted_first in (False, True):
            for nan in (False, True):
                start = rng.integers(0, 6, n) * 0.25
                if nan and n:
                    start[n // 2] = np.nan  # sorts last
                df = pd.DataFrame({"start_s": start, "replica": rng.integers(0, 3, n),
                                   "stage": rng.integers(0, 2, n), "row": np.arange(n)})
                if sorted_first:
                    df = df.sort_values(["start_s", "replica", "stage"], kind="stable")
                want = df.sort_values(["start_s", "replica", "stage"], kind="stable")["row"]
                order = _stable_order(df["start_s"].to_numpy(), df["replica"].to_numpy(),
                                      df["stage"].to_numpy())
                got = df["row"].to_numpy() if order is None else df["row"].to_numpy()[order]
                assert got.tolist() == want.tolist()
                if not nan:  # None exactly when the rows already are in order
                    assert (order is None) == (df["row"].tolist() == want.tolist())


def test_a_dense_run_imports_neither_scipy_nor_parquet():
    """scipy (MoE routing and calibration) and pyarrow.parquet load on use: importing scipy
    cost every dense run 0.13 s of CPU."""
    code = ("import sys, simulator, simulator.cli, simulator.io.writers; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'scipy' "
            "or m == 'pyarrow.parquet'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("name", ["trace.json.gz", "trace.json"])
def test_trace_blocks_and_compressing_thread_keep_the_content(tmp_path, monkeypatch, name):
    """The steps' events formatted in blocks (and, gzipped, compressed in a second thread
    as they come) give the text of formatting all rows at once: blocks of 7 rows against
    one block, on a TP2 run whose steps all carry an all-reduce span."""
    res = simulator.run(toy_scenario(
        parallel={"tp": 2},
        workload={"arrival": "poisson", "rate_per_s": 10.0, "num_requests": 40,
                  "prompt_tokens": 60, "output_tokens": 30}))
    assert len(res.steps) > 50 and (res.steps["comm_s"] > 0).all()
    texts = []
    for rows in (7, 10**9):
        monkeypatch.setattr(chrome_trace, "BLOCK_ROWS", rows)
        path = tmp_path / f"{rows}-{name}"
        chrome_trace.write_trace(path, res.requests, res.steps)
        data = path.read_bytes()
        texts.append(gzip.decompress(data) if name.endswith(".gz") else data)
    assert texts[0] == texts[1]
    trace = json.loads(texts[0])["traceEvents"]
    spans = [e for e in trace if e.get("cat") == "step"]
    comm = [e for e in trace if e.get("cat") == "comm"]
    assert len(spans) == len(comm) == len(res.steps)
    # The span events come in step order, then the all-reduce ones, block after block.
    assert [e["ts"] for e in spans] == np.round(res.steps["start_s"] * 1e6, 3).tolist()


def test_compact_run_records_equal_a_tuple_per_step():
    """``Recorder.step`` (each tuple's numbers copied into a flat array of doubles) and
    ``Recorder.step_run`` (a short decode run's records as one entry, expanded by
    ``run_columns``) give the table of the tuples themselves, bit for bit: the tuple per
    step that the engine builds, packed into their dtypes, in time order."""
    rng = random.Random(5)
    compact, flat, rows = Recorder(), Recorder(), []
    t = 0.0
    for _ in range(300):
        # A prefill step as a tuple, then a run of m decode steps.
        row = (0, 0, 0, t + 0.001, t + 0.01, 50, 3, 4, 0.008, 0.0005, 40, 1275.0, 0, 90, 4)
        compact.step(row)
        rows.append(row)
        t += 0.01
        n, kv, used, m = rng.randint(1, 9), rng.randint(1, 5000), rng.randint(0, 900), \
            rng.randint(1, 20)
        off, comm = round(rng.uniform(0, 0.004) * SCALE) / SCALE, rng.uniform(0, 1e-3)
        computes = [rng.uniform(1e-3, 2e-2) for _ in range(m)]
        needs = [rng.randint(0, 2) for _ in range(m)]
        ends = [t]
        for c in computes:
            ends.append(ends[-1] + round((off + c + comm) * SCALE) / SCALE)
        compact.step_run((0, ends, off, n, computes, comm, used, needs, kv))
        for j in range(m):
            used += needs[j]
            rows.append((0, 0, 0, ends[j] + off, ends[j + 1], 0, n, n, computes[j], comm,
                         used, 0.0, 0, kv + (j + 1) * n, n))
        t = ends[-1]
    for row in rows:
        flat.step(row)
    packed = np.array(rows, dtype=STEP_DTYPE)
    want = pd.DataFrame({c: packed[c] for c in STEP_COLUMNS})
    assert len(want) > 1000
    pd.testing.assert_frame_equal(compact.steps_frame(), want, check_exact=True)
    pd.testing.assert_frame_equal(flat.steps_frame(), want, check_exact=True)
    assert Recorder(keep_steps=False).step_run is None  # the engine then builds tuples
    assert Recorder().steps_frame().empty


def test_gap_buffers_bin_what_the_definition_bins(monkeypatch):
    """``GapHistogram`` buffers single gaps and runs' times in flat arrays (runs given as
    lists or numpy arrays) and bins them at flushes: its counts, total and mean are those of
    binning every gap directly (``np.diff`` of each run, ``count`` of each), also across
    several flushes."""
    monkeypatch.setattr(GapHistogram, "FLUSH", 97)  # many flushes
    rng = np.random.default_rng(8)
    h, gaps, weights = GapHistogram(), [], []
    for i in range(400):
        if i % 3 == 0:
            g, c = float(rng.uniform(1e-4, 0.2)), int(rng.integers(0, 4))
            h.add(g, c)
            if c > 0:
                gaps.append([g])
                weights.append([c])
        else:
            times = np.cumsum(rng.uniform(1e-3, 5e-2, int(rng.integers(1, 30))))
            c = int(rng.integers(0, 6))
            h.add_run(times if i % 2 else times.tolist(), c)
            if len(times) > 1 and c > 0:
                gaps.append(np.diff(times))
                weights.append(np.full(len(times) - 1, c))
    g, w = np.concatenate(gaps), np.concatenate(weights)
    idx = np.clip(((np.log(g) - np.log(1e-6)) * h._scale).astype(np.int64) + 1, 1,
                  len(h.edges) - 1)
    assert h.total == w.sum()
    assert h.counts.tolist() == np.bincount(idx, weights=w, minlength=len(h.counts)).astype(
        np.int64).tolist()
    assert h.mean == pytest.approx((g * w).sum() / w.sum(), rel=1e-12)


@pytest.mark.parametrize("steps", [True, False])
def test_a_lone_replicas_alerts_reuse_the_cluster_table(monkeypatch, steps):
    """A replica that served every request (none rerouted) and ran every step takes the
    cluster's window table for its rules instead of recomputing it: the same events as
    recomputing, on an overloaded run where every latency and queue rule fires."""
    sc = toy_scenario(
        workload={"arrival": "poisson", "rate_per_s": 300.0, "num_requests": 400,
                  "prompt_tokens": {"dist": "uniform", "min": 20, "max": 900},
                  "output_tokens": {"dist": "uniform", "min": 1, "max": 120}},
        engine={"max_num_seqs": 8},
        alerts={"ttft_p99_s": 0.05, "e2e_p99_s": 0.5, "batch_efficiency_min": 0.5,
                "queue_len_max": 3, "oldest_queued_s": 0.05, "waiting_ttft_s": 0.05,
                "min_completions": 3},
        output={"steps": steps, "window_s": 0.1})
    calls = []
    whole = alerts_module._whole
    monkeypatch.setattr(alerts_module, "_whole", lambda *a: calls.append(whole(*a)) or calls[-1])
    fast = simulator.run(sc).alerts
    monkeypatch.setattr(alerts_module, "_whole", lambda *a: False)
    slow = simulator.run(sc).alerts
    assert calls == [True]
    assert set(slow["replica"]) == {"all", "0"}
    # Every rule but batch_efficiency_below fires: it breaks only while requests wait, and
    # then this replica's batches are full (8 sequences).
    assert set(slow["rule"]) == {"ttft_p99_above", "e2e_p99_above", "queue_len_above",
                                 "oldest_queued_above", "waiting_ttft_above"}
    pd.testing.assert_frame_equal(fast, slow, check_exact=True)


def test_request_rows_from_flat_numbers_equal_the_tuples():
    """``Recorder.request`` copies a request's numbers into a flat array of doubles and its
    (status, reason) into a code: ``requests_frame`` gives the table of packing the tuples
    into their dtypes (NaN times, large ids, repeated and distinct texts, out of order)."""
    rng = random.Random(3)
    rec, rows = Recorder(), []
    for i in rng.sample(range(10**12, 10**12 + 500), 200):
        r = Request(i, rng.uniform(0, 100), rng.randint(1, 4000), rng.randint(1, 900))
        r.replica = rng.randint(-1, 3)
        r.status, r.reason = rng.choice([("completed", ""), ("rejected", f"too long {i}"),
                                         ("dropped", "no replica up")])
        if r.status == "completed":
            r.first_scheduled_s, r.first_token_s = r.arrival_s + 0.5, r.arrival_s + 0.75
            r.finish_s = r.arrival_s + rng.uniform(1, 9)
        r.preemptions, r.retries = rng.randint(0, 3), rng.randint(0, 2)
        r.generated, r.cached_tokens = rng.randint(0, 900), rng.randint(0, 64)
        rec.request(r)
        rows.append((r.id, r.arrival_s, r.replica, r.prompt, r.output, r.first_scheduled_s,
                     r.first_token_s, r.finish_s, r.preemptions, r.status, r.retries,
                     r.reason, r.generated, r.cached_tokens))
    got = rec.requests_frame()
    packed = np.array(sorted(rows), dtype=REQUEST_DTYPE)
    for c in REQUEST_RECORD:
        want = packed[c]
        if c == "finish_s":  # a rejected request's finish is NaN in the table
            want = np.where(packed["status"] == "rejected", np.nan, want)
        if want.dtype.kind in "OUS":  # texts: plain equality (approx takes numbers only)
            assert got[c].tolist() == want.tolist(), c
        else:
            assert got[c].tolist() == pytest.approx(want.tolist(), nan_ok=True, rel=0,
                                                    abs=0), c
    assert got["request_id"].dtype == np.int64 and got["arrival_s"].dtype == np.float64
    assert Recorder().requests_frame().empty


def test_csv_batches_keep_the_bytes(tmp_path, monkeypatch):
    """Arrow's CSV writer formatting :data:`writers.CSV_BATCH_ROWS` rows at a time writes
    the bytes of one row at a time (its batches only bound what it formats together), and
    the numbers read back as they were: floats in full precision, NaN as an empty field."""
    res = simulator.run(toy_scenario(
        parallel={"tp": 2},
        workload={"arrival": "poisson", "rate_per_s": 10.0, "num_requests": 40,
                  "prompt_tokens": 60, "output_tokens": 30}))
    texts = {}
    for rows in (1, 7, 10**6):
        monkeypatch.setattr(writers, "CSV_BATCH_ROWS", rows)
        for name in ("steps", "requests"):
            writers.write_csv(getattr(res, name), tmp_path / f"{name}-{rows}.csv")
            texts[name, rows] = (tmp_path / f"{name}-{rows}.csv").read_bytes()
    for name in ("steps", "requests"):
        assert texts[name, 1] == texts[name, 7] == texts[name, 10**6]
        table = getattr(res, name)
        numbers = table.select_dtypes("number").columns
        back = pd.read_csv(tmp_path / f"{name}-7.csv")[numbers]
        pd.testing.assert_frame_equal(back, table[numbers], check_dtype=False)


def _pct_by_window(times, values, edges, q):
    """One column's windowed percentiles as the time series computed them column by
    column: the rows with a time and a value, grouped by window, pandas' linear quantile."""
    out = np.full(len(edges) - 1, np.nan)
    ok = ~(np.isnan(times) | np.isnan(values))
    idx = np.searchsorted(edges, times[ok], side="right") - 1
    df = pd.DataFrame({"w": idx, "v": values[ok]})
    df = df[(df["w"] >= 0) & (df["w"] < len(out))]
    if not df.empty:
        got = df.groupby("w")["v"].quantile(q / 100)
        out[got.index.to_numpy()] = got.to_numpy()
    return out


@pytest.mark.parametrize("seed", range(6))
def test_windowed_percentiles_of_all_columns_at_once_equal_one_by_one(seed):
    """``timeseries._pcts_by_window`` (one grouping for the three latency columns and both
    percentiles) gives each column's percentiles bit for bit: times missing or outside the
    windows, values missing in one column and not another, a column missing in a whole
    window, windows without rows, and no row at all."""
    from simulator.metrics.timeseries import _pcts_by_window
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 400))
    edges = np.arange(13) * 2.5
    times = rng.uniform(-3, 35, n).round(1)  # ties, and rows before and after the windows
    times[rng.random(n) < 0.1] = np.nan
    values = {k: rng.lognormal(0, 1, n) for k in ("a", "b", "c")}
    values["b"][rng.random(n) < 0.3] = np.nan
    values["c"][(times >= 10) & (times < 15)] = np.nan  # windows 4 and 5 without a value
    got = _pcts_by_window(times, values, edges, (50, 99, 0, 100))
    for k, v in values.items():
        for q in (50, 99, 0, 100):
            np.testing.assert_array_equal(got[k, q], _pct_by_window(times, v, edges, q))
    assert n == 0 or np.isnan(got["c", 50][4:6]).all()


def _joined_row_by_row(*parts):
    """Events joined as before: every column cast to text row by row, every part joined."""
    texts = [p if isinstance(p, str) else pc.cast(pa.array(p), pa.string()) for p in parts]
    return pc.binary_join_element_wise(*texts, ",\n", "").to_pylist()


@pytest.mark.parametrize("columns", [
    ([3, 3, 3], [0.0, 0.0, -0.0], [1.5, 2.5, 1e-07]),  # -0.0 prints apart from 0.0
    ([7, 7], [0.1, 0.1], [2**53, 2**53]),  # every column of one value
    ([1], [np.nan], [-4.0]),
    ([5, 6, 5], [np.nan, np.nan, np.nan], [1e22, 1e22, 1e22]),
])
def test_trace_columns_of_one_value_join_as_literal_text(columns):
    """``chrome_trace._events`` joins a column holding one value (bit for bit) as literal
    text, merged with the literals around it: the text of joining each row's cast values."""
    ints, a, b = (np.array(c) for c in columns)
    parts = ('{"pid":', ints, ',"ts":', a, ',"dur":', b, "}")
    assert chrome_trace._events(len(ints), *parts).to_pylist() == _joined_row_by_row(*parts)
