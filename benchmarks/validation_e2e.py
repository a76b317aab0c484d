"""End-to-end check against real serving runs: median TPOT / TTFT error per (GPU, engine, mode).

    python benchmarks/validation_e2e.py [--data ../shared/validation] [--per-group 3]
                                        [--max-concurrency 32]

Reproduces aggregated runs of ``../shared/validation/`` (NVIDIA AIConfigurator's silicon
data, Apache-2.0: DeepSeek-V3 and Qwen3-32B at fixed ISL/OSL and fixed concurrency) as
closed-loop scenarios under the run's engine profile, and prints the signed error of the
simulated mean TPOT and TTFT per row and their medians per (GPU, engine, mode). A seeded
sample of ``--per-group`` rows per (model, GPU, engine) keeps it to minutes. Use it to find
wrong physics, never to fit numbers. Disaggregated rows are not reproduced (their TTFTs do
not behave like queueing, the README says; layouts need worker counts).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import simulator  # noqa: E402
from simulator.errors import ScenarioError  # noqa: E402
from simulator.paths import ROOT  # noqa: E402

TOPOLOGY = {"h100_sxm": "dgx-h100", "h200_sxm": "hgx-h200", "b200_sxm": "hgx-b200",
            "gb200": "gb200-nvl72"}
PROFILE = {"vllm": "vllm-v1", "sglang": "sglang", "trtllm": "trtllm"}
MODEL = {"deepseek-ai/DeepSeek-V3": "deepseek-v3", "Qwen/Qwen3-32B": "qwen3-32b"}
#: The runs' GEMM precision -> the scenario's weight dtype.
WEIGHTS = {"fp8": "fp8", "fp8_block": "fp8", "nvfp4": "fp4", "": "bf16"}


def _int(row: pd.Series, col: str, default: int = 1) -> int:
    v = row.get(col)
    return default if v is None or pd.isna(v) else int(v)


def layout(row: pd.Series, moe: bool) -> dict | None:
    """Our parallel keys for the run's layout (None: not expressible). Attention DP d with
    EP d -> tp = ep = d with attention DP; attention TP t with EP t or MoE-TP t -> tp t."""
    tp, dp, pp = _int(row, "tp_size"), _int(row, "attention_dp_size"), _int(row, "pp_size")
    if not moe:
        return {"tp": tp, "pp": pp, "dp": 1}
    ep, etp = _int(row, "moe_ep_size"), _int(row, "moe_tp_size")
    if dp == 1 and ep == 1:
        return {"tp": tp, "pp": pp, "dp": 1, "ep": 1}
    if dp == 1 and ep == tp:
        return {"tp": tp, "pp": pp, "dp": 1, "ep": ep}
    if tp * dp == ep and etp == 1:
        return {"tp": ep, "pp": pp, "dp": 1, "ep": ep, "attention_dp": dp > 1}
    return None


def scenario(row: pd.Series) -> dict | None:
    """A closed-loop scenario of one run, or None when it cannot be expressed."""
    model = MODEL.get(row["model_path"])
    moe = model == "deepseek-v3"
    par = layout(row, moe)
    if model is None or par is None or row["system"] not in TOPOLOGY:
        return None
    conc = _int(row, "concurrency", _int(row, "batch_size"))
    gpus = par["tp"] * par["pp"]
    per_node = 4 if row["system"] == "gb200" else 8
    name = (f"{model}-{row['system']}-{row['backend']}-{int(row['isl'])}x{int(row['osl'])}"
            f"-c{conc}")
    return {"name": name, "seed": 0,
            "model": {"name": model,
                      "weight_dtype": WEIGHTS.get(str(row["gemm_quant_mode"] or ""), "bf16")},
            "cluster": {"topology": TOPOLOGY[row["system"]],
                        "nodes": max(1, -(-gpus // per_node))},
            "parallel": par,
            "engine": {"profile": PROFILE[row["backend"]], "max_num_seqs": max(conc, 1)},
            "workload": {"arrival": "closed_loop", "concurrency": conc,
                         "num_requests": max(2 * conc, 8), "prompt_tokens": int(row["isl"]),
                         "output_tokens": int(row["osl"])},
            "output": {"steps": False, "trace": False}}


def rows(folder: Path, per_group: int, max_conc: int, seed: int = 0) -> pd.DataFrame:
    """The aggregated runs at concurrency <= ``max_conc``, a seeded sample of
    ``per_group`` per (model, GPU, engine)."""
    parts = []
    for f in sorted(folder.glob("silicon_*.csv")):
        df = pd.read_csv(f, keep_default_na=False, na_values=[""])
        if "mode" not in df:
            df["mode"] = "agg"
        df["gemm_quant_mode"] = df["gemm_quant_mode"].fillna("")
        parts.append(df[df["mode"] == "agg"])
    df = pd.concat(parts, ignore_index=True)
    conc = df["concurrency"].fillna(df["batch_size"]) if "concurrency" in df else df["batch_size"]
    df = df[conc <= max_conc]
    shuffled = df.sample(frac=1.0, random_state=seed)
    return shuffled.groupby(["model_path", "system", "backend"]).head(per_group)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "validation"))
    ap.add_argument("--per-group", type=int, default=3)
    ap.add_argument("--max-concurrency", type=int, default=32,
                    help="only runs at this concurrency or less (simulation time)")
    args = ap.parse_args()
    folder = Path(args.data)
    if not folder.is_dir():
        print(f"--data: {args.data!r} not found", file=sys.stderr)
        return 2
    out = []
    for _, row in rows(folder, args.per_group, args.max_concurrency).iterrows():
        s = scenario(row)
        if s is None:
            continue
        try:
            res = simulator.run(simulator.load_scenario(s))
        except ScenarioError as exc:
            print(f"skip {s['name']}: {exc}")
            continue
        tpot, ttft = res.summary["tpot_mean_s"] * 1e3, res.summary["ttft_mean_s"] * 1e3
        out.append({"gpu": row["system"], "engine": row["backend"], "mode": row["mode"],
                    "model": s["model"]["name"], "run": s["name"],
                    "tpot_err_pct": (tpot / row["silicon_tpot_ms"] - 1) * 100,
                    "ttft_err_pct": (ttft / row["silicon_ttft_ms"] - 1) * 100})
        print(f"{s['name']:<60} TPOT {tpot:8.2f} ms vs {row['silicon_tpot_ms']:8.2f}  "
              f"TTFT {ttft:9.1f} ms vs {row['silicon_ttft_ms']:9.1f}", flush=True)
    df = pd.DataFrame(out)
    if df.empty:
        return 0
    g = df.groupby(["gpu", "engine", "mode", "model"])
    def med_abs(col):
        return g[col].apply(lambda e: e.abs().median())

    table = pd.DataFrame({"runs": g.size(), "tpot_median_abs_pct": med_abs("tpot_err_pct"),
                          "tpot_bias_pct": g["tpot_err_pct"].median(),
                          "ttft_median_abs_pct": med_abs("ttft_err_pct")})
    print("\n| GPU | engine | mode | model | runs | TPOT median abs. error % | TPOT bias % "
          "| TTFT median abs. error % |\n|---|---|---|---|---|---|---|---|")
    for (gpu, engine, mode, model), r in table.iterrows():
        print(f"| {gpu} | {engine} | {mode} | {model} | {int(r['runs'])} | "
              f"{r['tpot_median_abs_pct']:.1f} | {r['tpot_bias_pct']:+.1f} | "
              f"{r['ttft_median_abs_pct']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
