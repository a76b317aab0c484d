"""Preemption and swap of one batch stream: which running request loses its KV blocks,
and what it does then (re-prefill later, or a decoder's blocks copied to CPU memory and back
when blocks free up). A mixin of :class:`~simulator.engine.batching.ContinuousBatcher`,
whose state (KV cache, decoding aggregates, queues) it acts on.
"""

from __future__ import annotations

from simulator.engine.kvcache import blocks_for
from simulator.engine.request import DECODE, SWAPPED, WAITING, Request


class Preemption:
    """Preemption by recompute or swap (see the module docstring)."""

    def _preempt(self, req: Request, now: float) -> None:
        """Free a running request's blocks: swap a decoder out if CPU blocks allow, else
        recompute (re-prefill prompt + generated tokens later)."""
        req.preemptions += 1
        self.preemptions += 1
        if req.state == DECODE:
            req.last_token_s = self.dec.leave()
            kv = self.dec.stop(req)
            if req.hashes is not None and self.prefix is not None:
                self.prefix.fill(req, kv)  # its full blocks stay cached (a re-admission hits)
            blocks = self._held_blocks(req, kv)
            self.kv.release(blocks)
            if req.shared:  # a swap copies all its KV; the cached blocks stay behind
                blocks += req.shared
                self.prefix.release(req)
            if self.swap and blocks <= self.cpu_free:
                self.cpu_free -= blocks
                self._swap_io += blocks
                req.state, req.kv0, req.blocks = SWAPPED, kv, blocks
                self.swapped.append(req)
                return
        else:
            self.prefilling.remove(req)
            self.kv.release(req.blocks)
            if req.units:
                self.prefix.release(req)
            self.prefilled_tokens -= req.computed
            self.pending_tokens -= req.target - req.computed
        req.blocks = 0
        req.computed = 0
        req.next_unit = 0
        req.target = req.prompt + req.generated
        self.pending_tokens += req.target
        req.state = WAITING
        self.waiting.appendleft(req)

    def _victim(self) -> Request | None:
        """The most recently admitted running request."""
        last_p = self.prefilling[-1] if self.prefilling else None
        last_d = self.decoding[next(reversed(self.decoding))] if self.decoding else None
        if last_p is None or (last_d is not None and last_d.admit_seq > last_p.admit_seq):
            return last_d
        return last_p

    def _swap_in(self) -> None:
        """Bring swapped decoders back, oldest first, while their blocks (and one more
        token) fit and a sequence slot is free."""
        while self.swapped and self.running < self.max_seqs:
            req = self.swapped[0]
            if blocks_for(req.kv0 + 1, self.bs) > self.kv.free:
                return
            self.swapped.popleft()
            self.kv.allocate(req.blocks)
            self.cpu_free += req.blocks
            self._swap_io += req.blocks
            self.dec.start(req, req.kv0, req.last_token_s)
