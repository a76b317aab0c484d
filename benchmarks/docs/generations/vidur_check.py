"""Our A100 and H100 kernel models against Microsoft Vidur's public profiles.

Vidur (github.com/microsoft/vidur, MIT) profiled the same kernels on A100 80GB and H100
with its own harness (sarathi-serve, PyTorch, fp16; see ``data/README.md`` for what each
column times). The H100 rows measure how far Vidur's kernels and timing method sit from
the model calibrated on AIConfigurator's H100 data (the *source* difference); the A100 rows
measure the *transfer* error of the A100 preset (H100 calibration carried over by
``simulator/calibration/generations.py``); and where the same shape was timed on both GPUs,
the A100/H100 ratio within Vidur against our model's ratio isolates the generation transfer
from the source difference (both cancel in a ratio of one source).

Prints, per GPU and family, the rows, median |error| % and signed median error %
(predicted - measured), then the generation-ratio table, then a diagnostic: the one factor
on the A100's NCCL efficiencies that its all-reduce rows ask for, fitted on half of them and
checked on the other half (reported, not used by the model). About 3 s.

Usage: ``python benchmarks/docs/generations/vidur_check.py``
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from simulator.calibration import check, forms
from simulator.hardware.specs import GPUSpec, load_gpu

DATA = Path(__file__).resolve().parent / "data"
#: Vidur's device names -> our GPU presets.
PRESETS = {"a100": "a100_sxm", "h100": "h100_sxm"}
#: Columns that name one measured shape, per family (rows on both GPUs pair on them).
KEYS = {"gemm": ["model", "op", "tp", "m", "n", "k"],
        "all_reduce": ["num_gpus", "message_bytes"],
        "attention": ["phase", "batch_size", "q_len", "kv_len", "num_heads"]}


def load(folder: Path = DATA) -> dict[str, pd.DataFrame]:
    """The three extracted CSVs, keyed ``gemm``, ``all_reduce``, ``attention``."""
    data = {f: pd.read_csv(folder / f"vidur_{f}.csv") for f in KEYS}
    data["attention"] = data["attention"].assign(gpu="a100")  # only A100 was readable
    return data


def predict_gemm(gpu: GPUSpec, df: pd.DataFrame) -> np.ndarray:
    """Seconds of each fp16 GEMM row (``m``, ``n``, ``k`` per TP rank)."""
    return check.predict_gemm(gpu, df.assign(dtype="float16"))


def predict_attention(gpu: GPUSpec, df: pd.DataFrame) -> np.ndarray:
    """Seconds of each FlashAttention-with-KV-cache call of Vidur's attention profile.

    A prefill row is ``batch_size`` chunks of ``q_len`` new tokens after ``kv_len`` cached
    ones (causal pairs ``q (kv + (q + 1) / 2)`` per chunk); a decode row is ``batch_size``
    sequences of one new token reading ``kv_len + 1`` cached entries (the kernel appends the
    new K/V before reading).
    """
    b, q, kv = (df[c].to_numpy(float) for c in ("batch_size", "q_len", "kv_len"))
    shape = forms.AttentionShape(df["num_heads"].to_numpy(float),
                                 df["num_key_value_heads"].to_numpy(float),
                                 df["head_dim"].to_numpy(float), 2, gpu.peak("fp16"),
                                 gpu.hbm_bandwidth_Bps, gpu.sm_count)
    cal = gpu.calibration
    prefill = forms.prefill_time(shape, cal.prefill_for("fp16"), b * q,
                                 b * q * (kv + (q + 1) / 2), b * kv, b)
    decode = forms.decode_time(shape, cal.decode_for("fp16"), b, b * (kv + 1))
    return np.where(df["phase"].to_numpy() == "prefill", prefill, decode)


def predict_all_reduce(gpu: GPUSpec, df: pd.DataFrame) -> np.ndarray:
    """Seconds of each fp16 NCCL all-reduce inside the GPU's DGX node preset."""
    rows = df.assign(op_name="all_reduce", dtype="float16")
    return check.predict_collective(gpu, rows, "nccl", check.scale_up_for(gpu))


#: Factors :func:`fit_nccl_factor` tries.
FACTORS = np.arange(0.30, 1.0001, 0.005)

PREDICT = {"gemm": predict_gemm, "attention": predict_attention,
           "all_reduce": predict_all_reduce}


def regime(family: str, df: pd.DataFrame) -> np.ndarray:
    """Finer family names: GEMMs by tokens (memory-bound up to 64 rows, compute-bound from
    1,024), attention by phase, all-reduce by size (latency up to 256 KiB, bandwidth from
    16 MiB)."""
    if family == "gemm":
        m = df["m"].to_numpy()
        return np.select([m <= 64, m >= 1024], ["gemm m<=64", "gemm m>=1024"], "gemm mid")
    if family == "attention":
        return ("attention " + df["phase"]).to_numpy()
    s = df["message_bytes"].to_numpy()
    return np.select([s <= 256 * 2**10, s >= 16 * 2**20],
                     ["all_reduce <=256KiB", "all_reduce >=16MiB"], "all_reduce mid")


def compare(gpus: dict[str, GPUSpec], data: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Every measured row with ``family``, ``regime``, ``predicted_us`` and ``error_pct``
    (signed, (predicted - measured) / measured x 100); ``gpus`` maps Vidur's device names
    to the GPU models that price them."""
    parts = []
    for family, df in data.items():
        for name, rows in df.groupby("gpu", sort=True):
            pred = PREDICT[family](gpus[name], rows) * 1e6
            parts.append(rows.assign(
                family=family, regime=regime(family, rows), predicted_us=pred,
                error_pct=(pred - rows["latency_us"]) / rows["latency_us"] * 100))
    return pd.concat(parts, ignore_index=True)


def summarize(report: pd.DataFrame, by: str = "family") -> pd.DataFrame:
    """Rows, median |error| % and signed median error % per GPU and ``by``."""
    g = report.groupby(["gpu", by], sort=True)["error_pct"]
    return pd.DataFrame({"rows": g.size(),
                         "median_abs_error_pct": g.apply(lambda e: e.abs().median()),
                         "signed_median_error_pct": g.median()})


def generation_ratio(report: pd.DataFrame, slow: str = "a100",
                     fast: str = "h100") -> pd.DataFrame:
    """Shapes measured on both GPUs: the measured ratio ``t_slow / t_fast`` (median) and
    our model's, and the error of our ratio against Vidur's, per regime.

    ``ratio_error_pct = (model ratio / measured ratio - 1) x 100``: positive means our
    model makes the slower GPU too slow relative to the faster one. The source difference
    (Vidur's kernels against AIConfigurator's) cancels where it is the same on both GPUs.
    """
    out = []
    for family, keys in KEYS.items():
        rows = report[report["family"] == family]
        a, b = rows[rows["gpu"] == slow], rows[rows["gpu"] == fast]
        if a.empty or b.empty:
            continue
        both = a.merge(b, on=[*keys, "regime"], suffixes=("_s", "_f"))
        measured = both["latency_us_s"] / both["latency_us_f"]
        model = both["predicted_us_s"] / both["predicted_us_f"]
        out.append(pd.DataFrame({"regime": both["regime"], "measured_ratio": measured,
                                 "model_ratio": model,
                                 "ratio_error_pct": (model / measured - 1) * 100}))
    if not out:
        return pd.DataFrame(columns=["pairs", "measured_ratio", "model_ratio",
                                     "median_abs_ratio_error_pct", "signed_ratio_error_pct"])
    pairs = pd.concat(out, ignore_index=True)
    g = pairs.groupby("regime", sort=True)
    return pd.DataFrame({"pairs": g.size(), "measured_ratio": g["measured_ratio"].median(),
                         "model_ratio": g["model_ratio"].median(),
                         "median_abs_ratio_error_pct": g["ratio_error_pct"].apply(
                             lambda e: e.abs().median()),
                         "signed_ratio_error_pct": g["ratio_error_pct"].median()})


def with_nccl_factor(gpu: GPUSpec, factor: float) -> GPUSpec:
    """``gpu`` with its NCCL ring and tree efficiencies multiplied by ``factor`` (a
    diagnostic: what the A100 all-reduce rows ask for; not part of the model)."""
    p = gpu.calibration.collectives
    p = replace(p, ring_eff=p.ring_eff * factor, tree_eff=p.tree_eff * factor)
    return replace(gpu, calibration=replace(gpu.calibration, collectives=p))


def fit_nccl_factor(gpu: GPUSpec, rows: pd.DataFrame, grid: np.ndarray = FACTORS) -> float:
    """The factor of :func:`with_nccl_factor` (on ``grid``) with the smallest median
    |error| on the all-reduce ``rows``."""
    measured = rows["latency_us"].to_numpy()
    errors = [np.median(np.abs(predict_all_reduce(with_nccl_factor(gpu, f), rows) * 1e6
                               / measured - 1)) for f in grid]
    return float(grid[int(np.argmin(errors))])


def nccl_split_check(gpu: GPUSpec, rows: pd.DataFrame, seed: int = 17) -> dict[str, float]:
    """:func:`fit_nccl_factor` on a random half of ``rows`` (fixed seed), and the median
    |error| % of the other half before and after."""
    order = np.random.default_rng(seed).permutation(len(rows))
    fit_on, check_on = rows.iloc[order[: len(rows) // 2]], rows.iloc[order[len(rows) // 2:]]
    factor = fit_nccl_factor(gpu, fit_on)
    measured = check_on["latency_us"].to_numpy()
    before, after = (np.median(np.abs(predict_all_reduce(g, check_on) * 1e6 / measured - 1))
                     * 100 for g in (gpu, with_nccl_factor(gpu, factor)))
    return {"factor": factor, "check_rows": len(check_on), "before_pct": before,
            "after_pct": after}


def main() -> None:
    gpus = {name: load_gpu(preset) for name, preset in PRESETS.items()}
    data = load()
    report = compare(gpus, data)
    pd.set_option("display.width", 120)
    print("Errors against Vidur's profiles (predicted - measured), %\n")
    print(summarize(report).round(1).to_string(), "\n")
    print(summarize(report, "regime").round(1).to_string(), "\n")
    print("A100 / H100 time ratio on the same shapes, Vidur vs our model\n")
    print(generation_ratio(report).round(2).to_string(), "\n")
    ar = data["all_reduce"]
    rows = ar[(ar["gpu"] == "a100") & (ar["message_bytes"] > 256 * 2**10)]
    split = nccl_split_check(gpus["a100"], rows)
    print("Diagnostic, not in the model: one factor on the A100's NCCL ring and tree "
          f"efficiencies, fitted on a random half of its all-reduce rows above 256 KiB: "
          f"{split['factor']:.3f}; the other half ({split['check_rows']} rows), median "
          f"|error| {split['before_pct']:.1f}% -> {split['after_pct']:.1f}%")


if __name__ == "__main__":
    main()
