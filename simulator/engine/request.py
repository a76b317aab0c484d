"""A request's live state inside a replica (created at arrival, dropped at completion)."""

from __future__ import annotations

WAITING, PREFILL, DECODE, DONE, SWAPPED = 0, 1, 2, 3, 4


class Request:
    """Live state of one request; plain slots, no behaviour.

    ``target`` tokens must be prefilled before the next token is sampled: the prompt, plus
    every generated token after a recompute preemption. While decoding, the KV length and
    the token count follow from the step counter (``kv0``/``g0`` at step ``k0``), so a
    decode step touches no request.
    """

    __slots__ = ("id", "arrival_s", "prompt", "output", "replica", "state", "target",
                 "computed", "blocks", "generated", "k0", "kv0", "epoch", "admit_seq",
                 "first_scheduled_s", "first_token_s", "finish_s", "preemptions", "status",
                 "client", "last_token_s", "retries", "reason", "hashes", "session",
                 "units", "shared", "next_unit", "cached_tokens", "spec_steps", "spec_accepted",
                 "requeued", "queued_s")

    def __init__(self, rid: int, arrival_s: float, prompt: int, output: int, client: int = -1):
        self.id, self.arrival_s, self.prompt, self.output = rid, arrival_s, prompt, output
        self.client = client
        self.replica = -1
        self.state = WAITING
        self.target = prompt
        self.computed = 0
        self.blocks = 0
        self.generated = 0
        self.k0 = 0
        self.kv0 = 0
        self.epoch = 0
        self.admit_seq = 0
        self.first_scheduled_s = float("nan")
        self.first_token_s = float("nan")
        self.finish_s = float("nan")
        self.preemptions = 0
        self.status = ""
        self.last_token_s = float("nan")  # set when preempted: time of its last token
        self.retries = 0  # times its replica went down under it
        self.reason = ""  # why it did not complete
        # Prefix caching (simulator.engine.prefix): chained hashes of the request's full
        # token blocks (None: nothing known, nothing shared), its session, the cached blocks
        # it references, their KV blocks, the next block to cache, the prompt tokens found
        # cached at its first admission.
        self.hashes = None
        self.session = -1
        self.units: list = []
        self.shared = 0
        self.next_unit = 0
        self.cached_tokens = 0
        # Speculative decoding: verification steps it took part in, drafts accepted in them.
        self.spec_steps = 0
        self.spec_accepted = 0
        # Rerouted after a failure: [failed at, admitted again at (NaN: not yet)] per
        # reroute of a request that had been admitted (None: never).
        self.requeued: list[list[float]] | None = None
        # When it last joined a replica's queue (async admission gates on it).
        self.queued_s = arrival_s
