"""Copy the rows of Microsoft Vidur's public profiles that ``vidur_check.py`` needs.

Reads a git directory of github.com/microsoft/vidur (``fetch github:microsoft/vidur``, or a
clone) and writes small, long-format CSVs into ``benchmarks/docs/generations/data/``
(see the README there for what each column times). Times are Vidur's medians, converted
from ms to us.

- ``vidur_gemm.csv``: the four projections of Vidur's ``mlp.csv`` (``attn_pre_proj`` = QKV,
  ``attn_post_proj`` = O, ``mlp_up_proj`` = gate+up, ``mlp_down_proj`` = down) as
  ``[m, k] x [k, n]`` GEMMs per TP rank (ops named ``qkv``, ``o``, ``up``, ``down``), fp16,
  Llama-2-7B and -70B, A100 and H100, every fourth token count (the grid is identical on
  both GPUs, so rows pair up).
- ``vidur_all_reduce.csv``: fp16 all-reduce (NCCL) inside one DGX node (``devices_per_node ==
  num_workers``), every third message size.
- ``vidur_attention.csv``: the only attention profile whose bytes the snapshot holds,
  ``data/profiling/a100/attention.csv`` of Vidur's first public commit (Llama-2-70B, TP2,
  FlashAttention 2 paged kernels, fp16 KV cache); every other prefill row, a fixed-seed
  sample of 1,500 decode rows.

Usage: ``python benchmarks/docs/generations/vidur_extract.py GIT_DIR``
"""

from __future__ import annotations

import argparse
import io
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd

OUT = Path(__file__).resolve().parent / "data"
#: Vidur's HEAD commit read for the MLP and all-reduce profiles.
COMMIT = "7d47513363ec447a741ac5e47241580b47724fbf"
#: Vidur's first public commit (2024-05-08): the A100 attention profile.
ATTENTION_COMMIT = "e2d00e9afba96cec9f0e7ea560bbfc4a539fae6a"
MODELS = ("meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-70b-hf")
#: Vidur op -> (n, k) of its GEMM per TP rank, from the model's shape.
OPS = {"attn_pre_proj": "qkv", "attn_post_proj": "o", "mlp_up_proj": "up",
       "mlp_down_proj": "down"}


def _csv(git_dir: str, commit: str, path: str) -> pd.DataFrame:
    text = subprocess.run(["git", "-C", git_dir, "show", f"{commit}:{path}"], check=True,
                          capture_output=True, text=True).stdout
    return pd.read_csv(io.StringIO(text))


def gemm_shapes(df: pd.DataFrame, op: str) -> tuple[np.ndarray, np.ndarray]:
    """``(n, k)`` of one projection per row of Vidur's ``mlp.csv`` (per TP rank).

    QKV: ``n = (h_q + 2 h_kv) d / tp``, ``k = e``; O: ``n = e``, ``k = h_q d / tp``; gate+up
    (gated MLP): ``n = 2 f / tp``, ``k = e``; down: ``n = e``, ``k = f / tp``
    (e = ``n_embd``, f = ``n_expanded_embd``, d = e / h_q).
    """
    tp = df["num_tensor_parallel_workers"].to_numpy()
    e, f = df["n_embd"].to_numpy(), df["n_expanded_embd"].to_numpy()
    hq, hkv = df["n_head"].to_numpy(), df["n_kv_head"].to_numpy()
    d = e // hq
    gated = df["use_gated_mlp"].astype(bool).to_numpy()
    shapes = {"attn_pre_proj": ((hq + 2 * hkv) * d // tp, e),
              "attn_post_proj": (e, hq * d // tp),
              "mlp_up_proj": (np.where(gated, 2, 1) * f // tp, e),
              "mlp_down_proj": (e, f // tp)}
    return shapes[op]


def extract_gemm(git_dir: str) -> pd.DataFrame:
    parts = []
    for gpu in ("a100", "h100"):
        for model in MODELS:
            df = _csv(git_dir, COMMIT, f"data/profiling/compute/{gpu}/{model}/mlp.csv")
            df = df.drop_duplicates(["num_tensor_parallel_workers", "num_tokens"])
            tokens = np.sort(df["num_tokens"].unique())[::4]
            df = df[df["num_tokens"].isin(tokens)]
            for op in OPS:
                n, k = gemm_shapes(df, op)
                parts.append(pd.DataFrame({
                    "gpu": gpu, "model": model.split("/")[1].removesuffix("-hf").lower(),
                    "op": OPS[op], "tp": df["num_tensor_parallel_workers"].to_numpy(),
                    "m": df["num_tokens"].to_numpy(), "n": n, "k": k,
                    "latency_us": (df[f"time_stats.{op}.median"] * 1e3).round(1).to_numpy()}))
    return pd.concat(parts, ignore_index=True)


def extract_all_reduce(git_dir: str) -> pd.DataFrame:
    parts = []
    for gpu in ("a100", "h100"):
        df = _csv(git_dir, COMMIT, f"data/profiling/network/{gpu}_dgx/all_reduce.csv")
        df = df[df["num_workers"] == df["devices_per_node"]].drop_duplicates(
            ["num_workers", "size"])
        sizes = np.sort(df["size"].unique())[::3]
        df = df[df["size"].isin(sizes)]
        parts.append(pd.DataFrame({
            "gpu": gpu, "num_gpus": df["num_workers"].to_numpy(),
            "message_bytes": df["size"].to_numpy(),
            "latency_us": (df["time_stats.all_reduce.median"] * 1e3).round(1).to_numpy()}))
    return pd.concat(parts, ignore_index=True)


def extract_attention(git_dir: str) -> pd.DataFrame:
    df = _csv(git_dir, ATTENTION_COMMIT, "data/profiling/a100/attention.csv")
    prefill = df["is_prefill"].astype(bool)
    decode = df[~prefill].sample(n=1500, random_state=17).sort_index()
    df = pd.concat([df[prefill].iloc[::2], decode])
    prefill = df["is_prefill"].astype(bool)
    tp = df["num_tensor_parallel_workers"]
    col = np.where(prefill, "time_stats.attn_prefill.median", "time_stats.attn_decode.median")
    ms = df.to_numpy()[np.arange(len(df)), [df.columns.get_loc(c) for c in col]]
    return pd.DataFrame({
        "phase": np.where(prefill, "prefill", "decode"),
        "batch_size": df["batch_size"].to_numpy(),
        "q_len": np.where(prefill, df["prefill_chunk_size"], 1),
        "kv_len": df["kv_cache_size"].to_numpy(),
        "num_heads": (df["n_q_head"] // tp).to_numpy(),
        "num_key_value_heads": (df["n_kv_head"] // tp).to_numpy(),
        "head_dim": (df["n_embd"] // df["n_q_head"]).to_numpy(),
        "latency_us": np.round(ms.astype(float) * 1e3, 1)}).reset_index(drop=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("git_dir", help="git directory of github.com/microsoft/vidur")
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    for name, df in (("vidur_gemm", extract_gemm(args.git_dir)),
                     ("vidur_all_reduce", extract_all_reduce(args.git_dir)),
                     ("vidur_attention", extract_attention(args.git_dir))):
        df.to_csv(OUT / f"{name}.csv", index=False)
        print(f"{name}.csv: {len(df)} rows")


if __name__ == "__main__":
    main()
