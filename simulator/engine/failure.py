"""Failure and restart of a replica: going down mid-step or mid-run (keeping the tokens of
the decode-run steps that ended before the failure), coming back with empty schedulers, and
repricing steps when the graph changes under the replica.

A mixin of :class:`~simulator.engine.replica.Replica`: its processes check ``generation``
when they wake and stop when it moved on.
"""

from __future__ import annotations

import numpy as np

from simulator.engine.batching import ContinuousBatcher
from simulator.engine.request import Request
from simulator.model.cost import StageCost


class Failures:
    """Failure, restart and repricing of a replica (see the module docstring)."""

    def fail(self) -> list[Request]:
        """The replica goes down: its processes stop at their next wake-up, and every
        request it held loses its KV. Returns them (with their progress so far) for the
        cluster to reroute or drop."""
        now = self.env.now
        self.failed_at[self.generation] = now
        self.generation += 1
        self.up = False
        lost: list[Request] = []
        for s, st in enumerate(self.streams):
            # The steps of a decode run under way that ended by now did happen: their
            # tokens count (the scheduled step and the extra ones alike).
            run = self._runs[s]
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
        self._idle = [None] * len(self.streams)
        self._running = [False] * len(self.streams)
        self._runs = [None] * len(self.streams)
        self.outstanding = 0
        return lost

    def reprice(self, stages: list[StageCost], sends: list[tuple[float, float]]) -> None:
        """Price the steps that start from now on with new stage and hand-off costs (the
        graph changed under the replica)."""
        self.stages, self._stage0, self.sends = stages, stages[0], sends

    def restart(self, streams: list[ContinuousBatcher], stages: list[StageCost] | None = None,
                sends: list[tuple[float, float]] | None = None) -> None:
        """Back up with empty schedulers (weights reloaded, KV cache empty), and the stage
        costs of the topology as it is now."""
        self.streams = streams
        if stages is not None:
            self.reprice(stages, sends if sends is not None else self.sends)
        self.up = True
        self.generation += 1
        self._start()
