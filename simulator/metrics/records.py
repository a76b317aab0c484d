"""Flat records appended during a run and turned into DataFrames at the end."""

from __future__ import annotations

import numpy as np
import pandas as pd

from simulator.engine.request import Request

REQUEST_COLUMNS = ["request_id", "arrival_s", "replica", "prompt_tokens", "output_tokens",
                   "first_scheduled_s", "first_token_s", "finish_s", "ttft_s", "tpot_s",
                   "e2e_s", "preemptions", "status", "retries", "reason", "generated_tokens",
                   "cached_prompt_tokens"]
STEP_COLUMNS = ["replica", "stage", "stream", "start_s", "end_s", "prefill_tokens", "decode_tokens",
                "batch_size", "compute_s", "comm_s", "kv_blocks", "prefill_pairs", "prefill_ctx",
                "decode_kv", "sampled"]

_FLOAT_STEP = {"start_s", "end_s", "compute_s", "comm_s", "prefill_pairs"}
STEP_DTYPE = np.dtype([(c, np.float64 if c in _FLOAT_STEP else np.int64) for c in STEP_COLUMNS])

REQUEST_RECORD = ["request_id", "arrival_s", "replica", "prompt_tokens", "output_tokens",
                  "first_scheduled_s", "first_token_s", "finish_s", "preemptions", "status",
                  "retries", "reason", "generated_tokens",
                   "cached_prompt_tokens"]

_TEXT = {"status", "reason"}
REQUEST_DTYPE = np.dtype([(c, object if c in _TEXT else np.float64 if c.endswith("_s")
                           else np.int64) for c in REQUEST_RECORD])


class Recorder:
    """Collects one row per finished request and, optionally, one per stage step.

    Request rows are packed into columnar chunks of ``chunk`` rows as they arrive, so a
    million-request run holds compact arrays rather than a Python tuple per request.

    Parameters
    ----------
    keep_steps : bool
        Keep per-step rows (``step`` is None otherwise: the engine then skips building them).
    chunk : int
        Request rows per packed chunk.
    fold : object, optional
        Without ``keep_steps``: takes the step records instead (``fold.append(row)``,
        ``fold.bulk(columns)``; :class:`simulator.metrics.power.StepFold`), which sums
        them as they come.
    """

    def __init__(self, keep_steps: bool = True, chunk: int = 65536,
                 speculative: bool = False, fold=None) -> None:
        self.steps: list[tuple] = []
        self.step = self.steps.append if keep_steps else None
        self._bulk: list[dict] = []  # decode runs' records, as columns
        if not keep_steps and fold is not None:
            self.step, self.step_bulk = fold.append, fold.bulk
        self._rows: list[tuple] = []
        self._chunks: list[pd.DataFrame] = []
        self._chunk = chunk
        # Speculative decoding: per-request verification steps and accepted drafts, kept
        # (and written as columns) only when it is on, so other runs' files do not change.
        self._spec: dict[int, tuple[int, int]] | None = {} if speculative else None
        # (request_id, requeued_s, readmitted_s) per reroute of an admitted request after a
        # failure: the time series count it as queued, not running, in between. Not a
        # column of requests.csv (a request may be rerouted several times).
        self._requeues: list[tuple[int, float, float]] = []

    def request(self, r: Request) -> None:
        self._rows.append((r.id, r.arrival_s, r.replica, r.prompt, r.output,
                           r.first_scheduled_s, r.first_token_s, r.finish_s,
                           r.preemptions, r.status, r.retries, r.reason, r.generated,
                           r.cached_tokens))
        if self._spec is not None:
            self._spec[r.id] = (r.spec_steps, r.spec_accepted)
        if r.requeued is not None:
            self._requeues += [(r.id, a, b) for a, b in r.requeued]
        if len(self._rows) >= self._chunk:
            self._pack()

    def _pack(self) -> None:
        if self._rows:
            packed = np.array(self._rows, dtype=REQUEST_DTYPE)  # one C loop over the tuples
            self._chunks.append(pd.DataFrame(
                {c: pd.Categorical(packed[c]) if c in _TEXT else packed[c]
                 for c in REQUEST_RECORD}))
            self._rows = []

    def requests_frame(self) -> pd.DataFrame:
        """Per-request table, ordered by request id, with derived latencies.

        ttft = first_token - arrival; tpot = (finish - first_token) / (output - 1), NaN for
        one-token outputs; e2e = finish - arrival, NaN unless completed (a request that was
        not served has no latency). A rejected request never ran: its finish is NaN too.
        """
        self._pack()
        if self._chunks:
            df = pd.concat(self._chunks, ignore_index=True)
        else:
            df = pd.DataFrame(columns=REQUEST_RECORD)
        df["status"] = df["status"].astype(str)
        df["reason"] = df["reason"].astype(str)
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

    def step_bulk(self, columns: dict) -> None:
        """Records of many steps at once, as equal-length column arrays."""
        self._bulk.append(columns)

    def steps_frame(self) -> pd.DataFrame:
        """Per-step table ordered by (start_s, replica, stage), ties in record order."""
        # A structured array reads the tuples in one C loop: half the time of from_records,
        # which goes through object columns (a second per 200k steps).
        packed = np.array(self.steps, dtype=STEP_DTYPE)
        cols = {c: packed[c] for c in STEP_COLUMNS}
        if self._bulk:
            cols = {c: np.concatenate([cols[c], *(b[c] for b in self._bulk)])
                    for c in STEP_COLUMNS}
        order = _stable_order(cols["start_s"], cols["replica"], cols["stage"])
        # Each column its own contiguous array, and the frame built around them without
        # pandas copying them again into 2-D blocks.
        cols = {c: (np.ascontiguousarray(v) if order is None else v[order])
                for c, v in cols.items()}
        return pd.DataFrame(cols, copy=False)


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
