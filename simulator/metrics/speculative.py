"""Summary metrics of speculative decoding (docs/speculative.md, docs/metrics.md)."""

from __future__ import annotations

import pandas as pd


def speculative_summary(requests: pd.DataFrame, draft_s: float, busy_s: float,
                        spec_steps: int, plain_steps: int) -> dict:
    """Acceptance and draft cost of a run with speculation.

    Parameters
    ----------
    requests : DataFrame
        requests.csv, with ``spec_steps`` and ``accepted_tokens`` per request.
    draft_s, busy_s : float
        Seconds spent drafting, and in the target's forwards (sum over stages).
    spec_steps, plain_steps : int
        Decode steps that speculated, and that decoded plainly (disable_by_batch_size).

    Returns
    -------
    dict
        ``acceptance_length_mean`` = 1 + sum(accepted drafts) / sum(verification steps), the
        tokens a sequence gains per verification step (vLLM's "mean acceptance length");
        ``draft_time_share`` = draft_s / (draft_s + busy_s); ``spec_step_fraction`` =
        spec_steps / (spec_steps + plain_steps).
    """
    steps = float(requests["spec_steps"].sum())
    accepted = float(requests["accepted_tokens"].sum())
    total = draft_s + busy_s
    decode_steps = spec_steps + plain_steps
    return {
        "acceptance_length_mean": 1.0 + accepted / steps if steps else float("nan"),
        "draft_time_share": draft_s / total if total > 0 else float("nan"),
        "draft_s": draft_s,
        "spec_step_fraction": spec_steps / decode_steps if decode_steps else float("nan"),
    }
