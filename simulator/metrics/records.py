"""Flat records appended during a run and turned into DataFrames at the end."""

from __future__ import annotations

from array import array

import numpy as np
import pandas as pd

from simulator.engine.request import Request
from simulator.engine.steplog import STEP_COLUMNS

REQUEST_COLUMNS = ["request_id", "arrival_s", "replica", "prompt_tokens", "output_tokens",
                   "first_scheduled_s", "first_token_s", "finish_s", "ttft_s", "tpot_s",
                   "e2e_s", "preemptions", "status", "retries", "reason", "generated_tokens",
                   "cached_prompt_tokens"]

_FLOAT_STEP = {"start_s", "end_s", "compute_s", "comm_s", "prefill_pairs"}
STEP_DTYPE = np.dtype([(c, np.float64 if c in _FLOAT_STEP else np.int64) for c in STEP_COLUMNS])

REQUEST_RECORD = ["request_id", "arrival_s", "replica", "prompt_tokens", "output_tokens",
                  "first_scheduled_s", "first_token_s", "finish_s", "preemptions", "status",
                  "retries", "reason", "generated_tokens",
                   "cached_prompt_tokens"]

_TEXT = {"status", "reason"}
REQUEST_DTYPE = np.dtype([(c, object if c in _TEXT else np.float64 if c.endswith("_s")
                           else np.int64) for c in REQUEST_RECORD])
_NUMBERS = [c for c in REQUEST_RECORD if c not in _TEXT]


class Recorder:
    """Collects one row per finished request and, optionally, one per stage step.

    Records are copied as they come into flat arrays of numbers (a request's text as a
    code), so a million-request run holds compact arrays rather than a Python tuple per
    request or per step.

    Parameters
    ----------
    keep_steps : bool
        Keep per-step rows (``step`` is None otherwise: the engine then skips building them).
    fold : object, optional
        Without ``keep_steps``: takes the step records instead (``fold.append(row)``,
        ``fold.bulk(columns)``; :class:`simulator.metrics.power.StepFold`), which sums
        them as they come.
    """

    def __init__(self, keep_steps: bool = True, speculative: bool = False,
                 fold=None) -> None:
        # ``step(row)``: a step's record (a tuple of the STEP_COLUMNS), its numbers copied
        # at once into one flat array of doubles (integers up to 2**53 are exact): no tuple
        # per step outlives the call, for the garbage collector to traverse and for
        # steps_frame to read back from all over the heap.
        self._flat = array("d")
        self.step = self._step if keep_steps else None
        self._bulk: list[dict] = []  # decode runs' records, as columns
        # Short decode runs' records in compact form (``step_run``), expanded at the end.
        self._runs = (array("d"), array("d"), array("d"), array("q"))
        self.step_run = self._step_run if keep_steps else None
        if not keep_steps and fold is not None:
            self.step, self.step_bulk = fold.append, fold.bulk
        # The numbers of each finished request's row (REQUEST_RECORD less the text) in one
        # flat array of doubles (integers up to 2**53 are exact), and a code per row for its
        # (status, reason) text: compact for a million requests, no tuple per request.
        self._numbers = array("d")
        self._texts: dict[tuple[str, str], int] = {}
        self._codes = array("q")
        # Speculative decoding: per-request verification steps and accepted drafts, kept
        # (and written as columns) only when it is on, so other runs' files do not change.
        self._spec: dict[int, tuple[int, int]] | None = {} if speculative else None
        # (request_id, requeued_s, readmitted_s) per reroute of an admitted request after a
        # failure: the time series count it as queued, not running, in between. Not a
        # column of requests.csv (a request may be rerouted several times).
        self._requeues: list[tuple[int, float, float]] = []

    def request(self, r: Request) -> None:
        self._numbers.fromlist([r.id, r.arrival_s, r.replica, r.prompt, r.output,
                                r.first_scheduled_s, r.first_token_s, r.finish_s,
                                r.preemptions, r.retries, r.generated, r.cached_tokens])
        texts = self._texts
        self._codes.append(texts.setdefault((r.status, r.reason), len(texts)))
        if self._spec is not None:
            self._spec[r.id] = (r.spec_steps, r.spec_accepted)
        if r.requeued is not None:
            self._requeues += [(r.id, a, b) for a, b in r.requeued]

    def _request_rows(self) -> pd.DataFrame:
        """The request rows as recorded (REQUEST_RECORD columns, in completion order)."""
        if not self._codes:  # text columns typed as the built ones infer theirs
            return pd.DataFrame(columns=REQUEST_RECORD).astype({c: str for c in _TEXT})
        flat = np.frombuffer(self._numbers, dtype=np.float64).reshape(-1, len(_NUMBERS))
        cols = {c: flat[:, i].astype(REQUEST_DTYPE[c]) for i, c in enumerate(_NUMBERS)}
        texts = np.empty((len(self._texts), 2), dtype=object)
        texts[:] = list(self._texts)
        codes = np.frombuffer(self._codes, dtype=np.int64)
        cols["status"], cols["reason"] = texts[codes, 0], texts[codes, 1]
        return pd.DataFrame({c: cols[c] for c in REQUEST_RECORD})

    def requests_frame(self) -> pd.DataFrame:
        """Per-request table, ordered by request id, with derived latencies.

        ttft = first_token - arrival; tpot = (finish - first_token) / (output - 1), NaN for
        one-token outputs; e2e = finish - arrival, NaN unless completed (a request that was
        not served has no latency). A rejected request never ran: its finish is NaN too.
        """
        df = self._request_rows()
        df = df.sort_values("request_id", kind="stable").reset_index(drop=True)
        df["ttft_s"] = df["first_token_s"] - df["arrival_s"]
        decode_tokens = (df["output_tokens"] - 1).astype(float).replace(0, np.nan)
        df["tpot_s"] = (df["finish_s"] - df["first_token_s"]) / decode_tokens
        df.loc[df["status"] == "rejected", "finish_s"] = np.nan
        df["e2e_s"] = (df["finish_s"] - df["arrival_s"]).where(df["status"] == "completed")
        if self._spec is None:
            return df[REQUEST_COLUMNS]
        spec = [self._spec.get(i, (0, 0)) for i in df["request_id"]]
        df["spec_steps"] = np.array([s for s, _ in spec], dtype=np.int64)
        df["accepted_tokens"] = np.array([a for _, a in spec], dtype=np.int64)
        # Accepted drafts per verification step, mean over the request's steps.
        df["accepted_per_step"] = df["accepted_tokens"] / df["spec_steps"].replace(0, np.nan)
        return df[REQUEST_COLUMNS + ["spec_steps", "accepted_tokens", "accepted_per_step"]]

    def requeues_frame(self) -> pd.DataFrame:
        """One row per reroute of an admitted request after a failure: ``request_id``,
        ``requeued_s`` (the failure), ``readmitted_s`` (admitted again; NaN if never)."""
        return pd.DataFrame(self._requeues,
                            columns=["request_id", "requeued_s", "readmitted_s"]
                            ).astype({"request_id": np.int64, "requeued_s": float,
                                      "readmitted_s": float})

    def _step(self, row: tuple) -> None:
        self._flat.fromlist(list(row))  # array.fromlist: twice as fast as extend

    def _step_run(self, run: tuple) -> None:
        """Records of a short decode run in compact form: ``(replica, ends, off, n,
        computes, comm, used, needs, kv)`` for ``m = len(computes)`` steps, as
        :func:`run_columns` expands them. Copied at once into flat arrays of doubles and
        integers, while the run's values are fresh in the cache: converting Python floats
        scattered over a long run's memory costs several times more at the end."""
        replica, ends, off, n, computes, comm, used, needs, kv = run
        heads, times, work, blocks = self._runs
        heads.fromlist([replica, off, n, comm, used, kv, len(computes)])
        times.fromlist(ends)  # lists (fromlist: faster than extend)
        work.fromlist(computes)
        blocks.fromlist(needs)

    def step_bulk(self, columns: dict) -> None:
        """Records of many steps at once, as equal-length column arrays."""
        self._bulk.append(columns)

    def steps_frame(self) -> pd.DataFrame:
        """Per-step table ordered by (start_s, replica, stage), ties in record order."""
        flat = np.frombuffer(self._flat, dtype=np.float64).reshape(-1, len(STEP_COLUMNS))
        cols = {c: flat[:, i].astype(STEP_DTYPE[c]) for i, c in enumerate(STEP_COLUMNS)}
        bulk = self._bulk + ([run_columns(*self._runs)] if self._runs[0] else [])
        if bulk:
            cols = {c: np.concatenate([cols[c], *(b[c] for b in bulk)])
                    for c in STEP_COLUMNS}
        order = _stable_order(cols["start_s"], cols["replica"], cols["stage"])
        # Each column its own contiguous array, and the frame built around them without
        # pandas copying them again into 2-D blocks.
        cols = {c: (np.ascontiguousarray(v) if order is None else v[order])
                for c, v in cols.items()}
        return pd.DataFrame(cols, copy=False)


def run_columns(heads, times, work, blocks) -> dict[str, np.ndarray]:
    """The step records of decode runs kept in compact form, as columns (run after run).

    A run of ``m`` recorded steps of ``n`` decoders is 7 numbers in ``heads`` (doubles:
    integers up to 2**53 are exact): ``replica, off, n, comm, used, kv, m``; ``m + 1``
    times in ``times`` (``ends``); ``m`` in ``work`` (``computes``) and in ``blocks``
    (``needs``). Step j (0-based) starts at ``ends[j] + off`` (the overhead, on the clock
    grid), ends at ``ends[j + 1]``, computes ``computes[j]`` and communicates ``comm``
    seconds, with ``used + needs[0] + ... + needs[j]`` KV blocks in use, reading
    ``kv + (j + 1) * n`` KV entries: the values, and the operations on them, of a tuple per
    step (:meth:`Recorder.step`), in numpy.
    """
    head = np.frombuffer(heads, dtype=np.float64).reshape(-1, 7)
    m = head[:, 6].astype(np.int64)
    total = int(m.sum())

    def per_row(col: int, dtype) -> np.ndarray:
        return np.repeat(head[:, col].astype(dtype), m)

    first = np.cumsum(m) - m  # each run's first row
    j = np.arange(total) - np.repeat(first, m)  # step within its run
    at = np.arange(total) + np.repeat(np.arange(len(m)), m)  # each row's start in times
    ends = np.frombuffer(times, dtype=np.float64)
    need = np.frombuffer(blocks, dtype=np.int64)
    grown = np.cumsum(need)
    grown -= np.repeat(grown[first] - need[first], m)  # cumulative within each run
    every = per_row(2, np.int64)
    zeros = np.zeros(total, dtype=np.int64)
    return {
        "replica": per_row(0, np.int64), "stage": zeros, "stream": zeros,
        "start_s": ends[at] + per_row(1, np.float64), "end_s": ends[at + 1],
        "prefill_tokens": zeros, "decode_tokens": every, "batch_size": every,
        "compute_s": np.frombuffer(work, dtype=np.float64).copy(),
        "comm_s": per_row(3, np.float64), "kv_blocks": per_row(4, np.int64) + grown,
        "prefill_pairs": np.zeros(total), "prefill_ctx": zeros,
        "decode_kv": per_row(5, np.int64) + (j + 1) * every, "sampled": every,
    }


def _stable_order(*keys: np.ndarray) -> np.ndarray | None:
    """The stable lexicographic order of rows by ``keys`` (first key most significant), the
    order ``DataFrame.sort_values(kind="stable")`` gives; None when the rows already are in
    it (most runs record their steps in time order)."""
    n = len(keys[0])
    if n < 2:
        return None
    tied = np.ones(n - 1, dtype=bool)  # rows i and i + 1 equal on the keys so far
    for k in keys:
        d = np.diff(k)
        if (tied & ~(d >= 0)).any():  # out of order (or NaN, which sorts last)
            return np.lexsort(keys[::-1])
        tied &= d == 0
    return None
