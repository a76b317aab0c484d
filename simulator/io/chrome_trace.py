"""Chrome trace / Perfetto JSON of a run: a track per replica stage, a span per step.

Open ``trace.json`` in ui.perfetto.dev (or chrome://tracing). Each replica is a process,
each pipeline stage a thread: a step is a complete event (``ph = "X"``) named by what it ran
(prefill, decode or both) with tokens, batch size and KV blocks in its args, and the TP
communication at its end as a nested ``all-reduce`` span; gaps between steps are the
bubbles. Each request is an async span on its replica (queued, prefill, decode phases).
Times are microseconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

US = 1e6


def _step_name(prefill: np.ndarray, decode: np.ndarray) -> np.ndarray:
    return np.where(prefill > 0, np.where(decode > 0, "prefill+decode", "prefill"), "decode")


def events(requests: pd.DataFrame, steps: pd.DataFrame) -> list[dict]:
    """Trace events (metadata, steps, communication, request phases)."""
    out: list[dict] = []
    for r, g in steps.groupby("replica"):
        out.append({"ph": "M", "name": "process_name", "pid": int(r), "tid": 0,
                    "args": {"name": f"replica {r}"}})
        for stage in sorted(g["stage"].unique()):
            out.append({"ph": "M", "name": "thread_name", "pid": int(r), "tid": int(stage),
                        "args": {"name": f"stage {stage}"}})
    names = _step_name(steps["prefill_tokens"].to_numpy(), steps["decode_tokens"].to_numpy())
    cols = [steps[c].to_numpy().tolist() for c in
            ("replica", "stage", "start_s", "end_s", "prefill_tokens", "decode_tokens",
             "batch_size", "kv_blocks", "compute_s", "comm_s")]
    rows = zip(*cols, strict=True)
    for name, (r, st, s, e, p, d, b, kv, comp, comm) in zip(names.tolist(), rows, strict=True):
        out.append({"ph": "X", "name": name, "cat": "step", "pid": r, "tid": st,
                    "ts": s * US, "dur": (e - s) * US,
                    "args": {"prefill_tokens": p, "decode_tokens": d, "batch_size": b,
                             "kv_blocks": kv}})
        if comm > 0:
            out.append({"ph": "X", "name": "all-reduce", "cat": "comm", "pid": r, "tid": st,
                        "ts": (s + comp) * US, "dur": comm * US})
    done = requests[requests["status"] == "completed"]
    cols = [done[c].to_numpy().tolist() for c in
            ("request_id", "replica", "arrival_s", "first_scheduled_s", "first_token_s",
             "finish_s", "prompt_tokens", "output_tokens")]
    for rid, r, a, s, f, e, p, o in zip(*cols, strict=True):
        base = {"cat": "request", "id": rid, "pid": r, "tid": 0}
        out.append({**base, "ph": "b", "name": "request", "ts": a * US,
                    "args": {"prompt_tokens": p, "output_tokens": o}})
        for phase, t0, t1 in (("queued", a, s), ("prefill", s, f), ("decode", f, e)):
            out.append({**base, "ph": "b", "name": phase, "ts": t0 * US})
            out.append({**base, "ph": "e", "name": phase, "ts": t1 * US})
        out.append({**base, "ph": "e", "name": "request", "ts": e * US})
    return out


def write_trace(path: str | Path, requests: pd.DataFrame, steps: pd.DataFrame) -> None:
    """Write ``trace.json`` in the Chrome trace event format."""
    with Path(path).open("w") as fh:
        fh.write('{"displayTimeUnit": "ms", "traceEvents": [\n')
        first = True
        for ev in events(requests, steps):
            fh.write(("" if first else ",\n") + json.dumps(ev, separators=(",", ":")))
            first = False
        fh.write("\n]}\n")
