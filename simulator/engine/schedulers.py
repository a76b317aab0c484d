"""Replica schedulers other than vLLM v1, and the registry of all of them.

Each is a :class:`~simulator.engine.batching.ContinuousBatcher` that overrides how a step is
formed (``form``) or how KV blocks are held (the ``_*_blocks`` hooks). ``PARAMS`` lists
the keyword parameters a scheduler takes (``[engine] scheduler_args``) with defaults.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simulator import registry
from simulator.engine.batching import Batch, ContinuousBatcher
from simulator.engine.kvcache import blocks_for
from simulator.engine.request import Request

if TYPE_CHECKING:
    from simulator.io.schema import EngineKeys


class PrefillFirst(ContinuousBatcher):
    """vLLM v0's default: a step is either all prefill or all decode, prefills first, no
    chunking (a prompt runs whole in one step; decodes stall meanwhile). Swapped requests
    come back before new prompts are admitted."""

    #: Prompts run whole, so the token budget bounds the context (see build.py).
    CHUNKED = False

    def _prepare(self) -> None:
        """Nothing: whether swapped requests come back decides the step's kind (form)."""

    def form(self, now: float) -> Batch | None:
        chunks: list[tuple[Request, int]] = []
        if not self.swapped:
            self._admit(self.max_tokens, chunks, now, chunked=False)
            if chunks:
                return self._batch(0, chunks)
        self._swap_in()
        self._schedule_decodes(now)
        return self._batch(len(self.decoding), chunks)


class PrefillPriority(ContinuousBatcher):
    """SGLang's default: while a prompt waits or is part-way through, a step is prefill
    only, up to the token budget (``chunked_prefill_size``), chunking the prompt that
    does not fit; decodes run when no prefill work is left (``Scheduler
    .get_next_batch_to_run`` runs ``get_new_batch_prefill()`` first; mixed chunks are
    off, ``ServerArgs.enable_mixed_chunk = False``)."""

    def form(self, now: float) -> Batch | None:
        if not self.swapped and (self.prefilling or self.waiting):
            chunks: list[tuple[Request, int]] = []
            budget = self._continue_prefills(self.max_tokens, chunks, now)
            self._admit(budget, chunks, now)
            if chunks:
                return self._batch(0, chunks)
        return super().form(now)


class Sarathi(ContinuousBatcher):
    """Sarathi-Serve: stall-free batching with a fixed token budget per step
    (``chunk_size``): decodes first, then prefill chunks fill the rest."""

    PARAMS = {"chunk_size": 512}

    def __init__(self, *args, chunk_size: int = 512, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_tokens = max(chunk_size, self.max_seqs)


class Reserving(ContinuousBatcher):
    """Orca: iteration-level batching with KV memory reserved at admission for the longest
    sequence a request may reach: ``reserve_tokens`` (default ``max_model_len``), and never
    less than the request's own prompt + output. No paging, so decodes never need a new
    block and nothing is preempted. Prompts run whole."""

    PARAMS = {"reserve_tokens": None}
    CHUNKED = False
    PREFIX = False  # memory is reserved per request, never shared
    PAGED = False

    def __init__(self, *args, reserve_tokens: int | None = None, max_model_len: int = 0,
                 **kwargs):
        super().__init__(*args, **kwargs)
        self.reserve = reserve_tokens or max_model_len

    def _decode_need(self, step: int) -> int:
        return 0

    def run_blocks(self, steps: int) -> int:
        return 0

    def run_needs(self, steps: int) -> list[int]:
        return [0] * steps

    def _admit_blocks(self, req: Request, tokens: int) -> int:
        return blocks_for(max(self.reserve, req.prompt + req.output), self.bs)

    def _chunk_blocks(self, req: Request, tokens: int) -> int:
        return 0

    def _held_blocks(self, req: Request, kv_tokens: int) -> int:
        return req.blocks

    def form(self, now: float) -> Batch | None:
        chunks: list[tuple[Request, int]] = []
        n_decode = len(self.decoding)
        self._admit(self.max_tokens - n_decode * self._decode_tokens, chunks, now,
                    chunked=False)
        return self._batch(n_decode, chunks)


class Static(Reserving):
    """Request-level (static) batching, as FasterTransformer: a batch of up to
    ``max_num_seqs`` waiting requests is prefilled together and decoded until every one has
    finished; only then is the next batch formed. Memory is reserved as in Orca."""

    CHUNKED = True  # the whole batch's prompts run in one step, whatever the token budget

    def form(self, now: float) -> Batch | None:
        chunks: list[tuple[Request, int]] = []
        if not self.decoding and not self.prefilling:
            self._admit(2**62, chunks, now, chunked=False)  # the whole batch at once
        return self._batch(len(self.decoding), chunks)

    def can_admit(self) -> bool:
        return not self.decoding and not self.prefilling and not self.waiting


#: Registered schedulers (``[engine] scheduler``): name -> class, whose PARAMS are the
#: ``scheduler_args`` it accepts; the one place a scheduler is added.
SCHEDULERS = registry.SCHEDULERS.add({
    "vllm": ContinuousBatcher,
    "vllm_v0": PrefillFirst,
    "sglang": PrefillPriority,
    "sarathi": Sarathi,
    "orca": Reserving,
    "static": Static,
})


def sarathi_chunk(engine: EngineKeys) -> int:
    """The ``sarathi`` chunk size (tokens) an ``[engine]`` table asks for: its
    ``scheduler_args.chunk_size``, else :class:`Sarathi`'s default."""
    return (engine.scheduler_args or {}).get("chunk_size", Sarathi.PARAMS["chunk_size"])
