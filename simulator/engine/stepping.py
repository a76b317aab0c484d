"""One step run inline: with a single batch stream nothing overlaps, so a step is one timeout
of its exact total (overhead + swap + drafts + every stage + every hand-off), and the
per-stage records are laid out in sequence (:meth:`InlineSteps._inline`). Also the record
emission and the aggregates (steps, tokens, busy time per stage, busy union) of such steps.

A mixin of :class:`~simulator.engine.replica.Replica`, whose stage costs, hand-off costs,
step overhead, record callbacks and aggregates it reads and updates.
"""

from __future__ import annotations

from collections.abc import Callable

from simulator.engine.clock import SCALE, ticks


class InlineSteps:
    """Steps computed in one go, their records and their aggregates (see the module
    docstring)."""

    def _record(self, rows) -> None:
        """Hand rows (``record_step`` tuples) to the recorder, in order."""
        for row in rows:
            self.record_step(row)

    def _count(self, steps: int, tokens: int, busy) -> None:
        """Aggregates of inline steps (their stage spans never overlap, so the busy union
        is the sum); ``busy`` is a float for one stage, else per stage."""
        self.steps += steps
        self.step_tokens += tokens
        if self._one_stage:
            b = float(busy)
            self.stage_busy_s[0] += b
            self.union_s += b
        else:
            for i, b in enumerate(busy):
                self.stage_busy_s[i] += float(b)
                self.union_s += float(b)

    def _inline(self, start: float, tokens: int, pairs: float, ctx: int, decode_kv: int,
                sampled: int, prefill_tokens: int, n_decode: int, batch_size: int,
                kv_blocks: int, rec: Callable[[tuple], None] | None,
                swap_blocks: int = 0, draft_s: float = 0.0,
                seqs: int = 0) -> tuple[float, object]:
        """End time and busy time (a float for one stage, else per stage) of a step starting
        at ``start`` with nothing overlapping; records each stage's span (overhead and swap,
        stage, hand-off, stage, ...). Times are on the clock's grid (``start`` is), so the end
        depends on the step alone, not on when it runs."""
        off = self.overhead + swap_blocks * self.swap_s
        if draft_s:  # speculative drafts run on the replica's GPUs before the forward
            off += draft_s
        if self._one_stage:  # the loop below for a single stage, unrolled (hot path)
            compute, comm = self._stage0.step(tokens, pairs, ctx, decode_kv, sampled, seqs)
            end = round((off + compute + comm) * SCALE) / SCALE
            if rec is not None:  # (ticks(off), inline)
                rec((self.index, 0, 0, start + round(off * SCALE) / SCALE, start + end,
                     prefill_tokens, n_decode, batch_size, compute, comm, kv_blocks, pairs,
                     ctx, decode_kv, sampled))
            return start + end, compute + comm
        busy = []
        last = len(self.stages) - 1
        for i, cost in enumerate(self.stages):
            compute, comm = cost.step(tokens, pairs, ctx, decode_kv, sampled, seqs)
            end = off + compute + comm
            busy.append(compute + comm)
            if rec is not None:
                rec((self.index, i, 0, start + ticks(off), start + ticks(end), prefill_tokens,
                     n_decode, batch_size, compute, comm, kv_blocks, pairs, ctx, decode_kv,
                     sampled))
            off = end
            if i < last:
                lat, per_token = self.sends[i]
                off += lat + tokens * per_token
        return start + ticks(off), busy

