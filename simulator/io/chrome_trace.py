"""Chrome trace / Perfetto JSON of a run: a track per replica stage, a span per step.

Open ``trace.json.gz`` (or ``trace.json`` with ``[output] trace_gzip = false``) in
ui.perfetto.dev (or chrome://tracing), which read gzip directly: compressed at level 1 by
ISA-L's deflate (``isal.igzip``, a standard gzip stream, 5x less CPU than zlib's level 1
and a smaller file) the file is about 9x smaller (the Vidur workload's 76 MB to 8.4 MB in
0.06-0.09 CPU s, where zlib took 0.31-0.42 s for 9.4 MB). Each replica is a process,
each pipeline stage a thread: a step is a complete event (``ph = "X"``) named by what it ran
(prefill, decode or both) with tokens, batch size and KV blocks in its args, and the TP
communication at its end as a nested ``all-reduce`` span; gaps between steps are the
bubbles. Each request is an async span on its replica (queued, prefill, decode phases).
Times are microseconds, rounded to the nanosecond (Perfetto's own resolution).

The events are formatted column-wise by Arrow's compute kernels (numbers to shortest
round-trip text, then element-wise concatenation), not one Python f-string per event: a
long run has hundreds of thousands of steps and ten events per request. The steps are
formatted in blocks of :data:`BLOCK_ROWS` rows, and a gzip file is compressed in a thread of
its own while the next block is formatted (both release the GIL: they overlap on a second
core); the file's content is the same as formatting everything at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import chain
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from isal import igzip

US = 1e6
#: Step rows formatted together (a block's text is compressed while the next is formatted).
BLOCK_ROWS = 65_536


def _us(seconds: np.ndarray) -> np.ndarray:
    """Seconds as microseconds to the nanosecond: Perfetto keeps integer nanoseconds, and
    the shorter text makes the file about a third smaller."""
    return np.round(seconds * US, 3)


#: What a step ran, by index: decode only, prefill only, both.
STEP_NAMES = pa.array(["decode", "prefill", "prefill+decode"])


def _step_name(prefill: np.ndarray, decode: np.ndarray) -> pa.Array:
    """What each step ran, as Arrow strings taken from :data:`STEP_NAMES` (a numpy array
    of strings costs 20x more to build and convert)."""
    return STEP_NAMES.take(np.where(prefill > 0, np.where(decode > 0, 2, 1), 0))


def _text(value) -> pa.Array | str:
    """A column as Arrow strings (numbers in shortest round-trip form), or as one literal
    text when every row holds the same bits (a lone replica's id, stage 0); text stays."""
    if isinstance(value, str) or (isinstance(value, pa.Array)
                                  and pa.types.is_string(value.type)):
        return value
    arr = np.asarray(value)
    if _constant(arr):  # the text Arrow gives each row, once
        return pc.cast(pa.array(arr[:1]), pa.string())[0].as_py()
    arr = pa.array(arr)
    return arr if pa.types.is_string(arr.type) else pc.cast(arr, pa.string())


def _constant(arr: np.ndarray) -> bool:
    """Whether every element has the bits of the first (8-byte numbers only: -0.0 and 0.0
    compare equal but print apart)."""
    if len(arr) == 0 or arr.dtype.kind not in "iuf" or arr.dtype.itemsize != 8:
        return False
    bits = arr.view(np.uint64)
    return bool((bits == bits[0]).all())


def _events(rows: int, *parts) -> pa.Array:
    """One JSON event per row (``rows`` of them) from alternating literal text and
    columns, each ending ',\\n'.

    A column of one value joins as literal text, and adjacent literals as one part: the
    same text, joined from fewer parts (Arrow's join costs ~16 ns per row and part)."""
    texts: list[pa.Array | str] = []
    for part in (*parts, ",\n"):
        text = _text(part)
        if isinstance(text, str) and texts and isinstance(texts[-1], str):
            texts[-1] += text
        else:
            texts.append(text)
    if all(isinstance(t, str) for t in texts):  # every row the same event
        return pa.array(["".join(texts)] * rows, pa.string())
    joined = pc.binary_join_element_wise(*texts, "")
    return joined.combine_chunks() if isinstance(joined, pa.ChunkedArray) else joined


def _bytes(events: pa.Array) -> memoryview:
    """The text of a string array's rows, end to end (its data buffer between offsets)."""
    if len(events) == 0:
        return memoryview(b"")
    offsets = np.frombuffer(events.buffers()[1], dtype=np.int32)
    first, last = offsets[events.offset], offsets[events.offset + len(events)]
    return memoryview(events.buffers()[2])[first:last]


def _metadata(steps: pd.DataFrame) -> list[str]:
    lines = []
    for r, g in steps.groupby("replica"):
        lines.append(f'{{"ph":"M","name":"process_name","pid":{int(r)},"tid":0,'
                     f'"args":{{"name":"replica {int(r)}"}}}}')
        for stage in sorted(g["stage"].unique()):
            lines.append(f'{{"ph":"M","name":"thread_name","pid":{int(r)},'
                         f'"tid":{int(stage)},"args":{{"name":"stage {int(stage)}"}}}}')
    return lines


def _step_events(steps: pd.DataFrame) -> Iterator[pa.Array]:
    """The steps' events (a span each, then an ``all-reduce`` span per step that
    communicates), in blocks of :data:`BLOCK_ROWS` steps: a generator, so the caller can
    write a block while the next is formatted."""
    col = {c: steps[c].to_numpy() for c in steps.columns}
    blocks = [slice(i, i + BLOCK_ROWS) for i in range(0, len(steps), BLOCK_ROWS)]
    for b in blocks:
        yield _span_events({c: v[b] for c, v in col.items()})
    for b in blocks:
        part = {c: v[b] for c, v in col.items()}
        comm = part["comm_s"] > 0
        if comm.any():
            yield _events(int(comm.sum()),
                          '{"ph":"X","name":"all-reduce","cat":"comm","pid":',
                          part["replica"][comm], ',"tid":', part["stage"][comm], ',"ts":',
                          _us(part["start_s"][comm] + part["compute_s"][comm]), ',"dur":',
                          _us(part["comm_s"][comm]), "}")


def _span_events(col: dict[str, np.ndarray]) -> pa.Array:
    start, end = col["start_s"], col["end_s"]
    return _events(len(start), '{"ph":"X","name":"',
                   _step_name(col["prefill_tokens"], col["decode_tokens"]),
                   '","cat":"step","pid":', col["replica"], ',"tid":', col["stage"],
                   ',"ts":', _us(start), ',"dur":', _us(end - start),
                   ',"args":{"prefill_tokens":', col["prefill_tokens"],
                   ',"decode_tokens":', col["decode_tokens"], ',"batch_size":',
                   col["batch_size"], ',"kv_blocks":', col["kv_blocks"], "}}")


def _request_events(requests: pd.DataFrame) -> list[pa.Array]:
    done = requests[requests["status"] == "completed"]
    if done.empty:
        return []
    col = {c: done[c].to_numpy() for c in ("request_id", "replica", "arrival_s",
                                           "first_scheduled_s", "first_token_s",
                                           "finish_s", "prompt_tokens", "output_tokens")}
    # Each column as text once: the ten events of a request repeat its id, replica, times.
    base = ('"cat":"request","id":', _text(col["request_id"]), ',"pid":',
            _text(col["replica"]), ',"tid":0')
    a, s, f, e = (_text(_us(col[k])) for k in ("arrival_s", "first_scheduled_s",
                                                "first_token_s", "finish_s"))
    n = len(done)
    out = [_events(n, '{"ph":"b","name":"request",', *base, ',"ts":', a,
                   ',"args":{"prompt_tokens":', col["prompt_tokens"], ',"output_tokens":',
                   col["output_tokens"], "}}")]
    for phase, t0, t1 in (("queued", a, s), ("prefill", s, f), ("decode", f, e)):
        out.append(_events(n, f'{{"ph":"b","name":"{phase}",', *base, ',"ts":', t0, "}"))
        out.append(_events(n, f'{{"ph":"e","name":"{phase}",', *base, ',"ts":', t1, "}"))
    out.append(_events(n, '{"ph":"e","name":"request",', *base, ',"ts":', e, "}"))
    return out


#: The process id of the KV-transfer track (disaggregated pools), one thread per decode
#: replica receiving.
TRANSFER_PID = 1_000_000


def _transfer_events(requests: pd.DataFrame) -> list[pa.Array]:
    """A complete event per KV transfer of a disaggregated run (none without pools)."""
    if "kv_transfer_s" not in requests:
        return []
    moved = requests[requests["kv_transfer_s"].notna()]
    if moved.empty:
        return []
    col = {c: moved[c].to_numpy() for c in ("request_id", "prefill_replica",
                                            "decode_replica", "kv_transfer_start_s",
                                            "kv_transfer_s", "kv_bytes", "decode_wait_s")}
    return [_events(len(moved), '{"ph":"X","name":"kv transfer","cat":"transfer","pid":',
                    str(TRANSFER_PID), ',"tid":', col["decode_replica"], ',"ts":',
                    _us(col["kv_transfer_start_s"]), ',"dur":', _us(col["kv_transfer_s"]),
                    ',"args":{"request":', col["request_id"], ',"from_replica":',
                    col["prefill_replica"], ',"bytes":', col["kv_bytes"].astype(np.int64),
                    ',"admission_wait_us":', _us(col["decode_wait_s"]), "}}")]


def _transfer_metadata(requests: pd.DataFrame) -> list[str]:
    if "kv_transfer_s" not in requests or requests["kv_transfer_s"].isna().all():
        return []
    lines = [f'{{"ph":"M","name":"process_name","pid":{TRANSFER_PID},"tid":0,'
             f'"args":{{"name":"KV transfers"}}}}']
    for r in sorted(requests.loc[requests["kv_transfer_s"].notna(), "decode_replica"].unique()):
        lines.append(f'{{"ph":"M","name":"thread_name","pid":{TRANSFER_PID},"tid":{int(r)},'
                     f'"args":{{"name":"to replica {int(r)}"}}}}')
    return lines


def trace_window(steps: pd.DataFrame, max_steps: int) -> float | None:
    """The end of the time window a trace of at most ``max_steps`` steps covers: the start
    of the first step left out (steps in start order); None when every step fits (or
    ``max_steps`` is 0: no bound)."""
    if max_steps <= 0 or len(steps) <= max_steps:
        return None
    start = np.sort(steps["start_s"].to_numpy(dtype=float), kind="stable")
    return float(start[max_steps])


def bounded(requests: pd.DataFrame, steps: pd.DataFrame, until_s: float | None
            ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The requests arriving and the steps starting before ``until_s`` (all when None)."""
    if until_s is None:
        return requests, steps
    return (requests[requests["arrival_s"].to_numpy() < until_s],
            steps[steps["start_s"].to_numpy() < until_s])


def json_bytes(requests: pd.DataFrame, steps: pd.DataFrame, sample: int = 2000) -> float:
    """The size of the trace's JSON (uncompressed, as Perfetto holds it in memory),
    estimated from the events of the first ``sample`` steps and requests (the columns and
    digits of this run; within a few percent of the file)."""
    total = 0.0
    for frame, events in ((steps, lambda f: list(_step_events(f))),
                          (requests, lambda f: _request_events(f) + _transfer_events(f))):
        if len(frame):
            head = frame.head(sample)
            size = sum(len(_bytes(e)) for e in events(head))
            total += size * len(frame) / len(head)
    return total


def write_trace(path: str | Path, requests: pd.DataFrame, steps: pd.DataFrame) -> None:
    """Write ``trace.json`` in the Chrome trace event format (JSON object form); a path
    ending in ``.gz`` is gzip-compressed (ISA-L level 1: fast, about 9x smaller) in a second
    thread, block by block as the events are formatted."""
    path = Path(path)
    gz = path.suffix == ".gz"
    opened = igzip.open(path, "wb", compresslevel=1) if gz else path.open("wb")
    with opened as fh, ThreadPoolExecutor(1) as pool:
        # One worker writes the blocks in the order they are submitted; the memoryviews
        # keep their Arrow buffers alive until then.
        write = (lambda data: pool.submit(fh.write, data)) if gz else fh.write
        pending = [write(b'{"displayTimeUnit": "ms", "traceEvents": [\n')]
        for events in chain.from_iterable(f(t) for f, t in (
                (_step_events, steps), (_request_events, requests),
                (_transfer_events, requests))):
            pending.append(write(_bytes(events)))
        # The metadata events come last: the array's final element takes no comma.
        meta = _metadata(steps) + _transfer_metadata(requests)
        pending.append(write(",\n".join(meta or ['{"ph":"M","name":"trace"}']).encode()))
        pending.append(write(b"\n]}\n"))
        if gz:
            for done in pending:
                done.result()  # re-raises a failure to write
