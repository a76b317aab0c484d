"""Decode runs of one batch stream: how many decode-only steps can follow the scheduled one
with nothing else changing, the KV blocks they allocate, and applying them at once (the
fast-forward path of :mod:`simulator.engine.replica`). A mixin of
:class:`~simulator.engine.batching.ContinuousBatcher`, whose aggregates it reads.
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
        (else a step-by-step schedule would preempt). At most ``max_steps``.

        Call right after :meth:`schedule` returned a batch without prefill chunks; the
        steps' effects are applied by :meth:`skip_decode_steps`.
        """
        waiting = self.waiting
        if waiting and waiting[-1].queued_s > self.admit_by:
            return 0  # a request the next formation may admit is waiting: step by step
        fin = self.finishes
        while fin and (fin[0][3].state != DECODE or fin[0][3].epoch != fin[0][2]):
            heapq.heappop(fin)  # stale entries of preempted requests
        if not fin:
            return 0
        steps = min(fin[0][0] - self.k - 1, max_steps)
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
        """KV blocks the first ``steps`` decode steps after the scheduled one allocate.

        Over any ``block_size`` consecutive steps each residue class needs a block once, so
        whole periods cost one block per decoder; O(block_size) work, not O(steps).
        """
        bs = self.bs
        full, rem = divmod(steps, bs)
        total = full * len(self.decoding)
        if rem:
            # Steps first .. first + rem - 1 read residues hi, hi - 1, ... (mod bs): one or
            # two slices of the residue list.
            residue, hi = self.residue, -(self.k + 2) % bs
            lo = hi - rem + 1
            if lo >= 0:
                total += sum(residue[lo:hi + 1])
            else:
                total += sum(residue[:hi + 1]) + sum(residue[bs + lo:])
        return total

    def run_needs(self, steps: int) -> list[int]:
        """Blocks allocated at each of the first ``steps`` decode steps after the scheduled
        one (for per-step records)."""
        # Step first + j reads residue[-(first + j) % bs], i.e. the reversed residues from
        # index (first - 1) % bs on, cyclically: a slice of the reversed list repeated.
        bs = self.bs
        start = (self.k + 1) % bs
        return (self.residue[::-1] * ((start + steps) // bs + 1))[start:start + steps]

    def skip_decode_steps(self, steps: int, ends) -> None:
        """Apply decode-only steps counted by :meth:`decode_run` (all but the last step of
        the run, which :meth:`complete` applies): lengths grow, blocks are allocated, and
        every decoder's gaps are recorded. ``ends[j]`` is when step j of the run ended."""
        if steps == 0:
            return
        self.kv.allocate(self.run_blocks(steps))
        self.k += steps
        self.sum_kv += len(self.decoding) * steps
        self.emit_run(ends[:steps])
