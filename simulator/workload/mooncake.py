"""Replay of Mooncake traces (FAST'25): JSON Lines with prefix-block hashes.

One request per line: ``timestamp`` (ms from the trace start), ``input_length``,
``output_length`` and ``hash_ids``, one chained hash per 512-token block of the prompt
(``ceil(input_length / 512)`` ids; the last block is usually partial). A request carries the
ids of its *full* blocks (``Request.hashes``): only a full block can be cached and reused
(:mod:`simulator.engine.prefix`), and the engine splits each into ``512 / block_size`` KV
blocks. Also here: the trace's reuse under an infinite cache, the ceiling of any hit rate.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from simulator import files
from simulator.errors import ScenarioError
from simulator.files import excerpt
from simulator.io.schema import MAX_REQUESTS, MAX_TIME_S, MAX_TOKENS

KEY = "workload.trace"
COLUMNS = ("timestamp", "input_length", "output_length", "hash_ids")
#: Largest timestamp (ms) a line may carry: the longest run a scenario may simulate.
MAX_TIMESTAMP_MS = MAX_TIME_S * 1000.0


def _fail(path: Path, n: int, what: str) -> ScenarioError:
    return ScenarioError(f"{KEY}: {str(path)!r} line {n} {what}")


def _whole(x: object) -> bool:
    return not isinstance(x, bool) and (isinstance(x, int) or (
        isinstance(x, float) and math.isfinite(x) and x.is_integer()))


def _check_row(path: Path, n: int, row: object) -> None:
    """One line's fields: typed and in range, or an error naming the line and field."""
    missing = [c for c in COLUMNS if not isinstance(row, dict) or c not in row]
    if missing:
        raise _fail(path, n, f"lacks {', '.join(missing)} (a Mooncake trace has "
                             f"{', '.join(COLUMNS)})")
    t = row["timestamp"]
    if isinstance(t, bool) or not isinstance(t, int | float) or not (
            0 <= t <= MAX_TIMESTAMP_MS):
        raise _fail(path, n, f"has timestamp {excerpt(t)}, not a number of ms in "
                             f"[0, {MAX_TIMESTAMP_MS:g}]")
    for col in ("input_length", "output_length"):
        v = row[col]
        if not _whole(v) or not 1 <= v <= MAX_TOKENS:
            raise _fail(path, n, f"has {col} {excerpt(v)}, not a whole number of tokens "
                                 f"in [1, {MAX_TOKENS}]")
    ids = row["hash_ids"]
    if not isinstance(ids, list) or not all(
            isinstance(h, int) and not isinstance(h, bool) for h in ids):
        raise _fail(path, n, "has hash_ids that are not a list of integer block ids")


def read_jsonl(path: Path) -> pd.DataFrame:
    """The trace's rows as they are (columns :data:`COLUMNS`), checked: each line a JSON
    object with a timestamp in [0, :data:`MAX_TIMESTAMP_MS`], whole lengths in
    [1, ``MAX_TOKENS``] and a list of integer ``hash_ids``; at most ``MAX_REQUESTS`` lines."""
    path = files.regular_file(path, KEY, files.MAX_DATA_BYTES)
    rows = []
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            if len(rows) == MAX_REQUESTS:
                raise _fail(path, n, f"is past the {MAX_REQUESTS} requests a run may have")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise _fail(path, n, "is not UTF-8 text (a Mooncake trace is JSON Lines)"
                            ) from None
            try:
                row = files.parse_json(line, "line")
            except ScenarioError as exc:
                why = exc.problems[0].removeprefix("line: ")
                raise _fail(path, n, f"is {why}" if why.startswith("not") else why) from None
            _check_row(path, n, row)
            rows.append(row)
    if not rows:
        raise ScenarioError(f"{KEY}: {str(path)!r} has no requests")
    return pd.DataFrame(rows, columns=list(COLUMNS))


def load_mooncake(path: Path, block_tokens: int = 512) -> pd.DataFrame:
    """A Mooncake trace as columns ``arrival_s`` (from the first request), ``prompt_tokens``,
    ``output_tokens`` and ``hashes`` (tuple of the full blocks' ids), sorted by arrival.

    Parameters
    ----------
    path : Path
    block_tokens : int
        Tokens per hash id (512 in the published traces).
    """
    df = read_jsonl(path)
    t = df["timestamp"].to_numpy(dtype=float) / 1000.0
    prompt = df["input_length"].to_numpy(dtype=float).astype(np.int64)  # checked whole
    output = df["output_length"].to_numpy(dtype=float).astype(np.int64)
    ids = df["hash_ids"].tolist()
    counts = np.fromiter((len(h) for h in ids), dtype=np.int64, count=len(ids))
    bad = np.flatnonzero(counts != -(-prompt // block_tokens))
    if len(bad):
        i = int(bad[0])
        raise ScenarioError(f"{KEY}: {str(path)!r} line {i + 1} has {counts[i]} hash_ids for "
                            f"{prompt[i]} prompt tokens (expected ceil(input_length / "
                            f"{block_tokens}) = {-(-prompt[i] // block_tokens)}; "
                            f"workload.hash_block_tokens = {block_tokens})")
    full = prompt // block_tokens
    hashes = [tuple(h[:k]) for h, k in zip(ids, full.tolist(), strict=True)]
    t = t - t.min()
    order = np.argsort(t, kind="stable")
    return pd.DataFrame({
        "arrival_s": t[order],
        "prompt_tokens": prompt[order],
        "output_tokens": output[order],
        "hashes": [hashes[i] for i in order],
    })


def trace_reuse(df: pd.DataFrame, block_tokens: int = 512) -> dict:
    """Reuse of a raw trace (:func:`read_jsonl`) under an unbounded cache, as the traces'
    README defines it: walking the requests in order, a block is reused if its id appeared
    in any earlier request (partial last blocks included).

    Returns ``blocks`` (reused / all blocks) and ``tokens`` (reused blocks x 512, capped at
    the prompt, over all prompt tokens).
    """
    seen: set = set()
    reused_blocks = all_blocks = reused_tokens = 0
    for ids, n in zip(df["hash_ids"], df["input_length"], strict=True):
        hit = sum(1 for h in ids if h in seen)
        reused_blocks += hit
        all_blocks += len(ids)
        reused_tokens += min(hit * block_tokens, n)
        seen.update(ids)
    return {"blocks": reused_blocks / all_blocks,
            "tokens": reused_tokens / float(df["input_length"].sum())}
