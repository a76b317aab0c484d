"""The engine's host CPU work: per step (scheduling, input preparation, sampling,
detokenization, output streaming) and per request (the API server's HTTP handling and
tokenization before the engine sees a request).

Per step the host takes ``h = step_overhead_s + host_seq_s * seqs + host_token_s * tokens``
seconds for a step of ``seqs`` scheduled sequences and ``tokens`` tokens. An engine that
overlaps it with the GPU (``cpu_overlap``: vLLM V1 async scheduling, SGLang's overlap
scheduler, TensorRT-LLM's overlap scheduler) prepares step n + 1 and processes step
n - 1's outputs while step n runs, so a step takes ``max(GPU, h)``; one that does not takes
``GPU + h``. The values per profile and their sources are in docs/cost-model.md ("Host CPU
cost per engine").
"""

from __future__ import annotations

from typing import Any

from simulator.engine.clock import ticks


def host_keys(eng: Any, stage: int) -> dict[str, Any]:
    """The host-cost arguments of pipeline stage ``stage``'s cost model, from the engine
    keys ``eng``: the first stage carries the host's work (the CPU floor when it overlaps
    the GPU, else the per-sequence and per-token parts in line; the fixed part in line
    stays the replica's step overhead); later stages carry none."""
    if stage != 0:
        return {}
    return {"cpu_floor_s": eng.step_overhead_s if eng.cpu_overlap else 0.0,
            "host_seq_s": eng.host_seq_s, "host_token_s": eng.host_token_s,
            "host_inline": not eng.cpu_overlap}



class ApiServer:
    """The API server in front of an engine: one process that handles each request in
    turn (HTTP, validation, tokenization) before the engine sees it.

    A request sent at ``now`` with ``prompt`` tokens starts when the server is free and
    takes ``request_s + token_s * prompt`` seconds; it reaches the engine at the end
    (:meth:`enter`). One process is each engine's default front end (vLLM's
    ``--api-server-count`` 1, SGLang's one TokenizerManager, one ``trtllm-serve``).
    """

    def __init__(self, request_s: float, token_s: float):
        self.request_s, self.token_s = request_s, token_s
        self.free_s = 0.0

    def enter(self, now: float, prompt: int) -> float:
        """When a request sent at ``now`` reaches the engine (s, on the clock's grid)."""
        self.free_s = max(now, self.free_s) + ticks(self.request_s + self.token_s * prompt)
        return self.free_s
