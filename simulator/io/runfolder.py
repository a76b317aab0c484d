"""Read a run folder back (``report``, ``compare``, ``plot``): its tables, summary and name.

A run folder may be half written (a cut summary.json, an empty CSV), edited, or not a
run's at all. Each file is read through :mod:`simulator.files` (a regular file, bounded
size, JSON no deeper than its cap) and checked for what its readers use: a table's columns
and their numeric kind, the summary as one JSON object, the scenario's name and SLOs as
plain values. Anything else is a :class:`~simulator.errors.ScenarioError` naming the file
and what a run writes there, never a traceback from deep inside a plot.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from simulator import files
from simulator.errors import ScenarioError
from simulator.io.scenario import read_toml

#: Columns each table's readers use, all numeric but ``status``, ``event`` and ``replica``.
COLUMNS = {
    "requests": ("ttft_s", "tpot_s", "e2e_s"),
    "timeseries": ("window_start_s",),
    "alerts": ("event", "replica", "time_s"),
    "steps": ("start_s", "end_s", "replica", "stage", "prefill_tokens"),
    "gpu_timeseries": ("gpu", "window_start_s", "compute_util"),
}
TEXT = frozenset({"status", "event", "replica", "gpu"})
KEY = "run folder"


def _fail(path: Path, what: str) -> ScenarioError:
    return ScenarioError(f"{KEY}: {str(path)!r} {what}; give a folder written by "
                         f"`python -m simulator run`")


def read_table(run_dir: str | Path, stem: str) -> pd.DataFrame | None:
    """A run folder's table ``stem`` from its Parquet or CSV file, its columns checked
    (:data:`COLUMNS`); None when the run wrote neither."""
    run = Path(run_dir)
    for ext in ("parquet", "csv"):
        path = run / f"{stem}.{ext}"
        if not path.exists() and not path.is_symlink():
            continue
        files.regular_file(path, KEY, files.MAX_DATA_BYTES)
        try:
            df = pd.read_parquet(path) if ext == "parquet" else pd.read_csv(path)
        except pd.errors.EmptyDataError:
            raise _fail(path, "is empty (a cut or unfinished file)") from None
        except (ValueError, OSError, UnicodeDecodeError, pd.errors.ParserError):
            raise _fail(path, f"is not a readable {ext.upper()} table") from None
        missing = [c for c in COLUMNS.get(stem, ()) if c not in df.columns]
        if missing:
            raise _fail(path, f"lacks the column(s) {', '.join(missing)} a run's {stem} "
                              f"table has")
        wrong = [c for c in COLUMNS.get(stem, ()) if c not in TEXT and len(df)
                 and not pd.api.types.is_numeric_dtype(df[c])]
        if wrong:
            raise _fail(path, f"has non-numeric column(s) {', '.join(wrong)}")
        return df
    return None


def read_summary(run_dir: str | Path) -> dict:
    """``summary.json`` of a run folder: one JSON object (keys strings)."""
    path = Path(run_dir) / "summary.json"
    data = files.load_json(path, KEY)
    if not isinstance(data, dict):
        raise _fail(path, "is not a JSON object of summary figures")
    return data


def number(value: object) -> float | None:
    """A summary or scenario value as a finite number, else None (shown as blank)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def read_meta(run_dir: str | Path) -> tuple[str, dict[str, float | None]]:
    """The run's name and SLOs (``ttft_s``, ``tpot_s``) from its scenario.toml (the folder's
    name and no SLOs when it has none); foreign values become plain text or None."""
    run = Path(run_dir)
    path = run / "scenario.toml"
    data = read_toml(path) if path.exists() or path.is_symlink() else {}
    slo = data.get("slo") if isinstance(data.get("slo"), dict) else {}
    name = data.get("name")
    return (name if isinstance(name, str) else run.name,
            {k: number(slo.get(k)) for k in ("ttft_s", "tpot_s")})


def read_csv(path: str | Path, key: str) -> pd.DataFrame:
    """A CSV table from outside (a sweep's results), read through :mod:`simulator.files`."""
    path = files.regular_file(path, key, files.MAX_DATA_BYTES)
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        raise ScenarioError(f"{key}: {str(path)!r} is empty (no header row)") from None
    except (ValueError, OSError, UnicodeDecodeError, pd.errors.ParserError):
        raise ScenarioError(f"{key}: {str(path)!r} is not a readable CSV table") from None
