"""Write a run's outputs: requests.csv, steps.csv, summary.json, scenario.toml."""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import tomli_w

from simulator.io.chrome_trace import write_trace
from simulator.io.scenario import to_dict


def _clean(v):
    return None if isinstance(v, float) and not math.isfinite(v) else v


def write_csv(df: pd.DataFrame, path: Path) -> None:
    """A DataFrame as CSV, through Arrow's C++ writer (about 8x faster than pandas for the
    hundreds of thousands of step rows of a long run). Floats keep full precision."""
    table = pa.Table.from_pandas(df, preserve_index=False)
    with pa.OSFile(str(path), "wb") as sink:
        sink.write((",".join(df.columns) + "\n").encode())
        pacsv.write_csv(table, sink, pacsv.WriteOptions(include_header=False,
                                                        quoting_style="none"))


def write_result(result, out_dir: str | Path, steps: bool = True, trace: bool = True) -> Path:
    """Write the files of a :class:`~simulator.Result` into ``out_dir`` (created):
    requests.csv, steps.csv and trace.json (when steps were kept), timeseries.csv,
    alerts.csv, summary.json and scenario.toml."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    has_steps = steps and not result.steps.empty
    with ThreadPoolExecutor(1) as pool:
        # trace.json in a second thread: Arrow formats it and writes the CSVs below with the
        # GIL released, so the two overlap on a second core.
        name = "trace.json.gz" if result.scenario.output.trace_gzip else "trace.json"
        traced = (pool.submit(write_trace, out / name, result.requests, result.steps)
                  if has_steps and trace else None)
        _write_tables(result, out, has_steps)
        if traced is not None:
            traced.result()  # re-raises a failure to write it
    return out


def write_parquet(df: pd.DataFrame, path: Path) -> None:
    """A DataFrame as Parquet (``[output] format = "parquet"``): typed columns, compressed."""
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), str(path))


def _write_tables(result, out: Path, has_steps: bool) -> None:
    """Every file but trace.json (the four tables as CSV, or Parquet if the scenario says)."""
    ext = ".parquet" if result.scenario.output.format == "parquet" else ".csv"
    write = write_parquet if ext == ".parquet" else write_csv
    write(result.requests, out / f"requests{ext}")
    if has_steps:
        write(result.steps, out / f"steps{ext}")
    if has_steps and not result.gpu_timeseries.empty:
        write(result.gpu_timeseries, out / f"gpu_timeseries{ext}")
    if not result.timeseries.empty:
        write(result.timeseries, out / f"timeseries{ext}")
    result.alerts.to_csv(out / "alerts.csv", index=False)
    summary = {k: _clean(v) for k, v in result.summary.items()}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "scenario.toml").write_text(tomli_w.dumps(to_dict(result.scenario)))
