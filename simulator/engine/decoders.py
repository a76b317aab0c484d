"""The decoding set of one batch stream: the requests that make one token per decode step.

:class:`DecodeSet` keeps them in aggregate form: their count, the sum of their KV lengths,
a count per residue class of KV length modulo ``block_size`` (which says how many need a new
block on the next step), a heap of the steps at which they finish, and the times of their
last tokens in groups (for inter-token gaps). A step therefore costs O(1) Python work plus
O(1) per request that starts or stops decoding. Decode runs (several steps in one event)
read the same aggregates: the blocks a run allocates (:meth:`DecodeSet.run_blocks`) and
applying its steps (:meth:`DecodeSet.skip`).

The scheduler (:class:`~simulator.engine.batching.ContinuousBatcher`) holds one as ``dec``
and owns everything else (queues, KV cache, prefix cache); speculative decoding replaces it
by :class:`~simulator.engine.speculative.SpeculativeDecodeSet` (per-sequence arrays, several
tokens per step), the same interface.
"""

from __future__ import annotations

import heapq

from simulator.engine.request import DECODE, Request


class DecodeSet:
    """Decoders of one stream, one token each per decode step (see the module docstring).

    Parameters
    ----------
    block_size : int
        Tokens per KV block.
    gaps : object, optional
        Receives inter-token gaps: ``add(gap_s, count)`` and ``add_run(times, count)``.
    max_seqs : int
        Most decoders at once (unused by the aggregate form).

    Attributes
    ----------
    decoding : dict of int -> Request
        The decoders by request id, in the order they started (never rebound).
    k : int
        Decode steps completed (steps in which every decoder made a token).
    sum_kv : int
        KV tokens the decoders hold.
    """

    #: Whether decode-only steps may be advanced in one event (decode runs).
    RUNS = True
    #: Whether the set speculates (plans a lookahead and shapes batches: see
    #: :class:`~simulator.engine.speculative.SpeculativeDecodeSet`).
    SPEC = False

    def __init__(self, block_size: int, gaps=None, max_seqs: int = 0):
        self.bs, self.gaps = block_size, gaps
        self.decoding: dict[int, Request] = {}
        self.k = 0
        self.sum_kv = 0
        self.residue = [0] * block_size  # decoders per (kv0 - 1 - k0) mod block_size
        self.finishes: list[tuple[int, int, int, Request]] = []
        self._groups: list[list] = []  # decoders by time of their last token: [time, count]

    # -- members ---------------------------------------------------------------------------
    def start(self, req: Request, kv_tokens: int, last_token_s: float) -> None:
        """``req`` starts decoding with ``kv_tokens`` in its cache, its last token at
        ``last_token_s``."""
        req.state, req.k0, req.kv0 = DECODE, self.k, kv_tokens
        req.epoch += 1
        self.decoding[req.id] = req
        self.sum_kv += kv_tokens
        self.residue[(kv_tokens - 1 - req.k0) % self.bs] += 1
        finish_step = req.k0 + req.output - req.generated
        heapq.heappush(self.finishes, (finish_step, req.id, req.epoch, req))
        self._join(last_token_s, 1)

    def stop(self, req: Request) -> int:
        """Remove a decoder; returns its KV length now (its ``generated`` is brought up to
        date)."""
        del self.decoding[req.id]
        kv = req.kv0 + self.k - req.k0
        self.sum_kv -= kv
        self.residue[(req.kv0 - 1 - req.k0) % self.bs] -= 1
        req.generated += self.k - req.k0
        return kv

    def need(self, step: int) -> int:
        """KV blocks the decoders need at decode step ``step`` (paged: on demand)."""
        return self.residue[-step % self.bs] if self.decoding else 0

    def sync(self) -> None:
        """Write the decoders' progress into their Requests before a failure reads them
        (the aggregate form needs nothing: ``generated + k - k0`` is exact)."""

    # -- a step ----------------------------------------------------------------------------
    def step(self, batch, now: float) -> tuple[list[tuple[Request, int]], int]:
        """Apply a finished step (a :class:`~simulator.engine.batching.Batch`) at ``now``:
        every decoder made a token. Returns the decoders that finished, each with its KV
        length, in finishing order (removed), and the KV blocks to give back beyond theirs
        (none here)."""
        n_decode = batch.n_decode
        if n_decode:  # ``k`` counts decode steps: every decoder advanced by one
            self.k += 1
            self.sum_kv += n_decode
            self.emit(now)
        k = self.k
        done: list[tuple[Request, int]] = []
        fin = self.finishes
        while fin and fin[0][0] <= k:
            _, _, epoch, req = heapq.heappop(fin)
            if req.state == DECODE and req.epoch == epoch:
                kv = self.stop(req)
                self._groups[-1][1] -= 1  # it left after emitting at ``now``
                done.append((req, kv))
        return done, 0

    # -- inter-token gaps ------------------------------------------------------------------
    def _join(self, time: float, count: int) -> None:
        for g in self._groups:
            if g[0] == time:
                g[1] += count
                return
        self._groups.append([time, count])

    def leave(self) -> float:
        """A decoder leaves between steps: taken from the newest group (its last token is
        the most recent one; exact except when groups of one stream interleave). Returns
        the time of its last token."""
        g = max((g for g in self._groups if g[1] > 0), key=lambda g: g[0])
        g[1] -= 1
        return g[0]

    def emit(self, now: float) -> None:
        """Every decoder produced a token at ``now``: one gap per decoder since its last."""
        if self.gaps is not None:
            for t, c in self._groups:
                if c:
                    self.gaps.add(now - t, c)
        self._groups = [[now, len(self.decoding)]]

    def emit_run(self, ends) -> None:
        """Every decoder produced a token at each of ``ends`` (steps of a decode run): the
        gaps are counted and every decoder's last token is at ``ends[-1]``. Nothing else
        changes (:meth:`skip` also advances the steps; a run that a failure cut short only
        needs its tokens emitted)."""
        if len(ends) == 0:
            return
        self.emit(float(ends[0]))
        if self.gaps is not None and len(ends) > 1:
            self.gaps.add_run(ends, len(self.decoding))
        self._groups = [[float(ends[-1]), len(self.decoding)]]

    def last_tokens(self) -> list[float]:
        """When each decoder produced its last token, newest first (as a multiset exact:
        the decoders are not told apart, as :meth:`leave` does not)."""
        times = [t for t, c in sorted(self._groups, key=lambda g: -g[0]) for _ in range(c)]
        return (times + [float("nan")] * len(self.decoding))[: len(self.decoding)]

    # -- decode runs -----------------------------------------------------------------------
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

    def skip(self, steps: int, ends) -> None:
        """Apply ``steps`` decode-only steps of a run (their blocks allocated by the
        caller): lengths grow and every decoder's gaps are recorded; ``ends[j]`` is when
        step j of the run ended."""
        self.k += steps
        self.sum_kv += len(self.decoding) * steps
        self.emit_run(ends[:steps])
