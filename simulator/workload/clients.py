"""Named benchmark clients: how ``vllm bench serve``, ``sglang.bench_serving``, AIPerf /
genai-perf and ``trtllm-bench`` drive a server at fixed concurrency.

Every one of them, at ``--request-rate inf`` with a maximum concurrency C, creates one
task per request and lets C of them hold a semaphore at a time: C requests start together
and each finished request's slot goes to the next at once (``arrival = "closed_loop"``).
They differ in their warm-up before the measured requests and in whether a request goes
through the server's HTTP front end (tokenized there) or is handed to the engine
in-process as token ids. All four count TTFT from the send of the request (after its
semaphore wait) to its first streamed token, and TPOT as
``(latency - TTFT) / (output tokens - 1)`` per request, averaged over requests: the
simulator's own ``ttft_s`` and ``tpot_s``. Sources are cited in docs/scenario.md
("Benchmark clients").
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator import registry


@dataclass(frozen=True)
class BenchClient:
    """What a named benchmark client does besides its closed loop.

    Attributes
    ----------
    warmups : int
        Requests sent before the measured run and left out of its results.
    warmup_output : int or None
        Output tokens of each warm-up (None: the first request's own length).
    warmups_together : bool
        Warm-ups sent all at once (True) or one after the other (False).
    pause_s : float
        Seconds between the last warm-up's end and the measured run's start.
    through_api : bool
        Requests pass the server's API front end (HTTP, tokenization; the
        ``[engine] api_request_s`` and ``api_token_s`` keys); False: token ids handed
        to the engine in-process.
    """

    warmups: int
    warmup_output: int | None
    warmups_together: bool
    pause_s: float
    through_api: bool


#: The named clients (``[workload] client``).
CLIENTS = registry.CLIENTS.add({
    # vllm/benchmarks/serve.py `benchmark`: "Starting initial single prompt test run..."
    # sends input_requests[0] with its own output length and waits for it; --num-warmups
    # (default 0) more of the same; then every request at once behind the semaphore.
    "vllm-bench": BenchClient(1, None, False, 0.0, True),
    # python/sglang/bench_serving.py `benchmark`: --warmup-requests (default 1) copies of
    # input_requests[0] with min(output_len, 32) output tokens, gathered together, then
    # time.sleep(1.0) before the run.
    "sglang-bench": BenchClient(1, 32, True, 1.0, True),
    # aiperf/timing/credit_issuing_strategy.py: a WARMUP phase of
    # --warmup-request-count requests (default 0, config_defaults.py) under the same
    # concurrency, waited for, then the PROFILING phase. genai-perf takes the same flag
    # with the same default.
    "aiperf": BenchClient(0, None, True, 0.0, True),
    "genai-perf": BenchClient(0, None, True, 0.0, True),
    # tensorrt_llm/bench/benchmark/utils/asynchronous.py `LlmManager`: requests are
    # pre-tokenized input_ids given to the in-process LLM API (`generate_async`) behind
    # an asyncio.Semaphore(concurrency); throughput.py --warmup (default 2) requests
    # first.
    "trtllm-bench": BenchClient(2, None, True, 0.0, False),
})
