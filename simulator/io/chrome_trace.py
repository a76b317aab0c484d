"""Chrome trace / Perfetto JSON of a run: a track per replica stage, a span per step.

Open ``trace.json`` in ui.perfetto.dev (or chrome://tracing). Each replica is a process,
each pipeline stage a thread: a step is a complete event (``ph = "X"``) named by what it ran
(prefill, decode or both) with tokens, batch size and KV blocks in its args, and the TP
communication at its end as a nested ``all-reduce`` span; gaps between steps are the
bubbles. Each request is an async span on its replica (queued, prefill, decode phases).
Times are microseconds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

US = 1e6


def _step_name(prefill: np.ndarray, decode: np.ndarray) -> np.ndarray:
    return np.where(prefill > 0, np.where(decode > 0, "prefill+decode", "prefill"), "decode")


def _lines(requests: pd.DataFrame, steps: pd.DataFrame):
    """Trace events as JSON text, one per line (metadata, steps, communication, request
    phases). Formatted directly: json.dumps per event costs ~20 us, which is seconds for
    the hundreds of thousands of steps of a long run."""
    for r, g in steps.groupby("replica"):
        yield (f'{{"ph":"M","name":"process_name","pid":{int(r)},"tid":0,'
               f'"args":{{"name":"replica {int(r)}"}}}}')
        for stage in sorted(g["stage"].unique()):
            yield (f'{{"ph":"M","name":"thread_name","pid":{int(r)},"tid":{int(stage)},'
                   f'"args":{{"name":"stage {int(stage)}"}}}}')
    names = _step_name(steps["prefill_tokens"].to_numpy(), steps["decode_tokens"].to_numpy())
    cols = [steps[c].to_numpy().tolist() for c in
            ("replica", "stage", "start_s", "end_s", "prefill_tokens", "decode_tokens",
             "batch_size", "kv_blocks", "compute_s", "comm_s")]
    rows = zip(*cols, strict=True)
    for name, (r, st, s, e, p, d, b, kv, comp, comm) in zip(names.tolist(), rows, strict=True):
        yield (f'{{"ph":"X","name":"{name}","cat":"step","pid":{r},"tid":{st},'
               f'"ts":{s * US!r},"dur":{(e - s) * US!r},"args":{{"prefill_tokens":{p},'
               f'"decode_tokens":{d},"batch_size":{b},"kv_blocks":{kv}}}}}')
        if comm > 0:
            yield (f'{{"ph":"X","name":"all-reduce","cat":"comm","pid":{r},"tid":{st},'
                   f'"ts":{(s + comp) * US!r},"dur":{comm * US!r}}}')
    done = requests[requests["status"] == "completed"]
    cols = [done[c].to_numpy().tolist() for c in
            ("request_id", "replica", "arrival_s", "first_scheduled_s", "first_token_s",
             "finish_s", "prompt_tokens", "output_tokens")]
    for rid, r, a, s, f, e, p, o in zip(*cols, strict=True):
        base = f'"cat":"request","id":{rid},"pid":{r},"tid":0'
        yield (f'{{"ph":"b","name":"request",{base},"ts":{a * US!r},'
               f'"args":{{"prompt_tokens":{p},"output_tokens":{o}}}}}')
        for phase, t0, t1 in (("queued", a, s), ("prefill", s, f), ("decode", f, e)):
            yield f'{{"ph":"b","name":"{phase}",{base},"ts":{t0 * US!r}}}'
            yield f'{{"ph":"e","name":"{phase}",{base},"ts":{t1 * US!r}}}'
        yield f'{{"ph":"e","name":"request",{base},"ts":{e * US!r}}}'


def write_trace(path: str | Path, requests: pd.DataFrame, steps: pd.DataFrame) -> None:
    """Write ``trace.json`` in the Chrome trace event format."""
    with Path(path).open("w") as fh:
        fh.write('{"displayTimeUnit": "ms", "traceEvents": [\n')
        fh.write(",\n".join(_lines(requests, steps)))
        fh.write("\n]}\n")
