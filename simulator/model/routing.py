"""Expert popularity, expert placement over EP ranks, and per-step routed token counts.

A router sends each token to ``k`` of ``E`` experts. Expert ``e`` is chosen with
probability ``p_e`` (uniform, Zipf with a skew, or weights from a file); the experts'
popularity ranks are shuffled over their ids once per run (a hot expert is not always
expert 0). Redundant experts (EPLB) replicate the hottest experts and place the replicas
so that the expected rank loads are as even as a greedy largest-first packing makes them.

Per step the expert loads are a normal approximation of the multinomial counts,
``x_e = max(0, T k p_e + sqrt(T k p_e (1 - p_e)) z_e)``, with ``z`` taken from a block of
pre-drawn standard normals indexed by a hash of the step's own aggregates (not of call
order), so fast-forwarded decode runs see exactly the draws of step-by-step execution.
The expert kernels are priced on whole rows per expert (:meth:`Routing.local_counts`):
the same draws mapped to Poisson quantiles (``u = Phi(z)``), so that a small batch leaves
most experts empty, as a real router does, instead of a sliver of a row on each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

import numpy as np

from simulator import files
from simulator.errors import ScenarioError

#: Pre-drawn routing states (rows of standard normals) per run.
DRAWS = 1024
_HASH = 2654435761  # Knuth's multiplicative hash (odd, ~2^32 / phi)
#: Mean rows per expert above which integer counts come from the rounded normal draw
#: (the Poisson quantile and the normal one differ by < 1 row there).
POISSON_MAX_MEAN = 16.0


def step_index(key):
    """Row of the draw block for a step key (int or int array): the top 10 bits of a
    32-bit multiplicative hash, so keys that grow by a power of two still spread."""
    if isinstance(key, np.ndarray):
        return ((key.astype(np.uint64) * np.uint64(_HASH)) & np.uint64(0xFFFFFFFF)) >> 22
    return ((int(key) * _HASH) & 0xFFFFFFFF) >> 22


def row_sum(a: np.ndarray) -> np.ndarray:
    """Sum over the last axis, added left to right one column at a time, so each row's
    result is the same bits whatever the other rows (numpy's own reductions may pair
    terms differently for different array shapes)."""
    if a.shape[-1] == 0:
        return np.zeros(a.shape[:-1])
    # add.accumulate runs left to right with no pairwise regrouping: the same additions, in
    # the same order, as a Python loop over the columns starting from 0.
    return np.cumsum(a, axis=-1, dtype=np.float64)[..., -1]


def popularity(experts: int, distribution: str = "uniform", skew: float = 1.0,
               weights: np.ndarray | None = None, seed: int = 0) -> np.ndarray:
    """Probability that a routing slot picks each expert (sums to 1).

    ``zipf``: ``p ~ 1 / rank^skew`` with the ranks shuffled over expert ids by ``seed``;
    ``weights``: a non-negative weight per expert (normalized).
    """
    if weights is not None:
        p = np.asarray(weights, dtype=float)
    elif distribution == "zipf":
        ranks = np.random.default_rng(seed).permutation(experts) + 1.0
        p = ranks ** -float(skew)
    else:
        p = np.ones(experts)
    return p / p.sum()


#: Most values a weights file may hold (the most experts a config may declare).
MAX_EXPERTS = 4096


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def read_weights(path: Path, experts: int) -> np.ndarray:
    """One non-negative number per expert, one per line or comma separated."""
    key = "model.routing.weights_file"
    text = files.read_text(path, key)
    words = text.replace(",", " ").split()
    if len(words) > MAX_EXPERTS:
        raise ScenarioError(f"{key}: {str(path)!r} holds more than {MAX_EXPERTS} values "
                            f"(one weight per expert)")
    try:
        w = np.array([float(x) for x in words])
    except ValueError:  # the file's content is never shown (it may be any file)
        bad = next(i for i, x in enumerate(words, 1) if not _is_number(x))
        raise ScenarioError(f"{key}: {str(path)!r} value {bad} is not a number (expected "
                            f"{experts} finite non-negative weights, one per expert)") from None
    if w.size != experts or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise ScenarioError(f"model.routing.weights_file: expected {experts} finite "
                            f"non-negative weights (one per expert) with a positive sum, "
                            f"got {w.size} values in {str(path)!r}")
    return w


def placement(p: np.ndarray, ranks: int, redundant: int = 0) -> np.ndarray:
    """Share of each expert's tokens handled by each rank, shape ``(ranks, E)``.

    Without redundancy, expert e lives on rank ``e // (E / ranks)`` (contiguous blocks, as
    vLLM and SGLang lay experts out). With ``redundant`` extra slots, the expert with the
    largest load per replica gets the next replica (EPLB), and all replicas are packed
    largest-first onto the least-loaded rank that has a free slot (and no copy of
    that expert yet); a replicated expert's
    tokens split evenly over its replicas.
    """
    experts = p.size
    share = np.zeros((ranks, experts))
    if redundant == 0:
        share[np.arange(experts) * ranks // experts, np.arange(experts)] = 1.0
        return share
    copies = np.ones(experts, dtype=int)
    for _ in range(redundant):
        # At most one copy per rank: a second copy on one rank would not split its load.
        copies[np.argmax(np.where(copies < ranks, p / copies, -1.0))] += 1
    slots = math.ceil((experts + redundant) / ranks)
    load, used = np.zeros(ranks), np.zeros(ranks, dtype=int)
    items = sorted(((p[e] / copies[e], e) for e in range(experts) for _ in range(copies[e])),
                   reverse=True)
    for w, e in items:
        free = np.where((used < slots) & (share[:, e] == 0))[0]  # replicas on distinct ranks
        if free.size == 0:
            free = np.where(used < slots)[0]
        r = free[np.argmin(load[free])]
        load[r] += w
        used[r] += 1
        share[r, e] += 1.0 / copies[e]
    return share


@dataclass(frozen=True)
class Routing:
    """Popularity, rank placement and the run's block of standard normals."""

    p: np.ndarray  # (E,)
    share: np.ndarray  # (ranks, E)
    z: np.ndarray  # (DRAWS, E)
    top_k: int

    @classmethod
    def build(cls, p: np.ndarray, ranks: int, redundant: int, top_k: int,
              seed: int) -> Routing:
        p = np.asarray(p)
        return _built(cls, p.tobytes(), p.dtype.str, p.shape, ranks, redundant, top_k, seed)

    def expert_loads(self, tokens: int, rows=None) -> np.ndarray:
        """Tokens routed to each expert in every pre-drawn state (or the states ``rows``),
        shape ``(DRAWS, E)``; each row sums to ``tokens * k`` (rescaled after clipping at
        zero). Every operation is row by row, so a row's values do not depend on which
        other rows are computed with it."""
        z = self.z if rows is None else self.z[rows]
        mean = tokens * self.top_k * self.p
        x = np.maximum(mean + np.sqrt(mean * (1.0 - self.p)) * z, 0.0)
        total = row_sum(x)[:, None]
        return x * np.divide(tokens * self.top_k, total, out=np.zeros_like(total),
                             where=total > 0)

    def rank_loads(self, tokens: int, rows=None) -> np.ndarray:
        """Routed tokens each rank receives in every state (or ``rows``), shape
        ``(DRAWS, ranks)``: the share-weighted loads of the experts it holds, summed
        over its slots (row by row, as :meth:`expert_loads`)."""
        ids, weight = self.slots
        return row_sum(self.expert_loads(tokens, rows)[:, ids] * weight)

    @cached_property
    def slots(self) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, weight)``, each ``(ranks, slots)``: the experts each rank holds (0 in
        unused slots) and its share of their tokens (0 in unused slots)."""
        held = self.share > 0
        slots = max(int(held.sum(axis=1).max()), 1)
        ids = np.zeros((held.shape[0], slots), dtype=np.int64)
        weight = np.zeros((held.shape[0], slots))
        for r in range(held.shape[0]):
            e = np.flatnonzero(held[r])
            ids[r, :e.size], weight[r, :e.size] = e, self.share[r, e]
        return ids, weight

    @cached_property
    def u(self) -> np.ndarray:
        """``Phi(z)``: the draws as uniform quantiles, ``(DRAWS, E)``."""
        # scipy on use: importing it costs every dense run 0.13 s of CPU.
        from scipy.special import ndtr  # noqa: PLC0415
        return ndtr(self.z)

    def active_experts(self, tokens: int) -> np.ndarray:
        """Expected experts (replicas) with at least one token on each rank, ``(ranks,)``:
        ``sum_e share * (1 - exp(-T k p_e / copies))`` (Poisson arrivals)."""
        copies = (self.share > 0).sum(axis=0)
        lam = tokens * self.top_k * self.p / np.maximum(copies, 1)
        return (self.share > 0) @ (1.0 - np.exp(-lam))

    def expert_counts(self, tokens: int, rows=None) -> np.ndarray:
        """Whole rows routed to each expert in every pre-drawn state, ``(DRAWS, E)``.

        Expert e's count is the Poisson(``T k p_e``) quantile of ``Phi(z_e)`` (the same
        standard normals as :meth:`expert_loads`, so hot draws stay hot); for means above
        :data:`POISSON_MAX_MEAN` the normal draw rounded to whole rows. The row sums are
        ``T k`` in expectation, not exactly. Vectorised: one comparison per possible count
        below the largest small-mean quantile, no loop over tokens.
        """
        z, uz = (self.z, self.u) if rows is None else (self.z[rows], self.u[rows])
        lam = tokens * self.top_k * self.p
        big = lam > POISSON_MAX_MEAN
        counts = np.rint(np.maximum(lam + np.sqrt(lam) * z, 0.0))
        small = ~big
        if small.any():
            lam_s, u = lam[small], uz[:, small]
            # Poisson CDF F(j) for j = 0.. until every column's F passes max(u).
            pmf, cdf = np.exp(-lam_s), np.exp(-lam_s)
            c = np.zeros(u.shape)
            j, top = 0, float(u.max()) if u.size else 0.0
            while np.any(cdf < top) and j < 1000:
                c += u > cdf
                j += 1
                pmf = pmf * lam_s / j
                cdf = cdf + pmf
            counts[:, small] = c
        return counts

    def local_counts(self, tokens: int, rows=None) -> np.ndarray:
        """Rows of each expert copy held by each rank, ``(DRAWS, ranks, slots)`` (or the
        states ``rows``): the :meth:`expert_counts` of the experts a rank holds times its
        share of them (a replicated expert's rows split evenly), zero in unused slots."""
        ids, weight = self.slots
        return self.expert_counts(tokens, rows)[:, ids] * weight


@lru_cache(maxsize=256)
def _built(cls: type, p_bytes: bytes, dtype: str, shape: tuple, ranks: int, redundant: int,
           top_k: int, seed: int) -> Routing:
    """:meth:`Routing.build`, memoized on its arguments (the popularity by value): a plan
    builds the same routing for many candidates, and one instance keeps its cached
    tables (:attr:`Routing.slots`, :attr:`Routing.u`). Its arrays are read-only, so the
    instances can be shared."""
    p = np.frombuffer(p_bytes, dtype=dtype).reshape(shape).copy()
    z = np.random.default_rng([seed, 14]).standard_normal((DRAWS, p.size))
    share = placement(p, ranks, redundant)
    for a in (p, z, share):
        a.flags.writeable = False
    return cls(p, share, z, top_k)


def imbalance(rank_loads: np.ndarray) -> np.ndarray:
    """Max rank tokens / mean rank tokens, per row (1 when no token is routed)."""
    mean = row_sum(rank_loads) / rank_loads.shape[-1]
    return np.divide(rank_loads.max(axis=-1), mean, out=np.ones_like(mean), where=mean > 0)
