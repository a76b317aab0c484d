"""KV-cache transfers from a prefill instance to a decode instance (disaggregated serving).

What moves: the prompt's KV, ``2 x layers x n_kv x d x b_kv`` bytes per token (MLA: the
latent, ``layers x (kv_lora_rank + qk_rope_head_dim) x b_kv``, which every TP rank holds
whole, or only the serving rank with attention data parallelism; DeepSeek sparse
attention adds the indexer's FP8 key per token and indexed layer; a hybrid model's Gated
DeltaNet layers add no KV but a fixed recurrent state per request), split by
the layer (PP) and KV-head (TP) sharding of both sides. Each decode GPU needs the heads and
layers it holds; it takes each (layer range, head) from one prefill GPU that holds it, so a
TP mismatch makes each decode rank gather from several prefill ranks (or several decode
ranks read one prefill rank). Each (prefill GPU, decode GPU) pair is one flow over the
graph route between them, and every flow of every transfer shares links max-min fairly
(:class:`simulator.topology.flows.FlowNetwork`, links at the point-to-point efficiency
``BANDWIDTH_EFFICIENCY``, as pipeline hand-offs); the transfer ends when its last flow has
arrived (bytes, then the path latency).

Modes: ``after_prefill`` moves everything once the prefill ends; ``layerwise`` sends each
layer's KV as the prefill computes it, so only what the uncontended links could not move
during the prefill remains, and at least the last layer's share:
``exposed = max(1 / layers, 1 - overlap_s / t_alone)`` of the bytes, with ``t_alone`` the
transfer's time alone on the links (the overlapped part is priced uncontended).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from simulator.model.memory import split_layers
from simulator.model.spec import ModelSpec
from simulator.parallel.collective import BANDWIDTH_EFFICIENCY, Links
from simulator.topology.flows import Flow, FlowNetwork, finish_times
from simulator.topology.graph import Paths

Stages = Sequence[Sequence[str]]  # per pipeline stage, the TP group's GPU names


def kv_heads_of(n_kv: int, tp: int, rank: int) -> range:
    """KV heads TP rank ``rank`` holds: ``n_kv / tp`` consecutive heads, or (tp > n_kv)
    the one head it shares with ``tp / n_kv - 1`` other ranks."""
    if tp <= n_kv:
        per = n_kv // tp
        return range(rank * per, (rank + 1) * per)
    h = rank * n_kv // tp
    return range(h, h + 1)


def _layer_ranges(layers: int, pp: int) -> list[range]:
    out, start = [], 0
    for n in split_layers(layers, pp):
        out.append(range(start, start + n))
        start += n
    return out


def kv_flows(model: ModelSpec, kv_bytes: float, src: Stages, dst: Stages,
             src_rank: int | None = None, dst_rank: int | None = None
             ) -> list[tuple[str, str, float]]:
    """The flows of one token's KV from a prefill replica to a decode replica.

    Parameters
    ----------
    model : ModelSpec
    kv_bytes : float
        Bytes per KV element (2 for bf16, 1 for fp8).
    src, dst : sequence of sequences of str
        GPU names of the prefill and decode replicas, per stage, in TP rank order.
    src_rank, dst_rank : int, optional
        On a side with attention data parallelism, the TP rank that holds the request's
        whole cache (every head); None: the side's TP ranks share it (heads split by
        :func:`kv_heads_of`).

    Returns
    -------
    list of (src_gpu, dst_gpu, bytes_per_token)
        One entry per GPU pair that exchanges KV, in a fixed order.

    Notes
    -----
    Decode rank q of stage j needs, for every layer of its stage and every head it holds,
    ``2 d b`` bytes per token; it reads them from the prefill stage holding the layer, from
    rank ``holders[q % len(holders)]`` among the prefill ranks holding the head (spreading
    replicated heads over their holders). The bytes summed over pairs are ``2 L d b x
    sum_q |heads(q)|``: the whole KV once per decode replica of each head. An MLA model
    caches one latent of ``kv_lora_rank + qk_rope_head_dim`` values per token and layer,
    which TP does not shard: it is one "head" of that width that every TP rank holds (so
    each decode rank reads the whole latent), or, with attention data parallelism, only
    the rank serving the request. DeepSeek sparse attention adds its indexer key (FP8 and
    its scale) per token on each layer that runs an indexer; a hybrid model's
    linear-attention layers hold no KV (their state moves by :func:`state_flows`).
    """
    if model.mla is not None:
        units, per = 1, model.mla.cache_width * kv_bytes
        dsa = model.dsa

        def span(lo: int, n: int) -> float:
            return n * per + (dsa.key_bytes * dsa.indexed(lo, n) if dsa is not None else 0)
    else:
        units, per = model.kv_heads, 2 * model.head_dim * kv_bytes

        def span(lo: int, n: int) -> float:
            return model.full_attention_layers(lo, n) * per
    return _pair_bytes(model.layers, units, span, src, dst, src_rank, dst_rank)


def state_flows(model: ModelSpec, src: Stages, dst: Stages, src_rank: int | None = None,
                dst_rank: int | None = None) -> list[tuple[str, str, float]]:
    """The flows of one request's recurrent state (hybrid linear attention: the
    ``d_k x d_v`` state per value head and the convolution state of every Gated DeltaNet
    layer, in the model's state dtype), as :func:`kv_flows` pairs the GPUs: value heads
    split over TP like KV heads. ``(src_gpu, dst_gpu, bytes_per_request)``; empty for a
    model without linear-attention layers."""
    lin = model.linear
    if lin is None:
        return []
    per = lin.state_bytes_per_seq(1, 1) / lin.value_heads  # one value head of one layer

    def span(lo: int, n: int) -> float:
        return (n - model.full_attention_layers(lo, n)) * per
    return _pair_bytes(model.layers, lin.value_heads, span, src, dst, src_rank, dst_rank)


def _pair_bytes(layers: int, units: int, span, src: Stages, dst: Stages,
                src_rank: int | None, dst_rank: int | None) -> list[tuple[str, str, float]]:
    """Bytes per (prefill GPU, decode GPU) pair: ``span(lo, n)`` bytes per unit (head)
    over the layers ``lo .. lo+n-1`` both stages hold, each decode rank's units read from
    one prefill rank holding them (:func:`kv_flows`, Notes)."""
    def held(tp: int, q: int, rank: int | None) -> range:
        if rank is None:
            return kv_heads_of(units, tp, q)
        return range(units) if q == rank else range(0)

    s_layers = _layer_ranges(layers, len(src))
    d_layers = _layer_ranges(layers, len(dst))
    tp_s = len(src[0])
    holders: dict[int, list[int]] = defaultdict(list)
    for r in range(tp_s):
        for h in held(tp_s, r, src_rank):
            holders[h].append(r)
    pairs: dict[tuple[str, str], float] = {}
    for j, group in enumerate(dst):
        for q, gpu in enumerate(group):
            for i, stage in enumerate(src):
                lo = max(s_layers[i].start, d_layers[j].start)
                overlap = len(range(lo, min(s_layers[i].stop, d_layers[j].stop)))
                if overlap <= 0:
                    continue
                nbytes = span(lo, overlap)
                for h in held(len(group), q, dst_rank):
                    rs = holders[h]
                    key = (stage[rs[q % len(rs)]], gpu)
                    pairs[key] = pairs.get(key, 0.0) + nbytes
    return [(a, b, x) for (a, b), x in pairs.items() if x > 0]


class KVTransfers:
    """Every KV transfer of a run on one max-min fair flow network over the graph.

    Parameters
    ----------
    env : simpy.Environment
    graph : networkx.DiGraph
        The joined graph of all pools.
    model : ModelSpec
    quantum_s : float
        The engine clock's tick (events are rounded up to it).
    """

    def __init__(self, env, graph, model: ModelSpec, quantum_s: float):
        self.env, self.model = env, model
        self.paths = Paths(graph)
        self.links = Links(self.paths)
        capacity = {(a, b): d["bandwidth_Bps"] * BANDWIDTH_EFFICIENCY
                    for a, b, d in graph.edges(data=True)}
        self.capacity = capacity
        self.network = FlowNetwork(env, capacity, quantum_s)
        self._routes: dict[tuple, tuple] = {}
        #: (time, tokens, KV flows, state flows) of every transfer started
        self._started: list[tuple[float, int, list, list]] = []

    def route(self, src: Stages, dst: Stages, kv_bytes: float,
              ranks: tuple[int | None, int | None] = (None, None)) -> tuple:
        """``(flows, seconds_per_token_alone, latency_s, state)`` between two replicas: each
        flow ``(edges, bytes_per_token, latency_s)``; the time alone is the max-min fluid
        finish of one token's flows with nothing else on the links (it scales with
        tokens); ``state``: the flows ``(edges, bytes, latency_s)`` of a request's
        recurrent state (:func:`state_flows`; empty without linear-attention layers).
        ``ranks``: the (prefill, decode) ranks holding the request's cache on attention-DP
        sides (:func:`kv_flows`)."""
        key = (tuple(map(tuple, src)), tuple(map(tuple, dst)), kv_bytes, ranks)
        hit = self._routes.get(key)
        if hit is None:
            flows = [(self.links(a, b), x, self.paths.latency(a, b))
                     for a, b, x in kv_flows(self.model, kv_bytes, src, dst, *ranks)]
            alone = finish_times([Flow(e, x) for e, x, _ in flows], self.capacity)
            # a hybrid model's recurrent state: bytes per request, on the same pairing
            state = [(self.links(a, b), x, self.paths.latency(a, b))
                     for a, b, x in state_flows(self.model, src, dst, *ranks)]
            hit = self._routes[key] = (flows, float(np.max(alone)),
                                       max(lat for _, _, lat in flows + state), state)
        return hit

    def time_alone(self, tokens: int, src: Stages, dst: Stages, kv_bytes: float) -> float:
        """Uncontended seconds to move ``tokens`` tokens' KV: ``tokens x t_token +
        latency`` (the bottleneck flows' bytes over their max-min rates, plus the
        longest path latency)."""
        _, per_token, latency, _ = self.route(src, dst, kv_bytes)
        return tokens * per_token + latency

    def start(self, tokens: int, src: Stages, dst: Stages, kv_bytes: float,
              overlap_s: float = 0.0, layers: int = 1,
              ranks: tuple[int | None, int | None] = (None, None)):
        """Start moving ``tokens`` tokens' KV now; returns ``(event, bytes)``: the event
        fires when every flow has arrived.

        ``overlap_s`` > 0 (layer-wise mode): prefill compute the transfer overlapped with;
        only ``max(1 / layers, 1 - overlap_s / t_alone)`` of each flow remains to move.
        ``ranks`` as in :meth:`route`.
        """
        flows, per_token, _, state = self.route(src, dst, kv_bytes, ranks)
        frac = 1.0
        if overlap_s > 0 and tokens > 0:
            frac = max(1.0 / layers, 1.0 - overlap_s / (tokens * per_token))
        events = [self.network.transfer(e, tokens * x * frac, lat) for e, x, lat in flows]
        # the recurrent state is whole only once the prefill's last chunk has run
        events += [self.network.transfer(e, x, lat) for e, x, lat in state]
        self._started.append((self.env.now, tokens, flows, state))
        total = tokens * sum(x for _, x, _ in flows) + sum(x for _, x, _ in state)
        return self.env.all_of(events), total

    def link_bytes(self) -> tuple[np.ndarray, list[tuple[str, str]], np.ndarray]:
        """Bytes each started transfer put on each directed link: ``(start_s, link,
        bytes)`` per transfer and link of its flows (every byte of the KV, also the part a
        layer-wise transfer moved during the prefill, and a hybrid model's state)."""
        times, links, nbytes = [], [], []
        for t0, tokens, flows, state in self._started:
            carried: dict[tuple[str, str], float] = {}
            for (edges, x, _), n in [*((f, tokens) for f in flows), *((f, 1) for f in state)]:
                for e in edges:
                    carried[e] = carried.get(e, 0.0) + n * x
            times += [t0] * len(carried)
            links.extend(carried)
            nbytes.extend(carried.values())
        return np.array(times, dtype=float), links, np.array(nbytes, dtype=float)
