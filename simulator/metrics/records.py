"""Flat records appended during a run and turned into DataFrames at the end."""

from __future__ import annotations

import numpy as np
import pandas as pd

from simulator.engine.request import Request

REQUEST_COLUMNS = ["request_id", "arrival_s", "replica", "prompt_tokens", "output_tokens",
                   "first_scheduled_s", "first_token_s", "finish_s", "ttft_s", "tpot_s",
                   "e2e_s", "preemptions", "status"]
STEP_COLUMNS = ["replica", "stage", "start_s", "end_s", "prefill_tokens", "decode_tokens",
                "batch_size", "compute_s", "comm_s", "kv_blocks"]


class Recorder:
    """Collects one row per finished request and one per stage step."""

    def __init__(self) -> None:
        self.requests: list[tuple] = []
        self.steps: list[tuple] = []
        self.step = self.steps.append  # bound method: the hot path appends directly

    def request(self, r: Request) -> None:
        self.requests.append((r.id, r.arrival_s, r.replica, r.prompt, r.output,
                              r.first_scheduled_s, r.first_token_s, r.finish_s,
                              r.preemptions, r.status))

    def requests_frame(self) -> pd.DataFrame:
        """Per-request table, ordered by request id, with derived latencies.

        ttft = first_token - arrival; tpot = (finish - first_token) / (output - 1), NaN for
        one-token outputs; e2e = finish - arrival.
        """
        cols = ["request_id", "arrival_s", "replica", "prompt_tokens", "output_tokens",
                "first_scheduled_s", "first_token_s", "finish_s", "preemptions", "status"]
        df = pd.DataFrame.from_records(self.requests, columns=cols)
        df = df.sort_values("request_id", kind="stable").reset_index(drop=True)
        df["ttft_s"] = df["first_token_s"] - df["arrival_s"]
        decode_tokens = (df["output_tokens"] - 1).astype(float).replace(0, np.nan)
        df["tpot_s"] = (df["finish_s"] - df["first_token_s"]) / decode_tokens
        df["e2e_s"] = df["finish_s"] - df["arrival_s"]
        return df[REQUEST_COLUMNS]

    def steps_frame(self) -> pd.DataFrame:
        df = pd.DataFrame.from_records(self.steps, columns=STEP_COLUMNS)
        return df.sort_values(["start_s", "replica", "stage"], kind="stable",
                              ignore_index=True)
