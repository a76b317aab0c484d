"""Replay of Mooncake traces (FAST'25): JSON Lines with prefix-block hashes.

One request per line: ``timestamp`` (ms from the trace start), ``input_length``,
``output_length`` and ``hash_ids``, one chained hash per 512-token block of the prompt
(``ceil(input_length / 512)`` ids; the last block is usually partial). A request carries the
ids of its *full* blocks (``Request.hashes``): only a full block can be cached and reused
(:mod:`simulator.engine.prefix`), and the engine splits each into ``512 / block_size`` KV
blocks. Also here: the trace's reuse under an infinite cache, the ceiling of any hit rate.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from simulator.errors import ScenarioError

KEY = "workload.trace"
COLUMNS = ("timestamp", "input_length", "output_length", "hash_ids")


def read_jsonl(path: Path) -> pd.DataFrame:
    """The trace's rows as they are (columns :data:`COLUMNS`), checked."""
    if not path.is_file():
        what = "is not a file" if path.exists() else "not found"
        raise ScenarioError(f"{KEY}: file {str(path)!r} {what}")
    rows = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ScenarioError(f"{KEY}: {str(path)!r} line {n} is not JSON ({exc.msg})"
                                    ) from None
            missing = [c for c in COLUMNS if not isinstance(row, dict) or c not in row]
            if missing:
                raise ScenarioError(f"{KEY}: {str(path)!r} line {n} lacks "
                                    f"{', '.join(missing)} (a Mooncake trace has "
                                    f"{', '.join(COLUMNS)})")
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
    try:
        t = df["timestamp"].to_numpy(dtype=float) / 1000.0
        prompt = df["input_length"].to_numpy(dtype=np.int64)
        output = df["output_length"].to_numpy(dtype=np.int64)
    except (ValueError, TypeError) as exc:
        raise ScenarioError(f"{KEY}: {str(path)!r} has a malformed value "
                            f"({str(exc).splitlines()[0]})") from None
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
        "prompt_tokens": np.maximum(prompt[order], 1),
        "output_tokens": np.maximum(output[order], 1),
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
