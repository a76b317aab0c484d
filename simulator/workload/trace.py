"""Replay of request traces: Azure LLM inference traces (TIMESTAMP) or offsets in ns."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from simulator.errors import ScenarioError

KEY = "workload.trace"


def load_trace(path: Path) -> pd.DataFrame:
    """Read a trace CSV into columns ``arrival_s`` (from the first request), ``prompt_tokens``
    and ``output_tokens``.

    Accepted columns: ``TIMESTAMP`` (date-time) or ``start_offset_ns`` or ``arrival_s``, and
    ``ContextTokens``/``GeneratedTokens`` or ``prompt_tokens``/``output_tokens``.
    """
    if not path.is_file():
        what = "is not a file" if path.exists() else "not found"
        raise ScenarioError(f"{KEY}: file {str(path)!r} {what}")
    try:
        df = pd.read_csv(path, encoding="utf-8-sig")
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{KEY}: {str(path)!r} is not a readable CSV "
                            f"({str(exc).splitlines()[0]})") from None
    cols = set(df.columns)
    time_col = next((c for c in ("TIMESTAMP", "start_offset_ns", "arrival_s") if c in cols), None)
    if time_col is None:
        raise ScenarioError(f"{KEY}: {str(path)!r} needs a TIMESTAMP, start_offset_ns or "
                            f"arrival_s column (has: {', '.join(map(str, df.columns))})")
    p_col = "ContextTokens" if "ContextTokens" in cols else "prompt_tokens"
    o_col = "GeneratedTokens" if "GeneratedTokens" in cols else "output_tokens"
    if p_col not in cols or o_col not in cols:
        raise ScenarioError(f"{KEY}: {str(path)!r} needs ContextTokens and GeneratedTokens "
                            f"(or prompt_tokens and output_tokens) columns")
    try:
        if time_col == "TIMESTAMP":
            ts = pd.to_datetime(df["TIMESTAMP"], format="mixed")
            t = (ts - ts.min()).dt.total_seconds().to_numpy()
        else:
            scale = 1e-9 if time_col == "start_offset_ns" else 1.0
            t = pd.to_numeric(df[time_col]).to_numpy(dtype=float) * scale
        prompt = pd.to_numeric(df[p_col]).to_numpy()
        output = pd.to_numeric(df[o_col]).to_numpy()
    except (ValueError, TypeError) as exc:
        raise ScenarioError(f"{KEY}: {str(path)!r} has a malformed value "
                            f"({str(exc).splitlines()[0]})") from None
    if len(t) == 0:
        raise ScenarioError(f"{KEY}: {str(path)!r} has no requests")
    if not (np.isfinite(t).all() and np.isfinite(prompt).all() and np.isfinite(output).all()):
        raise ScenarioError(f"{KEY}: {str(path)!r} has empty or non-finite cells")
    t = t - t.min()
    order = np.argsort(t, kind="stable")
    return pd.DataFrame({
        "arrival_s": t[order],
        "prompt_tokens": np.maximum(prompt[order].astype(np.int64), 1),
        "output_tokens": np.maximum(output[order].astype(np.int64), 1),
    })
