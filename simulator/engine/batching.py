"""Continuous batching in the manner of vLLM v1: decodes first, then chunked prefill.

Each step gets a token budget (``max_num_batched_tokens``). Every running decode takes one
token; in-progress prefills continue with the rest of the budget; then waiting requests are
admitted in arrival order while sequences (``max_num_seqs``) and KV blocks allow. When a
running request cannot get a KV block, the most recently admitted request is preempted:
by recompute (its blocks are freed and it re-prefills prompt plus generated tokens later) or
by swap (a decoder's blocks are copied to CPU memory and back when blocks free up).

The decoding requests are a component, the stream's decode set (``dec``,
:class:`~simulator.engine.decoders.DecodeSet`: aggregate form, O(1) Python work per step
plus O(1) per request that starts or stops decoding); a decode policy may bring its own
(speculative decoding: :func:`simulator.engine.speculative.speculative_decoders`). Other
schedulers (:mod:`simulator.engine.schedulers`) override how a step is formed
(:meth:`ContinuousBatcher.form`) and the ``_*_blocks`` hooks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from simulator.engine.decoders import DecodeSet
from simulator.engine.decoderun import DecodeRuns
from simulator.engine.kvcache import KVCache, blocks_for
from simulator.engine.preemption import Preemption
from simulator.engine.prefix import PrefixCache
from simulator.engine.request import DONE, PREFILL, WAITING, Request

NAN = float("nan")


class Batch:
    """What one step runs: aggregate counts plus the prefill chunks ``(request, tokens)``."""

    __slots__ = ("tokens", "prefill_tokens", "prefill_pairs", "prefill_ctx", "n_decode",
                 "decode_kv", "sampled", "chunks", "batch_size", "kv_blocks", "swap_blocks",
                 "spec", "draft_s")

    def __init__(self, n_decode: int, decode_kv: int, chunks: list, prefill_tokens: int,
                 prefill_pairs: float, prefill_ctx: int, sampled: int, kv_blocks: int,
                 swap_blocks: int = 0):
        self.kv_blocks = kv_blocks  # blocks in use by the stream once this step is allocated
        self.prefill_ctx = prefill_ctx  # cached tokens the prefill chunks attend to
        self.n_decode, self.decode_kv, self.chunks = n_decode, decode_kv, chunks
        self.prefill_tokens, self.prefill_pairs = prefill_tokens, prefill_pairs
        self.tokens = n_decode + prefill_tokens
        self.sampled = sampled
        self.batch_size = n_decode + len(chunks)
        self.swap_blocks = swap_blocks  # KV blocks copied to or from CPU memory first
        self.spec = 0  # speculative tokens per decoder (simulator.engine.speculative)
        self.draft_s = 0.0  # seconds drafting them, before the step's forward

    @property
    def kernel_seqs(self) -> int:
        """Sequences of the step's prefill kernel where the step cost cannot infer them
        (``seqs`` of :meth:`simulator.model.cost.StageCost.step`): a speculative step
        verifies each decoder as a chunk of ``spec + 1`` tokens, one sequence that samples
        ``spec + 1`` positions; 0 otherwise."""
        return self.batch_size if self.spec else 0


class ContinuousBatcher(Preemption, DecodeRuns):
    """Scheduler state of one micro-batch stream (one virtual engine) of a replica.

    The decoders are a component, ``self.dec`` (:class:`~simulator.engine.decoders.DecodeSet`
    or a speculative one), as the prefix cache is (``self.prefix``,
    :class:`~simulator.engine.prefix.PrefixCache`); preemption and swap live in
    :class:`~simulator.engine.preemption.Preemption`, decode runs (fast-forward) in
    :class:`~simulator.engine.decoderun.DecodeRuns`, both mixins acting on the queues and
    the KV cache.

    Parameters
    ----------
    kv : KVCache
        Blocks this stream may use.
    max_num_seqs, max_num_batched_tokens : int
        vLLM limits: running sequences, tokens per step.
    preemption : {"recompute", "swap"}
        What happens to a decoder that loses its blocks.
    swap_blocks : int
        CPU blocks available for swapped KV (beyond them, swap falls back to recompute).
    gaps : object, optional
        Receives inter-token gaps: ``add(gap_s, count)`` and ``add_run(times, count)``.
    prefix_tokens : int
        Tokens per prefix-cache hash block (0: no prefix caching); see
        :mod:`simulator.engine.prefix`.
    offload_units : int
        Hash blocks the host-memory tier of the prefix cache holds (0: none).
    decoders : callable(block_size, gaps, max_num_seqs) -> DecodeSet, optional
        Builds the stream's decode set (default :class:`~simulator.engine.decoders.DecodeSet`;
        :func:`simulator.engine.speculative.speculative_decoders` for speculation).
    """

    #: Scheduler parameters this class accepts (name -> default); see schedulers.py.
    PARAMS: dict = {}
    #: Whether prompts may be split over steps (else max_model_len <= the token budget).
    CHUNKED = True
    #: Whether the scheduler can share cached prefix blocks (paged KV).
    PREFIX = True
    #: Whether decoders take KV blocks as they grow (else memory is reserved at admission).
    PAGED = True
    #: Tokens each decoder takes from a step's token budget (a speculative decode policy
    #: sets ``k + 1`` for the step it schedules).
    _decode_tokens = 1

    def __init__(self, kv: KVCache, max_num_seqs: int, max_num_batched_tokens: int,
                 preemption: str = "recompute", swap_blocks: int = 0, gaps=None,
                 prefix_tokens: int = 0, offload_units: int = 0,
                 decoders: Callable[..., DecodeSet] | None = None):
        self.kv = kv
        self.bs = kv.block_size
        self.max_seqs, self.max_tokens = max_num_seqs, max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.prefilling: list[Request] = []
        self.dec = (decoders or DecodeSet)(self.bs, gaps, max_num_seqs)
        self.decoding = self.dec.decoding  # the same dict (the decode set never rebinds it)
        # Hot path: calls that would only pass through go straight to their target.
        if not self.dec.SPEC:  # nothing to plan or shape: the scheduler's own formation
            self.schedule = self.form
        if type(self)._decode_need is ContinuousBatcher._decode_need:
            self._decode_need = self.dec.need
        if type(self).run_blocks is DecodeRuns.run_blocks:
            self.run_blocks = self.dec.run_blocks
        self.swapped: deque[Request] = deque()
        self.admitted = 0
        self.preemptions = 0
        self.swap = preemption == "swap"
        self.cpu_free = swap_blocks
        self.pending_tokens = 0  # prompt tokens not yet prefilled (waiting and prefilling)
        self.prefilled_tokens = 0  # KV tokens held by prefilling requests
        self.gaps = gaps
        self._swap_io = 0  # blocks swapped out or in while forming this batch
        self.prefix = (PrefixCache(kv, prefix_tokens, offload_units)
                       if prefix_tokens and self.PREFIX else None)
        self.arrived: deque[tuple[Request, float]] = deque()  # KV from a prefill instance
        #: Async admission: only requests queued by this time may join the step being formed
        #: (set by the replica before each :meth:`schedule`; inf admits every one).
        self.admit_by = float("inf")

    # -- queries -------------------------------------------------------------------------
    @property
    def outstanding(self) -> int:
        return (len(self.waiting) + len(self.prefilling) + len(self.decoding)
                + len(self.swapped))

    @property
    def running(self) -> int:
        return len(self.decoding) + len(self.prefilling)

    # -- arrivals ------------------------------------------------------------------------
    def add(self, req: Request) -> None:
        req.state = WAITING
        if req.shared or req.units:  # references into a cache that failed with its replica
            req.units, req.shared, req.next_unit = [], 0, 0
        self.waiting.append(req)
        self.pending_tokens += req.target

    # -- hooks that other schedulers override ---------------------------------------------
    def _decode_need(self, step: int) -> int:
        """KV blocks the running decoders need at ``step`` (paged: on demand)."""
        return self.dec.need(step)

    def _admit_blocks(self, req: Request, tokens: int) -> int:
        """KV blocks a waiting request needs to be admitted with a chunk of ``tokens``."""
        return blocks_for(tokens, self.bs)

    def _chunk_blocks(self, req: Request, tokens: int) -> int:
        """More blocks an admitted request needs for its next chunk of ``tokens``."""
        return blocks_for(req.computed + tokens, self.bs) - req.blocks - req.shared

    def _held_blocks(self, req: Request, kv_tokens: int) -> int:
        """Private blocks a decoder holds with ``kv_tokens`` in its cache."""
        return blocks_for(kv_tokens, self.bs) - req.shared

    # -- the decode set, as the rest of the engine reads it ------------------------------
    @property
    def k(self) -> int:
        """Decode steps completed (steps in which every decoder made a token)."""
        return self.dec.k

    @property
    def sum_kv(self) -> int:
        """KV tokens held by decoding requests."""
        return self.dec.sum_kv

    def emit_run(self, ends) -> None:
        """Every decoder produced a token at each of ``ends`` (see
        :meth:`~simulator.engine.decoders.DecodeSet.emit_run`)."""
        self.dec.emit_run(ends)

    def last_tokens(self) -> list[float]:
        """When each decoder produced its last token, newest first."""
        return self.dec.last_tokens()

    # -- building a step -------------------------------------------------------------------
    def _schedule_decodes(self, now: float) -> int:
        """Allocate the decoders' blocks for the next step, preempting until they fit."""
        step = self.dec.k + 1
        need = self._decode_need(step)
        while need > self.kv.free:
            self._preempt(self._victim(), now)
            need = self._decode_need(step)
        self.kv.allocate(need)
        return len(self.decoding)

    def _continue_prefills(self, budget: int, chunks: list, now: float) -> int:
        """Next chunks of admitted prefills; returns the budget left."""
        kv, bs = self.kv, self.bs
        i = 0
        while i < len(self.prefilling) and budget > 0:
            req = self.prefilling[i]
            c = req.computed
            x = min(req.target - c, budget)
            extra = self._chunk_blocks(req, x)
            while extra > kv.free and self.prefilling[-1] is not req:
                self._preempt(self.prefilling[-1], now)
            if extra > kv.free:
                x = (req.blocks + req.shared + kv.free) * bs - c
                if x <= 0:
                    self._preempt(req, now)
                    continue
                extra = self._chunk_blocks(req, x)
            kv.allocate(extra)
            req.blocks += extra
            chunks.append((req, x))
            budget -= x
            i += 1
        return budget

    def _admit(self, budget: int, chunks: list, now: float, chunked: bool = True,
               limit: int | None = None) -> int:
        """Admit waiting requests in order; returns the budget left. Without chunking a
        prompt that does not fit the remaining budget waits."""
        waiting, kv = self.waiting, self.kv
        limit = self.max_seqs if limit is None else limit
        while waiting and budget > 0 and self.running < limit and not self.swapped:
            req = waiting[0]
            if req.queued_s > self.admit_by:  # queued after this step was scheduled
                break
            if self.prefix is not None and req.hashes:
                c = self._admit_cached(req, budget, chunked)
                if c < 0:
                    break
                x = min(req.target - c, budget)
                blocks = req.blocks
            else:
                c = 0
                x = min(req.target, budget)
                if not chunked and x < req.target:
                    break
                blocks = self._admit_blocks(req, x)
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
                req.cached_tokens = c
            elif req.requeued is not None and req.requeued[-1][1] != req.requeued[-1][1]:
                req.requeued[-1][1] = now  # admitted again after a reroute
            self.prefilling.append(req)
            chunks.append((req, x))
            budget -= x
        return budget

    def _admit_cached(self, req: Request, budget: int, chunked: bool) -> int:
        """Admit the head of the queue reusing its longest cached prefix: references the
        cached blocks (loading host ones, counted as swapped blocks), sets ``computed`` to
        the cached tokens and ``blocks`` to the private blocks its first chunk needs (not
        yet allocated), and returns the cached tokens; -1 (nothing changed) when its chunk
        or its blocks do not fit."""
        pc = self.prefix
        hit, loads, pinned = pc.match(req.hashes, req.target)
        c = hit * pc.unit
        x = min(req.target - c, budget)
        if not chunked and x < req.target - c:
            return -1
        blocks = self._admit_blocks(req, c + x) - hit * pc.ub
        if blocks + pinned + loads * pc.ub > self.kv.free:
            return -1
        self.waiting.popleft()
        if hit:
            self._swap_io += pc.acquire(req, hit)
            req.computed = c
            self.pending_tokens -= c
            self.prefilled_tokens += c
        req.blocks = blocks
        return c

    def _batch(self, n_decode: int, chunks: list) -> Batch | None:
        """The Batch of the decoders (if ``n_decode``) and the chunks, or None if empty."""
        if n_decode == 0 and not chunks:
            return None
        prefill_tokens, pairs, ctx, sampled = 0, 0.0, 0, n_decode
        for req, x in chunks:
            c = req.computed
            prefill_tokens += x
            pairs += x * (c + (x + 1) / 2)
            ctx += c
            sampled += c + x == req.target
        swap, self._swap_io = self._swap_io, 0
        return Batch(n_decode, self.dec.sum_kv + n_decode if n_decode else 0, chunks,
                     prefill_tokens, pairs, ctx, sampled, self.kv.in_use, swap)

    def schedule(self, now: float) -> Batch | None:
        """Form the next step's batch, allocating its KV blocks; None when idle. A decode
        set that speculates plans the step's lookahead first and shapes the batch's
        decoders into verifications after (:meth:`form` is the scheduler's own)."""
        dec = self.dec
        if not dec.SPEC:
            return self.form(now)
        self._prepare()
        self._decode_tokens = dec.plan(self.running, self.max_tokens) + 1
        return dec.shape(self.form(now))

    def _prepare(self) -> None:
        """What comes before a step's lookahead is planned: swapped decoders come back
        first, so that they count among the running (calling :meth:`_swap_in` again in
        :meth:`form` then changes nothing)."""
        if self.swapped:
            self._swap_in()

    def form(self, now: float) -> Batch | None:
        """The scheduler's next batch (vLLM v1: decodes, then chunked prefill)."""
        if self.swapped:
            self._swap_in()
        elif not self.prefilling and not self.waiting and self.decoding:
            # Decoders only (the step after most arrivals and completions) whose blocks
            # fit: _schedule_decodes and _batch in short, no chunk to form.
            kv, dec = self.kv, self.dec
            need = self._decode_need(dec.k + 1)
            if need <= kv.free:
                kv.allocate(need)
                n = len(self.decoding)
                swap, self._swap_io = self._swap_io, 0
                return Batch(n, dec.sum_kv + n, [], 0, 0.0, 0, n, kv.in_use, swap)
        n_decode = self._schedule_decodes(now)
        chunks: list[tuple[Request, int]] = []
        budget = self.max_tokens - n_decode * self._decode_tokens
        if self.prefilling:
            budget = self._continue_prefills(budget, chunks, now)
        if self.waiting:
            self._admit(budget, chunks, now)
        return self._batch(len(self.decoding), chunks)

    # -- applying a step -----------------------------------------------------------------
    def complete(self, batch: Batch, now: float) -> list[Request]:
        """Apply a finished step at time ``now``; returns the requests that completed."""
        done: list[Request] = []
        finished, freed = self.dec.step(batch, now)
        if freed and self.PAGED:  # KV of speculative positions the target rejected
            self.kv.release(freed)
        for req, kv in finished:
            if req.hashes is not None and self.prefix is not None:
                self.prefix.fill(req, kv)  # its answer's full blocks become cached
            self.kv.release(self._held_blocks(req, kv))
            if req.units:
                self.prefix.release(req)
            req.blocks = 0
            self._finish(req, now, done)
        if batch.chunks:
            self._complete_chunks(batch, now, done)
        return done

    def _complete_chunks(self, batch: Batch, now: float, done: list[Request]) -> None:
        """Apply the step's prefill chunks: a prompt that is complete samples its first
        token, then decodes or (one-token outputs) finishes into ``done``."""
        for req, x in batch.chunks:
            req.computed += x
            self.pending_tokens -= x
            self.prefilled_tokens += x
            if req.hashes is not None and self.prefix is not None:
                req.blocks -= self.prefix.fill(req, req.computed)
            if req.computed < req.target:
                continue
            self.prefilling.remove(req)
            self.prefilled_tokens -= req.computed
            req.generated += 1
            if req.generated == 1:
                req.first_token_s = now
            elif self.gaps is not None and req.last_token_s == req.last_token_s:
                self.gaps.add(now - req.last_token_s, 1)  # re-prefill: gap since its last
            if req.generated >= req.output:
                self.kv.release(req.blocks)
                if req.units:
                    self.prefix.release(req)
                req.blocks = 0
                self._finish(req, now, done)
            else:
                self.dec.start(req, req.target, now)

    def sync_decoders(self) -> None:
        """Write the decoders' progress into their Requests before a failure reads them."""
        self.dec.sync()

    # -- disaggregated serving: requests that arrive with their prompt's KV --------------
    def add_prefilled(self, req: Request, last_token_s: float) -> None:
        """Queue a request whose prompt KV came from a prefill instance (its ``req.blocks``
        already allocated here); it joins the decoders when the next step is formed."""
        self.arrived.append((req, last_token_s))

    def join_prefilled(self) -> None:
        """The requests whose KV arrived start decoding (called between steps)."""
        while self.arrived:
            req, last = self.arrived.popleft()
            self.admitted += 1
            req.admit_seq = self.admitted
            req.computed = req.target  # the prompt (and tokens of a retried request)
            self.dec.start(req, req.target, last)

    @staticmethod
    def _finish(req: Request, now: float, done: list[Request]) -> None:
        req.state, req.finish_s, req.status = DONE, now, "completed"
        done.append(req)
