"""Time kernels with PyTorch: GEMMs, prefill and decode attention, NCCL collectives.

Imported only by ``calibrate collect --timer torch`` (PyTorch is not a dependency of the
simulator). Each row is timed the way AIConfigurator's collector does it
(``collector/helper.py:benchmark_with_power``, Apache-2.0): a few eager warm-ups, the
kernel captured ``REPEAT`` times into one CUDA graph (eager when capture fails), warm-up
replays, then CUDA events around ``RUNS`` replays; latency = elapsed / (RUNS x REPEAT).
On a CPU device (for testing the code path) wall time replaces CUDA events.

Kernels, best available first, named in each row's ``kernel_source``:
- GEMM: ``torch.nn.functional.linear`` (16-bit); FP8 as the engines run it: dynamic
  per-tensor activation quantization then ``torch._scaled_mm`` (cuBLASLt), both timed.
- Attention: FlashAttention (``flash_attn``: ``flash_attn_func`` for prefill,
  ``flash_attn_with_kvcache`` for decode) when installed, else PyTorch's
  ``scaled_dot_product_attention``. Rows these cannot run (an FP8 KV cache, which the
  engines read through FlashInfer or their own kernels; a sliding window under SDPA) are
  skipped and counted in the collection's README, never priced by a stand-in kernel.
- Collectives: ``torch.distributed`` with the NCCL backend, one process per GPU on this
  node (``torch.multiprocessing``), the latency of rank 0 after a barrier.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import time
from collections.abc import Callable, Iterator

import pandas as pd
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F  # noqa: N812 - PyTorch's own spelling

WARMUPS = 3
RUNS = 10
REPEAT = 5
FP8 = getattr(torch, "float8_e4m3fn", None)
HAS_FLASH_ATTN = importlib.util.find_spec("flash_attn") is not None


def time_fn(fn: Callable[[], object], device: torch.device) -> float:
    """Microseconds of one call of ``fn`` (see the module docstring)."""
    for _ in range(WARMUPS):
        fn()
    if device.type != "cuda":
        start = time.perf_counter()
        for _ in range(RUNS * REPEAT):
            fn()
        return (time.perf_counter() - start) / (RUNS * REPEAT) * 1e6
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(REPEAT):
                fn()
        replay = graph.replay
    except RuntimeError:  # a kernel that cannot be captured runs eagerly
        graph = None

        def replay():
            for _ in range(REPEAT):
                fn()
    for _ in range(WARMUPS):
        replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(RUNS):
        replay()
    end.record()
    torch.cuda.synchronize(device)
    del graph
    return start.elapsed_time(end) * 1e3 / (RUNS * REPEAT)


def gemm_fn(dtype: str, m: int, n: int, k: int, device: torch.device):
    """(callable, kernel_source) of one ``[m, k] x [k, n]`` GEMM, or (None, reason)."""
    x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
    w = torch.randn(n, k, dtype=torch.bfloat16, device=device)
    if dtype in ("bfloat16", "float16", "half"):
        dt = torch.bfloat16 if dtype == "bfloat16" else torch.float16
        x, w = x.to(dt), w.to(dt)
        return (lambda: F.linear(x, w)), "torch.nn.functional.linear"
    if dtype == "fp8" and FP8 is not None and device.type == "cuda":
        w8 = w.to(FP8)
        one = torch.ones((), device=device)
        finfo = torch.finfo(FP8)

        def run():
            scale = x.abs().amax().float().clamp(min=1e-12) / finfo.max
            x8 = (x / scale).clamp(finfo.min, finfo.max).to(FP8)
            return torch._scaled_mm(x8, w8.t(), scale_a=scale, scale_b=one,
                                    out_dtype=torch.bfloat16)
        return run, "torch._scaled_mm+dynamic_quant"
    return None, f"skipped: no {dtype} GEMM on {device.type}"


def _window(w: int) -> tuple[int, int]:
    return (w - 1, 0) if w > 0 else (-1, -1)


def prefill_fn(row, device: torch.device):
    """(callable, kernel_source) of one prefill attention row, or (None, reason)."""
    b, s, h, g, d = (int(row[c]) for c in ("batch_size", "q_len", "num_heads",
                                            "num_key_value_heads", "head_dim"))
    w, kv = int(row["window_size"]), str(row["kv_cache_dtype"])
    if kv != "bfloat16":
        return None, f"skipped: a {kv} KV cache needs the engine's FP8 attention kernels"
    q = torch.randn(b, s, h, d, dtype=torch.bfloat16, device=device)
    k = torch.randn(b, s, g, d, dtype=torch.bfloat16, device=device)
    v = torch.randn_like(k)
    if HAS_FLASH_ATTN and device.type == "cuda":
        from flash_attn import flash_attn_func  # noqa: PLC0415 - optional backend
        return (lambda: flash_attn_func(q, k, v, causal=True, window_size=_window(w)),
                "flash_attn.flash_attn_func")
    if w > 0:
        return None, "skipped: a sliding window needs FlashAttention"
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    return (lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True,
                                                   enable_gqa=h != g),
            "torch.scaled_dot_product_attention")


def decode_fn(row, device: torch.device):
    """(callable, kernel_source) of one decode attention row (one new token per sequence
    over ``kv_len`` cached tokens plus its own), or (None, reason)."""
    b, n, h, g, d = (int(row[c]) for c in ("batch_size", "kv_len", "num_heads",
                                            "num_key_value_heads", "head_dim"))
    w, kv = int(row["window_size"]), str(row["kv_cache_dtype"])
    if kv != "bfloat16":
        return None, f"skipped: a {kv} KV cache needs the engine's FP8 attention kernels"
    q = torch.randn(b, 1, h, d, dtype=torch.bfloat16, device=device)
    k = torch.randn(b, n + 1, g, d, dtype=torch.bfloat16, device=device)
    v = torch.randn_like(k)
    if HAS_FLASH_ATTN and device.type == "cuda":
        from flash_attn import flash_attn_with_kvcache  # noqa: PLC0415 - optional backend
        lens = torch.full((b,), n + 1, dtype=torch.int32, device=device)
        return (lambda: flash_attn_with_kvcache(q, k, v, cache_seqlens=lens,
                                                window_size=_window(w)),
                "flash_attn.flash_attn_with_kvcache")
    if w > 0:
        return None, "skipped: a sliding window needs FlashAttention"
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    return (lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=h != g),
            "torch.scaled_dot_product_attention")


BUILDERS = {"attention_context": prefill_fn, "attention_generation": decode_fn}
TORCH_DTYPES = {"half": torch.float16, "int8": torch.int8, "bfloat16": torch.bfloat16}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _collective(op: str, t: torch.Tensor, world: int):
    """The call of one collective on a whole buffer ``t`` (AIConfigurator's convention:
    message_bytes is the whole buffer: all-gather's output, reduce-scatter's input)."""
    part = t[: t.numel() // world]
    if op == "all_reduce":
        return lambda: dist.all_reduce(t)
    if op == "all_gather":
        return lambda: dist.all_gather_into_tensor(t, part)
    if op == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(part, t)
    out = torch.empty_like(t)
    return lambda: dist.all_to_all_single(out, t)


def _nccl_worker(rank: int, world: int, port: int, rows: list, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    device = torch.device("cuda", rank)
    try:
        for i, op, dtype, nbytes in rows:
            dt = TORCH_DTYPES[dtype]
            elems = max(world, nbytes // torch.tensor([], dtype=dt).element_size())
            elems -= elems % world
            t = torch.ones(elems, dtype=dt, device=device)
            fn = _collective(op, t, world)
            dist.barrier()
            us = time_fn(fn, device)
            if rank == 0:
                queue.put((i, us, f"nccl {torch.cuda.nccl.version()}"))
    finally:
        if rank == 0:
            queue.put(None)
        dist.destroy_process_group()


class TorchTimer:
    """Times rows on ``device`` (default: the first CUDA GPU)."""

    def __init__(self, device: str | None = None):
        if device is None and not torch.cuda.is_available():
            raise RuntimeError("no CUDA GPU is visible to PyTorch")
        self.device = torch.device(device or "cuda:0")
        name = (torch.cuda.get_device_name(self.device) if self.device.type == "cuda"
                else "CPU")
        backend = "FlashAttention" if HAS_FLASH_ATTN else "PyTorch SDPA"
        clock = (f"CUDA events over CUDA-graph replays ({RUNS} x {REPEAT} calls per row)"
                 if self.device.type == "cuda" else f"wall clock ({RUNS * REPEAT} calls)")
        self.description = (f"PyTorch {torch.__version__} (CUDA {torch.version.cuda}) on "
                            f"{name}; attention by {backend}; {clock}")

    def max_gpus(self) -> int:
        return torch.cuda.device_count() if self.device.type == "cuda" else 1

    def measure(self, family: str, shapes: pd.DataFrame) -> Iterator[tuple]:
        if family == "nccl":
            yield from self._nccl(shapes)
            return
        for i, row in enumerate(shapes.to_dict("records")):
            if family == "gemm":
                fn, source = gemm_fn(row["dtype"], int(row["m"]), int(row["n"]),
                                     int(row["k"]), self.device)
            else:
                fn, source = BUILDERS[family](row, self.device)
            yield i, (time_fn(fn, self.device) if fn is not None else None), source
            del fn
            if self.device.type == "cuda":
                torch.cuda.empty_cache()

    def _nccl(self, shapes: pd.DataFrame) -> Iterator[tuple]:
        shapes = shapes.reset_index(drop=True)
        for world in sorted(int(g) for g in shapes["num_gpus"].unique()):
            sub = shapes[shapes["num_gpus"] == world]
            rows = [(int(i), r.op_name, r.dtype, int(r.message_bytes))
                    for i, r in zip(sub.index, sub.itertuples(), strict=True)]
            queue = mp.get_context("spawn").SimpleQueue()
            handle = mp.start_processes(_nccl_worker, args=(world, _free_port(), rows, queue),
                                        nprocs=world, join=False, start_method="spawn")
            while (item := queue.get()) is not None:
                yield item
            handle.join()
