"""Write a run's outputs: requests.csv, steps.csv, summary.json, scenario.toml.

A run owns its folder: every file is written into a fresh temporary folder beside the
target, which then takes the target's place (a previous run's folder is swapped out and
deleted). So no stale file of an earlier run survives (a ``--no-steps`` run leaves no old
steps.csv), a crash leaves no half-written folder, and no link already in the folder is
followed. A target that holds anything but a run's files is refused before simulating.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
import tomli_w

from simulator.errors import ScenarioError
from simulator.files import nearest_existing, out_folder
from simulator.io.chrome_trace import bounded, json_bytes, trace_window, write_trace
from simulator.io.scenario import to_dict

#: Files a run writes; a folder holding only these (and plots) may be replaced by a run.
RUN_FILES = frozenset({"requests.csv", "steps.csv", "trace.json", "gpu_timeseries.csv",
                       "timeseries.csv", "alerts.csv", "summary.json", "scenario.toml",
                       "trace.json.gz", "requests.parquet", "steps.parquet",
                       "gpu_timeseries.parquet", "timeseries.parquet", "report.html"})


def _clean(v):
    return None if isinstance(v, float) and not math.isfinite(v) else v


#: Rows Arrow's CSV writer formats at a time: its default of 1,024 costs a third more CPU
#: on a long run's step table (the Vidur workload's 212k rows: 0.17 -> 0.11 s, same bytes).
CSV_BATCH_ROWS = 65_536


def write_csv(df: pd.DataFrame, path: Path) -> None:
    """A DataFrame as CSV, through Arrow's C++ writer (about 8x faster than pandas for the
    hundreds of thousands of step rows of a long run). Floats keep full precision."""
    table = pa.Table.from_pandas(df, preserve_index=False)
    with pa.OSFile(str(path), "wb") as sink:
        sink.write((",".join(df.columns) + "\n").encode())
        pacsv.write_csv(table, sink, pacsv.WriteOptions(include_header=False,
                                                        quoting_style="none",
                                                        batch_size=CSV_BATCH_ROWS))


def write_result(result, out_dir: str | Path, steps: bool = True, trace: bool = True) -> Path:
    """Write the files of a :class:`~simulator.Result` into ``out_dir``: requests.csv,
    steps.csv and trace.json (when steps were kept), timeseries.csv, alerts.csv,
    summary.json and scenario.toml.

    The files are written into a new temporary folder beside ``out_dir`` that then replaces
    it; ``out_dir`` must be new, empty or a previous run's folder (see :func:`check_out`).

    Raises
    ------
    ScenarioError
        When ``out_dir`` may not be written (checked before anything is written).
    """
    out = Path(out_dir)
    check_out(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # as mkdir would make it (mkdtemp: 0700)
        has_steps = steps and not result.steps.empty
        with ThreadPoolExecutor(1) as pool:
            # trace.json in a second thread: Arrow formats it and writes the CSVs below with
            # the GIL released, so the two overlap on a second core.
            name = "trace.json.gz" if result.scenario.output.trace_gzip else "trace.json"
            until = trace_window(result.steps, result.scenario.output.trace_max_steps)
            traced = (pool.submit(write_trace, tmp / name,
                                  *bounded(result.requests, result.steps, until))
                      if has_steps and trace else None)
            _write_tables(result, tmp, has_steps)
            if traced is not None:
                traced.result()  # re-raises a failure to write it
        _replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


#: Above this estimated size, ``run`` warns before writing steps.csv or the trace.
LARGE_BYTES = 200e6
#: Rows formatted to estimate steps.csv's size.
SAMPLE_ROWS = 2000


def steps_csv_bytes(steps: pd.DataFrame) -> float:
    """steps.csv's size, estimated from its first :data:`SAMPLE_ROWS` rows as CSV (the
    columns and digits of this run; within a few percent of the file)."""
    if steps.empty:
        return 0.0
    head = steps.head(SAMPLE_ROWS)
    return len(head.to_csv(index=False).encode()) * len(steps) / len(head)


def size_notes(result, steps: bool, trace: bool) -> list[str]:
    """What the CLI says before writing a large run: steps.csv's and the trace's estimated
    sizes above :data:`LARGE_BYTES` (the trace's as uncompressed JSON), and the window a
    bounded trace covers."""
    notes, n = [], len(result.steps)
    size = steps_csv_bytes(result.steps) if steps else 0.0
    if size > LARGE_BYTES and result.scenario.output.format == "csv":
        notes.append(f"warning: writing steps.csv of about {size / 1e6:,.0f} MB ({n:,} step "
                     f"rows); --no-steps or output.steps = false keeps none, output.format = "
                     f"\"parquet\" is several times smaller")
    until = trace_window(result.steps, result.scenario.output.trace_max_steps)
    if steps and trace and not result.steps.empty:
        traced = json_bytes(*bounded(result.requests, result.steps, until))
        if traced > LARGE_BYTES:
            gz = " (the .gz file about a ninth of it)" if result.scenario.output.trace_gzip \
                else ""
            notes.append(f"warning: writing a trace of about {traced / 1e6:,.0f} MB of JSON"
                         f"{gz}, which Perfetto holds in memory uncompressed; "
                         f"output.trace_max_steps bounds its steps, --no-trace writes none")
    if steps and trace and until is not None:
        end = float(result.steps["end_s"].max())
        notes.append(f"trace: the first {result.scenario.output.trace_max_steps:,} of {n:,} "
                     f"steps, up to {until:.1f} s of {end:.1f} s "
                     f"(output.trace_max_steps = 0 traces every step)")
    return notes


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _replace(new: Path, out: Path) -> None:
    """Put folder ``new`` at ``out``: a rename, after moving a previous run's folder aside
    (deleted once the new one is in place; links inside it are removed, never followed)."""
    old = None
    if out.is_dir() and not out.is_symlink():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
        os.rename(out, old / "run")
    os.rename(new, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def check_out(out: str | Path) -> bool:
    """Check that a run may write its folder ``out``, before it simulates anything.

    ``out`` may be new, an empty folder, or a folder holding only a previous run's files
    (:data:`RUN_FILES` and ``*.png`` plots), which the run replaces. Its nearest existing
    parent must be a writable folder.

    Returns
    -------
    bool
        Whether ``out`` holds a previous run that will be replaced.

    Raises
    ------
    ScenarioError
        Naming ``--out``, the path and what is wrong.
    """
    out = Path(out)
    where = f"--out {str(out)!r}"
    out_folder(out, "--out", create=False)  # no link, no file, under a folder
    if out.name in ("", ".", "..") or out.resolve() == out.resolve().parent:
        raise ScenarioError(f"{where}: name a folder of its own for the run")
    parent = nearest_existing(out.parent)
    try:  # the one honest test of writing there (permissions, read-only or virtual file
        # systems like /proc): make and remove an empty folder
        os.rmdir(tempfile.mkdtemp(prefix=".probe.", dir=parent))
    except OSError as exc:
        raise ScenarioError(f"{where}: cannot write in {str(parent)!r} "
                            f"({exc.strerror})") from None
    if not out.exists():
        return False
    foreign = [p.name for p in out.iterdir()
               if not ((p.name in RUN_FILES or p.suffix == ".png")
                       and (p.is_symlink() or p.is_file()))]
    if foreign:
        shown = ", ".join(repr(n) for n in sorted(foreign)[:3])
        raise ScenarioError(f"{where}: holds {shown}{' ...' if len(foreign) > 3 else ''}, "
                            f"not a run's files; a run replaces its whole folder, so give a "
                            f"new or empty one")
    if not os.access(out, os.W_OK | os.X_OK):
        raise ScenarioError(f"{where}: cannot replace it (permission denied)")
    return any(out.iterdir())


def default_out(name: str, overrides: list[str] | None = None,
                seed: int | None = None) -> Path:
    """``runs/<name>/``, or ``runs/<name>-<changes>/`` when ``--set`` overrides or ``--seed``
    change the scenario: each ``section.key=value`` adds ``<key><value>`` (``--set
    parallel.tp=8 --set parallel.pp=1``: ``runs/<name>-tp8-pp1/``), ``--seed 3`` adds
    ``seed3``; when that would be longer than 48 characters, an 8-digit hash of the changes
    replaces it (``runs/<name>-h1a2b3c4d/``)."""
    parts = []
    for text in overrides or []:
        key, _, value = text.partition("=")
        value = value.strip().strip("\"'")
        parts.append(key.strip().split(".")[-1] + value)
    if seed is not None:
        parts.append(f"seed{seed}")
    if not parts:
        return Path("runs") / name
    suffix = "-".join(re.sub(r"[^A-Za-z0-9._+]+", "_", p) for p in parts)
    if len(suffix) > 48:
        digest = hashlib.sha1("\n".join([*(overrides or []), str(seed)]).encode())
        suffix = "h" + digest.hexdigest()[:8]
    return Path("runs") / f"{name}-{suffix}"


def write_parquet(df: pd.DataFrame, path: Path) -> None:
    """A DataFrame as Parquet (``[output] format = "parquet"``): typed columns, compressed."""
    import pyarrow.parquet as pq  # noqa: PLC0415 - on use: every CSV run would import it
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
