"""Decode runs of one batch stream: how many decode-only steps can follow the scheduled one
with nothing else changing, the KV blocks they allocate, and applying them at once (the
fast-forward path of :mod:`simulator.engine.fastpath`). A mixin of
:class:`~simulator.engine.batching.ContinuousBatcher`: the queue decides whether a run may
start, the decode set (:class:`~simulator.engine.decoders.DecodeSet`) how long it can be
and what it allocates.
"""

from __future__ import annotations

import heapq

from simulator.engine.request import DECODE


class DecodeRuns:
    """Several decode-only steps in one event (see the module docstring)."""

    def can_admit(self) -> bool:
        """Whether a request arriving now could join the next step (nothing blocks the
        queue and a sequence slot is free)."""
        return not self.waiting and not self.swapped and self.running < self.max_seqs

    def decode_run(self, max_steps: int) -> int:
        """How many decode-only steps can follow the one just scheduled with nothing else
        changing: no request finishes before the last of them, and their KV blocks fit
        (else a step-by-step schedule would preempt). At most ``max_steps``; 0 for a decode
        set that does not run (speculation: every step is its own event).

        Call right after :meth:`schedule` returned a batch without prefill chunks; the
        steps' effects are applied by :meth:`skip_decode_steps`.
        """
        dec = self.dec
        if not dec.RUNS:
            return 0
        waiting = self.waiting
        if waiting and waiting[-1].queued_s > self.admit_by:
            return 0  # a request the next formation may admit is waiting: step by step
        fin = dec.finishes
        while fin and (fin[0][3].state != DECODE or fin[0][3].epoch != fin[0][2]):
            heapq.heappop(fin)  # stale entries of preempted requests
        if not fin:
            return 0
        steps = min(fin[0][0] - dec.k - 1, max_steps)
        if steps <= 0:
            return 0
        free = self.kv.free
        if self.run_blocks(steps) <= free:
            return steps
        lo, hi = 0, steps  # largest j with run_blocks(j) <= free (monotone in j)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.run_blocks(mid) <= free:
                lo = mid
            else:
                hi = mid
        return lo

    def run_blocks(self, steps: int) -> int:
        """KV blocks the first ``steps`` decode steps after the scheduled one allocate
        (paged: :meth:`~simulator.engine.decoders.DecodeSet.run_blocks`)."""
        return self.dec.run_blocks(steps)

    def run_needs(self, steps: int) -> list[int]:
        """Blocks allocated at each of the first ``steps`` decode steps after the scheduled
        one (for per-step records)."""
        return self.dec.run_needs(steps)

    def skip_decode_steps(self, steps: int, ends) -> None:
        """Apply decode-only steps counted by :meth:`decode_run` (all but the last step of
        the run, which :meth:`complete` applies): lengths grow, blocks are allocated, and
        every decoder's gaps are recorded. ``ends[j]`` is when step j of the run ended."""
        if steps == 0:
            return
        self.kv.allocate(self.run_blocks(steps))
        self.dec.skip(steps, ends)
