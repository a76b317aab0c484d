"""Speculative decoding in a batch stream: acceptance sampling and the step semantics.

A speculative step drafts ``k`` tokens per decoding sequence (priced by
:mod:`simulator.model.speculative`), verifies ``k + 1`` positions per sequence in one target
forward, and advances each sequence by its accepted drafts plus the one token the target
samples after them (the bonus or corrected token), never past its output length.

Acceptance is a deterministic function of (run seed, request id, tokens the request has
generated): the same request meets the same draws however it is batched, preempted or
fast-forwarded, so runs with and without speculation, or with different loads, differ only
where the schedule does. A draw is one uniform ``u`` per sequence and step; the accepted
count is ``#{i : u < S_i}`` with ``S_i = P(A >= i)`` the survival function of the accepted
length (non-increasing, so the accepted positions form a prefix, as in rejection sampling).

:class:`SpeculativeDecodeSet` is a stream's decoding set (the component a scheduler holds as
``dec``, :class:`~simulator.engine.decoders.DecodeSet` otherwise), so any scheduler of
:mod:`simulator.engine.schedulers` speculates when built with
``decoders=speculative_decoders(spec)``. It keeps the decoders as per-sequence numpy arrays
(KV length, tokens left, tokens generated, time of the last token) indexed by slot: a step
is a handful of vectorised operations plus O(1) Python work per request that starts, stops
or finishes. The scheduler still decides what a step holds; the decode set plans the step's
lookahead before it does (:meth:`SpeculativeDecodeSet.plan`), so that the token budget
counts ``k + 1`` tokens per decoder (vLLM v1: ``num_tokens_with_spec -
num_computed_tokens``) and, for a paged scheduler, the blocks of the ``k`` speculative
positions are allocated with the step and the rejected ones released when it completes (a
scheduler that reserves memory at admission, Orca and static batching, holds them
already); then it shapes the batch's decoders into verifications
(:meth:`SpeculativeDecodeSet.shape`). Decode runs are not fast-forwarded: each speculative
step is one event.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from simulator.engine.batching import Batch
from simulator.engine.request import DECODE, Request
from simulator.hashing import finalize, golden_multiple
from simulator.model.speculative import DraftCost


def uniforms(key: int, ids: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """One uniform in [0, 1) per (id, counter) pair, a pure function of ``key`` and the pair
    (counter-based: SplitMix64 over the mixed inputs, 53 bits)."""
    x = finalize(np.uint64(key) ^ golden_multiple(ids))
    x = finalize(x + golden_multiple(counters))
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


@dataclass(frozen=True)
class Acceptance:
    """Distribution of the drafts accepted per verification step, A in 0..k.

    ``survival[i - 1] = P(A >= i)``: the probability that drafts 1..i are all accepted.
    """

    survival: tuple[float, ...]

    @classmethod
    def chain(cls, probs) -> Acceptance:
        """Per-position acceptance probabilities: ``probs[i]`` is the probability that
        draft i + 1 is accepted given drafts 1..i were (S_i = prod of the first i)."""
        return cls(tuple(float(s) for s in np.cumprod(np.asarray(probs, dtype=float))))

    @classmethod
    def geometric(cls, alpha: float, k: int) -> Acceptance:
        """Every draft accepted with probability ``alpha`` given its predecessors were."""
        return cls.chain([alpha] * k)

    @classmethod
    def from_mean(cls, mean: float, k: int) -> Acceptance:
        """The geometric model whose mean accepted drafts is ``mean`` (0 <= mean <= k):
        ``sum_{i=1..k} alpha**i = mean``, solved for alpha by bisection."""
        lo, hi = 0.0, 1.0
        for _ in range(100):
            mid = (lo + hi) / 2
            if sum(mid ** i for i in range(1, k + 1)) < mean:
                lo = mid
            else:
                hi = mid
        return cls.geometric(hi if mean >= k else lo if mean <= 0 else (lo + hi) / 2, k)

    @property
    def k(self) -> int:
        return len(self.survival)

    @property
    def mean(self) -> float:
        """E[A] = sum_i P(A >= i) (drafts accepted per step; tokens per step = 1 + this)."""
        return float(sum(self.survival))

    def pmf(self) -> np.ndarray:
        """P(A = a) for a = 0..k."""
        s = np.concatenate(([1.0], self.survival, [0.0]))
        return s[:-1] - s[1:]

    def sample(self, u: np.ndarray) -> np.ndarray:
        """Accepted drafts for uniforms ``u``: #{i : u < S_i}."""
        return (u[:, None] < np.asarray(self.survival)[None, :]).sum(axis=1)


@dataclass(frozen=True)
class SpecConfig:
    """What a stream needs to speculate.

    Attributes
    ----------
    k : int
        Speculative tokens drafted per sequence and step.
    acceptance : Acceptance
    draft : callable(n, sum_kv, k) -> float
        Seconds to draft ``k`` tokens for ``n`` sequences holding ``sum_kv`` KV tokens.
    disable_by_batch_size : int or None
        Steps scheduled while this many requests or more are running decode plainly.
    key : int
        Seed of the acceptance draws (from the run seed).
    """

    k: int
    acceptance: Acceptance
    draft: Callable[[int, int, int], float]
    disable_by_batch_size: int | None = None
    key: int = 0


class SpecStats:
    """Totals over a run's streams: draft seconds, speculative and plain decode steps."""

    __slots__ = ("draft_s", "spec_steps", "plain_steps")

    def __init__(self) -> None:
        self.draft_s = 0.0
        self.spec_steps = self.plain_steps = 0


def _ceil(x: np.ndarray, bs: int) -> np.ndarray:
    return -(-x // bs)


class SpeculativeDecodeSet:
    """The decoding set of a stream that speculates (see the module docstring): the
    interface of :class:`~simulator.engine.decoders.DecodeSet`, per-sequence arrays inside,
    and a lookahead per step (:meth:`plan`) that turns the decoders of the batch the
    scheduler forms into verifications (:meth:`shape`).

    Parameters
    ----------
    spec : SpecConfig
    stats : SpecStats or None
        Receives the draft time and step counts.
    block_size : int
    gaps : object, optional
        Receives inter-token gaps (``add(gap_s, count)``).
    max_seqs : int
        Decoders the arrays hold before they grow.
    """

    RUNS = False  # no decode runs: every speculative step is its own event
    SPEC = True

    def __init__(self, spec: SpecConfig, stats: SpecStats | None, block_size: int,
                 gaps=None, max_seqs: int = 1):
        self.spec, self.stats = spec, stats
        self.bs, self.gaps = block_size, gaps
        self.decoding: dict[int, Request] = {}
        self.k = 0  # decode steps completed
        self.sum_kv = 0  # KV tokens the decoders hold
        self._slot: dict[int, int] = {}
        self._req: list[Request | None] = []
        self._free: list[int] = []
        self._on = np.zeros(0, dtype=bool)
        self._kv = self._left = self._gen = self._rid = self._steps = self._acc = \
            np.zeros(0, dtype=np.int64)
        self._last = np.zeros(0)
        self._grow(max(max_seqs, 1))
        self._lookahead = 0  # speculative tokens per decoder in the step being scheduled

    def _grow(self, size: int) -> None:
        old = len(self._on)

        def pad(a: np.ndarray, fill=0) -> np.ndarray:
            return np.concatenate((a, np.full(size - old, fill, dtype=a.dtype)))

        self._on = pad(self._on, False)
        self._kv, self._left, self._gen = pad(self._kv), pad(self._left), pad(self._gen)
        self._rid, self._steps, self._acc = pad(self._rid), pad(self._steps), pad(self._acc)
        self._last = pad(self._last, math.nan)
        self._req += [None] * (size - old)
        self._free += range(size - 1, old - 1, -1)

    # -- members (per-sequence arrays instead of the aggregates) -------------------------
    def start(self, req: Request, kv_tokens: int, last_token_s: float) -> None:
        req.state, req.k0, req.kv0 = DECODE, self.k, kv_tokens
        req.epoch += 1
        self.decoding[req.id] = req
        self.sum_kv += kv_tokens
        if not self._free:
            self._grow(2 * len(self._on))
        s = self._free.pop()
        self._slot[req.id], self._req[s], self._on[s] = s, req, True
        self._kv[s], self._left[s], self._gen[s] = kv_tokens, req.output - req.generated, \
            req.generated
        self._rid[s], self._last[s], self._steps[s], self._acc[s] = req.id, last_token_s, 0, 0

    def stop(self, req: Request) -> int:
        s = self._slot.pop(req.id)
        del self.decoding[req.id]
        kv = int(self._kv[s])
        self.sum_kv -= kv
        req.generated = int(self._gen[s])
        req.last_token_s = float(self._last[s])
        req.spec_steps += int(self._steps[s])
        req.spec_accepted += int(self._acc[s])
        self._on[s], self._req[s] = False, None
        self._free.append(s)
        return kv

    def sync(self) -> None:
        """Write each decoder's progress into its Request (``generated`` with ``k0 = k``,
        acceptance counts), as a failure reads them."""
        for rid, s in self._slot.items():
            req = self.decoding[rid]
            req.generated, req.k0 = int(self._gen[s]), self.k
            req.spec_steps += int(self._steps[s])
            req.spec_accepted += int(self._acc[s])
            self._steps[s] = self._acc[s] = 0

    def leave(self) -> float:
        return math.nan  # stop() sets the leaver's last token time exactly

    def last_tokens(self) -> list[float]:
        return [float(self._last[self._slot[rid]]) for rid in self.decoding]

    def need(self, step: int) -> int:
        """Blocks that hold every decoder's next ``1 + lookahead`` positions (a scheduler
        that reserves memory at admission asks for none)."""
        if not self.decoding:
            return 0
        kv = self._kv[self._on]
        bs = self.bs
        return int((_ceil(kv + (self._lookahead + 1), bs) - _ceil(kv, bs)).sum())

    # -- no decode runs: every speculative step is its own event ------------------------
    def run_blocks(self, steps: int) -> int:
        return 0

    def run_needs(self, steps: int) -> list[int]:
        return [0] * steps

    # -- building a step -------------------------------------------------------------------
    def plan(self, running: int, max_tokens: int) -> int:
        """The lookahead ``k`` of the step about to be formed (``running``: requests
        decoding or prefilling; ``max_tokens``: the step's token budget): 0, plain
        decoding, at ``disable_by_batch_size`` or when the decoders' ``k + 1`` tokens would
        overflow the budget (vLLM: speculative_disable_by_batch_size, the budget). The
        scheduler then counts ``k + 1`` tokens per decoder and allocates the blocks of
        every verified position (:meth:`need`)."""
        spec = self.spec
        k = spec.k
        dbs = spec.disable_by_batch_size
        if (dbs is not None and running >= dbs) or len(self.decoding) * (k + 1) > max_tokens:
            k = 0
        self._lookahead = k
        return k

    def shape(self, b: Batch | None) -> Batch | None:
        """The scheduler's batch with its decoders verified as chunks of ``k + 1`` tokens
        after their KV (a prefill-like shape) when the step speculates."""
        k = self._lookahead
        if b is None or not b.n_decode or not k:
            return b
        n_decode, kv = b.n_decode, self.sum_kv
        b.tokens = b.prefill_tokens + n_decode * (k + 1)
        b.prefill_pairs += (k + 1) * kv + n_decode * (k + 1) * (k + 2) / 2
        b.prefill_ctx += kv
        b.decode_kv = 0
        b.sampled += n_decode * k  # logits at every verified position
        b.spec = k
        b.draft_s = self.spec.draft(n_decode, kv, k)
        return b

    # -- applying a step -----------------------------------------------------------------
    def step(self, batch: Batch, now: float) -> tuple[list[tuple[Request, int]], int]:
        """Apply a finished step: every decoder advances by its accepted drafts + 1 (at most
        its tokens left). Returns the decoders that finished with their KV lengths (by id,
        removed) and the KV blocks of the rejected positions (for a paged scheduler to give
        back)."""
        if not batch.n_decode:
            return [], 0
        self.k += 1
        out = self._advance(batch.spec, now)
        if self.stats is not None:
            self.stats.draft_s += batch.draft_s
        return out

    def _advance(self, k: int, now: float) -> tuple[list[tuple[Request, int]], int]:
        """Every decoder advances by its accepted drafts + 1 (at most its tokens left);
        finished requests leave. Returns them with their KV lengths, and the blocks of
        the rejected positions."""
        idx = np.flatnonzero(self._on)
        kv, left, gen = self._kv[idx], self._left[idx], self._gen[idx]
        if k:
            a = self.spec.acceptance.sample(uniforms(self.spec.key, self._rid[idx], gen))
            self._steps[idx] += 1
            self._acc[idx] += a
            adv = np.minimum(a + 1, left)
            bs = self.bs
            freed = int((_ceil(kv + (k + 1), bs) - _ceil(kv + adv, bs)).sum())
        else:
            adv = np.ones_like(left)
            freed = 0
        self._kv[idx], self._gen[idx] = kv + adv, gen + adv
        self._left[idx] = left = left - adv
        self.sum_kv += int(adv.sum())
        if self.stats is not None:
            if k:
                self.stats.spec_steps += 1
            else:
                self.stats.plain_steps += 1
        if self.gaps is not None:
            # Per output token: a gap g that brought m tokens counts as m gaps of g / m.
            per = (now - self._last[idx]) / adv
            ok = per == per  # drop unknown last-token times (NaN)
            vals, inv = np.unique(per[ok], return_inverse=True)
            counts = np.bincount(inv, weights=adv[ok], minlength=len(vals))
            for g, c in zip(vals.tolist(), counts.tolist(), strict=True):
                self.gaps.add(g, int(c))
        self._last[idx] = now
        fin = idx[left == 0]
        done = []
        for s in fin[np.argsort(self._rid[fin], kind="stable")].tolist():  # by id, as the
            # aggregate set's finish heap pops requests that finish at the same step
            req = self._req[s]
            done.append((req, self.stop(req)))
        return done, freed


def spec_config(method: str, k: int, acceptance, mean_accepted: float | None,
                disable_by_batch_size: int | None, draft: DraftCost, seed: int) -> SpecConfig:
    """A :class:`SpecConfig` from the ``[speculative]`` keys: ``acceptance`` a probability
    (geometric) or a list of k per-position probabilities, else ``mean_accepted``.
    ``method`` only names the drafter that ``draft`` prices."""
    if acceptance is None:
        acc = Acceptance.from_mean(mean_accepted, k)
    elif isinstance(acceptance, list):
        acc = Acceptance.chain(acceptance)
    else:
        acc = Acceptance.geometric(acceptance, k)
    key = int(np.random.SeedSequence([seed, 0x5BEC]).generate_state(1, np.uint64)[0])
    return SpecConfig(k, acc, draft.time, disable_by_batch_size, key)


def speculative_decoders(spec: SpecConfig, stats: SpecStats | None = None
                         ) -> Callable[..., SpeculativeDecodeSet]:
    """The ``decoders`` argument of any scheduler
    (:class:`~simulator.engine.batching.ContinuousBatcher` and those of
    :mod:`simulator.engine.schedulers`) that makes its streams speculate."""

    def build(block_size: int, gaps=None, max_seqs: int = 1) -> SpeculativeDecodeSet:
        return SpeculativeDecodeSet(spec, stats, block_size, gaps, max_seqs)

    return build
