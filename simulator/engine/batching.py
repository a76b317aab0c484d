"""Continuous batching in the manner of vLLM v1: decodes first, then chunked prefill.

Each step gets a token budget (``max_num_batched_tokens``). Every running decode takes one
token; in-progress prefills continue with the rest of the budget; then waiting requests are
admitted in arrival order while sequences (``max_num_seqs``) and KV blocks allow. When a
running request cannot get a KV block, the most recently admitted request is preempted by
recompute: its blocks are freed and it re-prefills prompt plus generated tokens later.

Decoding requests are kept in aggregate form: their count, the sum of their KV lengths,
a count per residue class of KV length modulo ``block_size`` (which says how many need a new
block on the next step), and a heap of the steps at which they finish. A step therefore
costs O(1) Python work plus O(1) per request that is admitted, finishes a prefill, finishes,
or is preempted.
"""

from __future__ import annotations

import heapq
from collections import deque

from simulator.engine.kvcache import KVCache, blocks_for
from simulator.engine.request import DECODE, DONE, PREFILL, WAITING, Request


class Batch:
    """What one step runs: aggregate counts plus the prefill chunks ``(request, tokens)``."""

    __slots__ = ("tokens", "prefill_tokens", "prefill_pairs", "prefill_ctx", "n_decode",
                 "decode_kv",                 "sampled", "chunks", "batch_size", "kv_blocks")

    def __init__(self, n_decode: int, decode_kv: int, chunks: list, prefill_tokens: int,
                 prefill_pairs: float, prefill_ctx: int, sampled: int, kv_blocks: int):
        self.prefill_ctx = prefill_ctx  # cached tokens the prefill chunks attend to
        self.kv_blocks = kv_blocks  # blocks in use by the stream once this step is allocated
        self.n_decode, self.decode_kv, self.chunks = n_decode, decode_kv, chunks
        self.prefill_tokens, self.prefill_pairs = prefill_tokens, prefill_pairs
        self.tokens = n_decode + prefill_tokens
        self.sampled = sampled
        self.batch_size = n_decode + len(chunks)


class ContinuousBatcher:
    """Scheduler state of one micro-batch stream (one virtual engine) of a replica.

    Parameters
    ----------
    kv : KVCache
        Blocks this stream may use.
    max_num_seqs, max_num_batched_tokens : int
        vLLM limits: running sequences, tokens per step.
    """

    def __init__(self, kv: KVCache, max_num_seqs: int, max_num_batched_tokens: int):
        self.kv = kv
        self.bs = kv.block_size
        self.max_seqs, self.max_tokens = max_num_seqs, max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.prefilling: list[Request] = []
        self.decoding: dict[int, Request] = {}
        self.k = 0  # steps completed
        self.sum_kv = 0  # KV tokens held by decoding requests
        self.residue = [0] * self.bs  # decoders per (kv0 - 1 - k0) mod block_size
        self.finishes: list[tuple[int, int, int, Request]] = []
        self.admitted = 0
        self.preemptions = 0

    # -- queries -------------------------------------------------------------------------
    @property
    def outstanding(self) -> int:
        return len(self.waiting) + len(self.prefilling) + len(self.decoding)

    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.decoding)

    # -- arrivals ------------------------------------------------------------------------
    def add(self, req: Request) -> None:
        req.state = WAITING
        self.waiting.append(req)

    # -- decoding set ----------------------------------------------------------------------
    def _start_decode(self, req: Request) -> None:
        req.state, req.k0, req.kv0 = DECODE, self.k, req.target
        req.epoch += 1
        self.decoding[req.id] = req
        self.sum_kv += req.kv0
        self.residue[(req.kv0 - 1 - req.k0) % self.bs] += 1
        finish_step = req.k0 + req.output - req.generated
        heapq.heappush(self.finishes, (finish_step, req.id, req.epoch, req))

    def _stop_decode(self, req: Request) -> int:
        """Remove a decoder from the aggregates; returns its KV length now."""
        del self.decoding[req.id]
        kv = req.kv0 + self.k - req.k0
        self.sum_kv -= kv
        self.residue[(req.kv0 - 1 - req.k0) % self.bs] -= 1
        req.generated += self.k - req.k0
        return kv

    def _preempt(self, req: Request) -> None:
        """Recompute preemption: free all blocks, re-prefill prompt + generated later."""
        if req.state == DECODE:
            kv = self._stop_decode(req)
            self.kv.release(blocks_for(kv, self.bs))
        else:
            self.prefilling.remove(req)
            self.kv.release(req.blocks)
        req.blocks = 0
        req.computed = 0
        req.target = req.prompt + req.generated
        req.preemptions += 1
        self.preemptions += 1
        req.state = WAITING
        self.waiting.appendleft(req)

    def _victim(self) -> Request | None:
        """The most recently admitted running request."""
        last_p = self.prefilling[-1] if self.prefilling else None
        last_d = self.decoding[next(reversed(self.decoding))] if self.decoding else None
        if last_p is None or (last_d is not None and last_d.admit_seq > last_p.admit_seq):
            return last_d
        return last_p

    # -- one step --------------------------------------------------------------------------
    def schedule(self, now: float) -> Batch | None:
        """Form the next step's batch, allocating its KV blocks; None when idle."""
        kv, bs = self.kv, self.bs
        step = self.k + 1
        need = self.residue[-step % bs] if self.decoding else 0
        while need > kv.free:
            self._preempt(self._victim())
            need = self.residue[-step % bs] if self.decoding else 0
        kv.allocate(need)
        n_decode = len(self.decoding)
        budget = self.max_tokens - n_decode
        chunks: list[tuple[Request, int]] = []
        prefill_tokens, pairs, ctx, sampled = 0, 0.0, 0, n_decode

        i = 0
        while i < len(self.prefilling) and budget > 0:
            req = self.prefilling[i]
            c = req.computed
            x = min(req.target - c, budget)
            extra = blocks_for(c + x, bs) - req.blocks
            while extra > kv.free and self.prefilling[-1] is not req:
                self._preempt(self.prefilling[-1])
            if extra > kv.free:
                x = (req.blocks + kv.free) * bs - c
                if x <= 0:
                    self._preempt(req)
                    continue
                extra = blocks_for(c + x, bs) - req.blocks
            kv.allocate(extra)
            req.blocks += extra
            chunks.append((req, x))
            prefill_tokens += x
            pairs += x * (c + (x + 1) / 2)
            ctx += c
            sampled += c + x == req.target
            budget -= x
            i += 1

        waiting = self.waiting
        while waiting and budget > 0 and n_decode + len(self.prefilling) < self.max_seqs:
            req = waiting[0]
            x = min(req.target, budget)
            blocks = blocks_for(x, bs)
            if blocks > kv.free:
                break
            waiting.popleft()
            kv.allocate(blocks)
            req.blocks = blocks
            req.state = PREFILL
            self.admitted += 1
            req.admit_seq = self.admitted
            if req.first_scheduled_s != req.first_scheduled_s:  # NaN: first time
                req.first_scheduled_s = now
            self.prefilling.append(req)
            chunks.append((req, x))
            prefill_tokens += x
            pairs += x * (x + 1) / 2
            sampled += x == req.target
            budget -= x

        if n_decode == 0 and not chunks:
            return None
        return Batch(n_decode, self.sum_kv + n_decode, chunks, prefill_tokens, pairs, ctx,
                     sampled, kv.used)

    def complete(self, batch: Batch, now: float) -> list[Request]:
        """Apply a finished step at time ``now``; returns the requests that completed."""
        self.k += 1
        k = self.k
        self.sum_kv += batch.n_decode
        done: list[Request] = []
        fin = self.finishes
        while fin and fin[0][0] <= k:
            _, _, epoch, req = heapq.heappop(fin)
            if req.state == DECODE and req.epoch == epoch:
                kv = self._stop_decode(req)
                self.kv.release(blocks_for(kv, self.bs))
                req.blocks = 0
                self._finish(req, now, done)
        for req, x in batch.chunks:
            req.computed += x
            if req.computed < req.target:
                continue
            self.prefilling.remove(req)
            req.generated += 1
            if req.generated == 1:
                req.first_token_s = now
            if req.generated >= req.output:
                self.kv.release(req.blocks)
                req.blocks = 0
                self._finish(req, now, done)
            else:
                self._start_decode(req)
        return done

    # -- decode runs (several decode-only steps in one event) ------------------------------
    def can_admit(self) -> bool:
        """Whether a request arriving now could join the next step (nothing blocks the
        queue and a sequence slot is free)."""
        return not self.waiting and len(self.decoding) + len(self.prefilling) < self.max_seqs

    def decode_run(self, max_steps: int) -> int:
        """How many decode-only steps can follow the one just scheduled with nothing else
        changing: no request finishes before the last of them, and their KV blocks fit
        (else a step-by-step schedule would preempt). At most ``max_steps``.

        Call right after :meth:`schedule` returned a batch without prefill chunks; the
        steps' effects are applied by :meth:`skip_decode_steps`.
        """
        fin = self.finishes
        while fin and (fin[0][3].state != DECODE or fin[0][3].epoch != fin[0][2]):
            heapq.heappop(fin)  # stale entries of preempted requests
        if not fin:
            return 0
        steps = min(fin[0][0] - self.k - 1, max_steps)
        free = self.kv.free
        if steps <= 0 or self.run_blocks(steps) <= free:
            return max(steps, 0)
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
        full, rem = divmod(steps, self.bs)
        total = full * len(self.decoding)
        residue, bs, first = self.residue, self.bs, self.k + 2
        for step in range(first, first + rem):
            total += residue[-step % bs]
        return total

    def run_needs(self, steps: int) -> list[int]:
        """Blocks allocated at each of the first ``steps`` decode steps after the scheduled
        one (for per-step records)."""
        residue, bs, first = self.residue, self.bs, self.k + 2
        return [residue[-step % bs] for step in range(first, first + steps)]

    def skip_decode_steps(self, steps: int) -> None:
        """Apply decode-only steps counted by :meth:`decode_run` (all but the step that was
        scheduled, which :meth:`complete` applies): lengths grow, blocks are allocated."""
        self.kv.allocate(self.run_blocks(steps))
        self.k += steps
        self.sum_kv += len(self.decoding) * steps

    @staticmethod
    def _finish(req: Request, now: float, done: list[Request]) -> None:
        req.state, req.finish_s, req.status = DONE, now, "completed"
        done.append(req)
