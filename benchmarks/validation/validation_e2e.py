"""End-to-end check against real serving runs: median TPOT / TTFT error per (GPU, engine, mode).

    python benchmarks/validation/validation_e2e.py [--data ../shared/validation] [--per-group 3]
                                        [--max-concurrency 32] [--mode agg|disagg|all]

Reproduces runs of ``../shared/validation/`` (NVIDIA AIConfigurator's silicon data,
Apache-2.0: DeepSeek-V3 and Qwen3-32B at fixed ISL/OSL and fixed concurrency) as
closed-loop scenarios under the run's engine profile (``simulator.io.silicon``: aggregated
runs as one replica of the run's layout driven by AIPerf as AIConfigurator ran it, 20 x
concurrency requests after one round of warm-ups, disaggregated runs as a prefill and a decode pool
of the run's worker counts and layouts), and prints the signed error of the simulated mean
TPOT and TTFT per row and their medians per (GPU, engine, mode). A seeded sample of
``--per-group`` rows per (model, GPU, engine, mode) keeps it to minutes; rows that cannot
be expressed are listed with the reason. Use it to find wrong physics, never to fit
numbers. Judge disaggregated runs on TPOT: their measured TTFTs do not behave like
queueing (the data's README).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import simulator  # noqa: E402
from simulator.errors import ScenarioError  # noqa: E402
from simulator.io.silicon import scenario  # noqa: E402
from simulator.paths import ROOT  # noqa: E402

MODES = {"agg": ("agg",), "disagg": ("disagg",), "all": ("agg", "disagg")}

def rows(folder: Path, per_group: int, max_conc: int, modes: tuple[str, ...] = ("agg",),
         seed: int = 0) -> pd.DataFrame:
    """The runs of ``modes`` at concurrency <= ``max_conc``, for each mode a seeded sample
    of ``per_group`` per (model, GPU, engine) (each mode's sample is the same whichever
    modes are asked for)."""
    parts = []
    for f in sorted(folder.glob("silicon_*.csv")):
        df = pd.read_csv(f, keep_default_na=False, na_values=[""])
        if "mode" not in df:
            df["mode"] = "agg"
        df["gemm_quant_mode"] = df["gemm_quant_mode"].fillna("")
        parts.append(df)
    df = pd.concat(parts, ignore_index=True)
    conc = df["concurrency"].fillna(df["batch_size"]) if "concurrency" in df else df["batch_size"]
    df = df[conc <= max_conc]
    picked = []
    for mode in modes:
        shuffled = df[df["mode"] == mode].sample(frac=1.0, random_state=seed)
        picked.append(shuffled.groupby(["model_path", "system", "backend"]).head(per_group))
    return pd.concat(picked)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "validation"))
    ap.add_argument("--per-group", type=int, default=3)
    ap.add_argument("--max-concurrency", type=int, default=32,
                    help="only runs at this concurrency or less (simulation time)")
    ap.add_argument("--mode", choices=tuple(MODES), default="agg",
                    help="aggregated runs, disaggregated runs (prefill and decode pools), "
                         "or both")
    args = ap.parse_args()
    folder = Path(args.data)
    if not folder.is_dir():
        print(f"--data: {args.data!r} not found", file=sys.stderr)
        return 2
    out = []
    for _, row in rows(folder, args.per_group, args.max_concurrency,
                       MODES[args.mode]).iterrows():
        s, why = scenario(row)
        if s is None:
            print(f"skip {row['system']} {row['backend']} {row['mode']}: {why}")
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
