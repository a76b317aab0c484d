"""Replay of request traces: Azure LLM inference traces (TIMESTAMP) or offsets in ns.

Formats read: the Azure LLM inference traces of 2023 and of the 2024 week-long release
(``TIMESTAMP``, ``ContextTokens``, ``GeneratedTokens``; the same columns), BurstGPT
(``Timestamp`` in seconds, ``Request tokens``, ``Response tokens``; its rows with 0
response tokens log failed requests and are skipped), and plain ``start_offset_ns`` or
``arrival_s`` with ``prompt_tokens`` / ``output_tokens``.

A trace is data from outside: every error names the file, the CSV row (1 = the header) and
the column, and shows at most a short, sanitized excerpt of one cell, never more of the
file (a path like ``/proc/self/environ`` must not end up on a terminal or in a sweep CSV).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from simulator.errors import ScenarioError
from simulator.io.schema import MAX_TIME_S, MAX_TOKENS

KEY = "workload.trace"
TIME_COLUMNS = ("TIMESTAMP", "Timestamp", "start_offset_ns", "arrival_s")
#: Prompt and output token columns, by format: Azure, BurstGPT, plain.
TOKEN_COLUMNS = (("ContextTokens", "GeneratedTokens"), ("Request tokens", "Response tokens"),
                 ("prompt_tokens", "output_tokens"))
#: Longest excerpt of a cell or a column name an error shows (characters).
EXCERPT = 24


def excerpt(value: object, limit: int = EXCERPT) -> str:
    """A cell as a short printable excerpt: non-printable characters become ``?`` and the
    text is cut to ``limit`` characters."""
    text = re.sub(r"[^\x20-\x7e]", "?", str(value))
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def _fail(path: Path, what: str) -> ScenarioError:
    return ScenarioError(f"{KEY}: {str(path)!r} {what}")


def _bad_row(path: Path, df: pd.DataFrame, col: str, bad: np.ndarray, what: str):
    i = int(np.flatnonzero(bad)[0])
    more = int(bad.sum()) - 1
    also = f" (and {more} more row{'s' if more > 1 else ''})" if more else ""
    return _fail(path, f"row {i + 2}, column {col}: {excerpt(df[col].iloc[i])} {what}{also}")


def _numbers(path: Path, df: pd.DataFrame, col: str) -> np.ndarray:
    """A column as floats; the first cell that is not a number is an error."""
    values = pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(values)
    if bad.any():
        raise _bad_row(path, df, col, bad, "is not a finite number")
    return values


def _tokens(path: Path, df: pd.DataFrame, col: str) -> np.ndarray:
    """A token-count column: whole numbers in [1, MAX_TOKENS]."""
    x = _numbers(path, df, col)
    bad = (x < 1) | (x > MAX_TOKENS) | (x != np.floor(x))
    if bad.any():
        raise _bad_row(path, df, col, bad, f"is not a whole number of tokens in "
                                           f"[1, {MAX_TOKENS}]")
    return x.astype(np.int64)


def load_trace(path: Path) -> pd.DataFrame:
    """Read a trace CSV into columns ``arrival_s`` (from the first request), ``prompt_tokens``
    and ``output_tokens``.

    Accepted columns: ``TIMESTAMP`` (date-time) or ``start_offset_ns`` or ``arrival_s``, and
    ``ContextTokens``/``GeneratedTokens`` or ``prompt_tokens``/``output_tokens``. Token counts
    must be whole numbers >= 1; a cell that is not is an error naming its row and column.
    """
    if not path.is_file():
        what = "is not a file" if path.exists() else "not found"
        raise _fail(path, what)
    try:
        df = pd.read_csv(path, encoding="utf-8-sig")
    except (pd.errors.ParserError, pd.errors.EmptyDataError):
        raise _fail(path, "is not a readable CSV (no header row, or rows with more cells "
                          "than the header)") from None
    except UnicodeDecodeError as exc:
        raise _fail(path, f"is not a readable CSV (not UTF-8 text at byte {exc.start})") \
            from None
    except OSError as exc:
        raise _fail(path, f"cannot be read ({exc.strerror})") from None
    cols = set(df.columns)
    time_col = next((c for c in TIME_COLUMNS if c in cols), None)
    p_col, o_col = next((pair for pair in TOKEN_COLUMNS if set(pair) <= cols),
                        TOKEN_COLUMNS[-1])
    if time_col is None or p_col not in cols or o_col not in cols:
        # Only names that look like column names: a file that is no CSV shows nothing of it.
        plain = [str(c) for c in df.columns if re.fullmatch(r"[\w .-]{1,32}", str(c))]
        shown = ", ".join(plain[:6]) or "no plain column names"
        more = len(df.columns) - min(len(plain), 6)
        more = f" and {more} more" if more else ""
        raise _fail(path, f"needs a TIMESTAMP, Timestamp, start_offset_ns or arrival_s "
                          f"column and ContextTokens/GeneratedTokens (or Request tokens/"
                          f"Response tokens, or prompt_tokens/output_tokens) columns (has: "
                          f"{shown}{more})")
    if o_col == "Response tokens":  # BurstGPT: failed requests logged with 0 tokens
        df = df[pd.to_numeric(df[o_col], errors="coerce") != 0].reset_index(drop=True)
    if len(df) == 0:
        raise _fail(path, "has no requests")
    if time_col == "TIMESTAMP":
        ts = pd.to_datetime(df["TIMESTAMP"], format="mixed", errors="coerce")
        if ts.isna().any():
            raise _bad_row(path, df, "TIMESTAMP", ts.isna().to_numpy(), "is not a date-time")
        t = (ts - ts.min()).dt.total_seconds().to_numpy()
    else:
        scale = 1e-9 if time_col == "start_offset_ns" else 1.0
        t = _numbers(path, df, time_col) * scale
    prompt = _tokens(path, df, p_col)
    output = _tokens(path, df, o_col)
    t = t - t.min()
    if t.max() > MAX_TIME_S:
        raise _fail(path, f"spans {t.max():.3g} s, beyond the {MAX_TIME_S:g} s a run may "
                          f"simulate (column {time_col})")
    order = np.argsort(t, kind="stable")
    return pd.DataFrame({
        "arrival_s": t[order],
        "prompt_tokens": prompt[order],
        "output_tokens": output[order],
    })
