"""The shapes a calibration collector times: one table per family, in ``check``'s columns.

``calibrate fit`` fits a handful of parameters per family (launch latency, compute and
bandwidth efficiencies, tile sizes, per-pair attention costs, collective algorithm
latencies); what it needs is coverage of the regimes those parameters separate, not a
dense lookup grid. Each plan below spans them:

- GEMM: tokens ``m`` from 1 to 16,384 (launch-bound, bandwidth-bound, compute-bound; the
  odd counts 17, 33, ... expose tile quantization), weight shapes ``n x k`` of transformer
  projections from 1,024 to 28,672, in 16-bit and, where the GPU has tensor cores for it,
  FP8 (the token counts and feature sizes follow AIConfigurator's GEMM sweep,
  ``collector/cases/base_ops/gemm.yaml``, Apache-2.0).
- Prefill attention: batch 1-64 x prompt 16-16,384, the head layouts of current models
  (MHA 32/32 x 128, GQA 64/8 x 128 and 8/1 x 128 per GPU, head_dim 64 and 256), full and
  sliding windows.
- Decode attention: batch 1-1,024 x context 16-131,072 (cache-read bound to launch bound).
- NCCL: all_reduce, all_gather, reduce_scatter and alltoall over 2, 4, 8 GPUs (as many as
  the machine has), 4 KiB to 1 GiB messages, fp16 (NVLS-eligible) and int8.

``quick`` keeps every regime at about a tenth of the rows (a few minutes on one GPU).
"""

from __future__ import annotations

import itertools

import pandas as pd

FAMILIES = ("gemm", "attention_context", "attention_generation", "nccl")

GEMM_M = (1, 2, 4, 8, 16, 17, 32, 33, 64, 65, 128, 129, 256, 257, 512, 1024, 2048, 4096,
          8192, 16384)
GEMM_M_QUICK = (1, 8, 33, 128, 512, 2048, 8192)
#: (n, k) of transformer projections: attention qkv / o, MLP up / down at 8B-70B sizes and
#: their TP slices.
GEMM_NK = ((1024, 4096), (4096, 4096), (6144, 4096), (4096, 14336), (14336, 4096),
           (28672, 8192), (8192, 28672), (10240, 8192), (8192, 8192), (2048, 8192),
           (8192, 3584), (7168, 8192))
GEMM_NK_QUICK = ((4096, 4096), (14336, 4096), (8192, 28672))

#: (heads, kv heads, head_dim) per GPU.
HEADS = ((32, 32, 128), (64, 8, 128), (8, 1, 128), (16, 16, 64), (32, 16, 256))
HEADS_QUICK = ((32, 32, 128), (64, 8, 128))
PREFILL_B = (1, 2, 4, 16, 64)
PREFILL_S = (16, 64, 256, 1024, 2048, 4096, 8192, 16384)
PREFILL_B_QUICK = (1, 4)
PREFILL_S_QUICK = (64, 1024, 8192)
#: Prefill tokens per row are capped: the largest kernels take tens of milliseconds.
PREFILL_MAX_TOKENS = 65536
DECODE_B = (1, 4, 16, 64, 256, 1024)
DECODE_KV = (15, 127, 1023, 4095, 16383, 65535, 131071)
DECODE_B_QUICK = (1, 16, 256)
DECODE_KV_QUICK = (127, 4095, 32767)
#: Decode cache per row is capped (tokens x kv heads x head_dim x 2 x 2 bytes <= 8 GiB).
DECODE_MAX_CACHE_BYTES = 8 * 2**30
WINDOWS = (0, 1024)

NCCL_OPS = ("all_reduce", "all_gather", "reduce_scatter", "alltoall")
NCCL_BYTES = tuple(4096 * 4**i for i in range(10)) + (2**30,)  # 4 KiB .. 1 GiB
NCCL_BYTES_QUICK = (4096, 262144, 16777216, 268435456)
NCCL_DTYPES = ("half", "int8")


def gemm(dtypes: tuple[str, ...], quick: bool = False) -> pd.DataFrame:
    """GEMM shapes ``[m, k] x [k, n]`` for each dtype (``check``'s ``gemm.csv`` columns)."""
    ms, nks = (GEMM_M_QUICK, GEMM_NK_QUICK) if quick else (GEMM_M, GEMM_NK)
    rows = [(dt, m, n, k) for dt in dtypes for (n, k) in nks for m in ms]
    return pd.DataFrame(rows, columns=["dtype", "m", "n", "k"])


def attention_context(kv_dtypes: tuple[str, ...], quick: bool = False) -> pd.DataFrame:
    """Prefill attention shapes: one layer, causal, batch x prompt."""
    heads = HEADS_QUICK if quick else HEADS
    bs, ss = (PREFILL_B_QUICK, PREFILL_S_QUICK) if quick else (PREFILL_B, PREFILL_S)
    rows = []
    for kv, (h, g, d), w, b, s in itertools.product(kv_dtypes, heads, WINDOWS, bs, ss):
        if b * s > PREFILL_MAX_TOKENS or (w and s <= w):
            continue
        rows.append((b, s, h, g, d, "bfloat16", kv, w))
    return pd.DataFrame(rows, columns=["batch_size", "q_len", "num_heads",
                                       "num_key_value_heads", "head_dim", "attn_dtype",
                                       "kv_cache_dtype", "window_size"])


def attention_generation(kv_dtypes: tuple[str, ...], quick: bool = False) -> pd.DataFrame:
    """Decode attention shapes: one new token per sequence over ``kv_len`` cached ones."""
    heads = HEADS_QUICK if quick else HEADS
    bs, kvs = (DECODE_B_QUICK, DECODE_KV_QUICK) if quick else (DECODE_B, DECODE_KV)
    rows = []
    for kv, (h, g, d), w, b, n in itertools.product(kv_dtypes, heads, WINDOWS, bs, kvs):
        cache = b * (n + 1) * g * d * 2 * 2
        if cache > DECODE_MAX_CACHE_BYTES or (w and n <= w):
            continue
        rows.append((b, n, h, g, d, "bfloat16", kv, w))
    return pd.DataFrame(rows, columns=["batch_size", "kv_len", "num_heads",
                                       "num_key_value_heads", "head_dim", "attn_dtype",
                                       "kv_cache_dtype", "window_size"])


def nccl(max_gpus: int, quick: bool = False) -> pd.DataFrame:
    """Collective shapes over 2, 4, 8, ... GPUs up to ``max_gpus`` (empty below 2)."""
    sizes = NCCL_BYTES_QUICK if quick else NCCL_BYTES
    gpus = [g for g in (2, 4, 8, 16, 32, 64, 72) if g <= max_gpus]
    rows = [(op, dt, g, b) for g in gpus for op in NCCL_OPS for dt in NCCL_DTYPES
            for b in sizes]
    return pd.DataFrame(rows, columns=["op_name", "dtype", "num_gpus", "message_bytes"])


def plan(families: tuple[str, ...], gemm_dtypes: tuple[str, ...],
         kv_dtypes: tuple[str, ...], max_gpus: int, quick: bool = False
         ) -> dict[str, pd.DataFrame]:
    """Every requested family's shape table (families with no rows are left out)."""
    build = {"gemm": lambda: gemm(gemm_dtypes, quick),
             "attention_context": lambda: attention_context(kv_dtypes, quick),
             "attention_generation": lambda: attention_generation(kv_dtypes, quick),
             "nccl": lambda: nccl(max_gpus, quick)}
    out = {f: build[f]() for f in families}
    return {f: df for f, df in out.items() if len(df)}
