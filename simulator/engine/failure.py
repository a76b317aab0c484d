"""What a replica's failure does to its requests: every request it held loses its KV and
goes back to the cluster with its progress so far, the tokens of the decode-run steps that
ended before the failure included (:func:`lost_requests`). The replica itself
(:meth:`simulator.engine.replica.Replica.fail`) stops its processes and starts over empty.
"""

from __future__ import annotations

import numpy as np

from simulator.engine.batching import ContinuousBatcher
from simulator.engine.request import Request


def lost_requests(streams: list[ContinuousBatcher], runs: list[tuple | None],
                  now: float) -> list[Request]:
    """The requests of ``streams`` at a failure at ``now``, with their progress written back
    and their KV gone; ``runs[s]`` is stream s's decode run under way (its step ends first),
    or None."""
    lost: list[Request] = []
    for st, run in zip(streams, runs, strict=True):
        # The steps of a decode run under way that ended by now did happen: their tokens
        # count (the scheduled step and the extra ones alike).
        done = 0
        if run is not None:  # (not its last step: that one may finish requests)
            done = min(int(np.searchsorted(run[0], now, side="right")), len(run[0]) - 1)
        if done:
            st.emit_run(run[0][:done])
        st.sync_decoders()
        for req, last in zip(st.decoding.values(), st.last_tokens(), strict=True):
            req.generated += st.k - req.k0 + done  # tokens it had produced
            req.last_token_s = last  # the next gap runs from its last token
        lost += [*st.waiting, *st.prefilling, *st.decoding.values(), *st.swapped,
                 *(r for r, _ in st.arrived)]  # (disaggregated: KV just arrived)
    for req in lost:
        req.blocks = req.computed = 0
        req.target = req.prompt + req.generated
        if req.generated and req.last_token_s != req.last_token_s:  # NaN: not known
            req.last_token_s = now
    return lost
