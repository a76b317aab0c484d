"""Goodput vs arrival rate, colocated vs disaggregated, for docs/disaggregation.md.

Runs workloads/disagg-70b-colocated.toml and workloads/disagg-70b-1p1d.toml (Llama-3.1-70B
on two DGX H100 nodes) over a grid of rates for a long-prompt and a short-prompt workload,
prints one row per run and draws docs/img/disagg-goodput.png.

    PYTHONPATH=. python benchmarks/docs/disagg_curves.py [--requests 400] [--seconds 60]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from simulator import load_scenario, run  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = {"colocated TP8 x DP2": "workloads/disagg-70b-colocated.toml",
           "1 prefill + 1 decode node (TP8 each)": "workloads/disagg-70b-1p1d.toml"}
#: workload -> (overrides, SLO overrides, rates, a tighter TPOT SLO to plot too or None):
#: the long-prompt one at a tight TPOT SLO, the short-prompt one at a looser one.
WORKLOADS = {
    "long prompts (4k in, 256 out), TTFT <= 1 s, TPOT <= 20 ms": (
        [], ["slo.ttft_s=1.0", "slo.tpot_s=0.02"], (1.0, 2.0, 3.0, 4.0, 5.0, 6.0), 0.015),
    "short prompts (256 in, 256 out), TTFT <= 1 s, TPOT <= 50 ms": (
        ["workload.prompt_tokens={ dist = \"lognormal\", mean = 256, sigma = 0.5, max = 2048 }"],
        ["slo.ttft_s=1.0", "slo.tpot_s=0.05"], (8.0, 16.0, 32.0, 48.0, 64.0, 80.0), None),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=400, help="fewest requests per run")
    ap.add_argument("--seconds", type=float, default=60.0,
                    help="arrivals per run: at least rate x this many seconds' worth")
    args = ap.parse_args()
    rows = []
    for wname, (over, slo, rates, tight_s) in WORKLOADS.items():
        for cname, path in CONFIGS.items():
            for rate in rates:
                n = max(args.requests, int(rate * args.seconds))
                s = load_scenario(ROOT / path, overrides=[*over, *slo,
                                                          f"workload.rate_per_s={rate}",
                                                          f"workload.num_requests={n}"])
                res = run(s, keep_steps=False)
                r = res.summary
                done = res.requests[res.requests["status"] == "completed"]
                ttft_ok = done["ttft_s"] <= s.slo.ttft_s
                ok = ttft_ok & (done["tpot_s"].isna() | (done["tpot_s"] <= s.slo.tpot_s))
                tight = ttft_ok & (done["tpot_s"].isna()
                                   | (done["tpot_s"] <= (tight_s or s.slo.tpot_s)))
                scale = tight.sum() / ok.sum() if ok.sum() else 0.0
                rows.append({"workload": wname, "config": cname, "rate_per_s": rate,
                             "goodput_req_per_s": r["goodput_req_per_s"],
                             "goodput_per_gpu": r["goodput_req_per_s_per_gpu"],
                             "slo_attainment": r["slo_attainment"],
                             "ttft_p99_s": r["ttft_p99_s"], "tpot_p99_s": r["tpot_p99_s"],
                             "kv_transfer_p99_s": r["kv_transfer_p99_s"],
                             "goodput_per_gpu_tight_tpot": r["goodput_req_per_s_per_gpu"] * scale,
                             "decode_wait_p99_s": r.get("decode_wait_p99_s", float("nan")),
                             "prefill_util": r.get("pool_utilization", {}).get("prefill",
                                                                               float("nan")),
                             "usd_per_mtok": r["cost_per_million_tokens_usd"]})
                print(pd.DataFrame([rows[-1]]).to_string(index=False, header=len(rows) == 1,
                                                         float_format="%.4g"), flush=True)
    df = pd.DataFrame(rows)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (wname, g) in zip(axes, df.groupby("workload", sort=False), strict=True):
        for cname, c in g.groupby("config", sort=False):
            line, = ax.plot(c["rate_per_s"], c["goodput_per_gpu"], marker="o", label=cname)
            tight_s = WORKLOADS[wname][3]
            if tight_s is not None:
                ax.plot(c["rate_per_s"], c["goodput_per_gpu_tight_tpot"], ls="--", marker=".",
                        color=line.get_color(), label=f"{cname}, TPOT <= {tight_s * 1e3:.0f} ms")
        ax.set_title(wname, fontsize=9)
        ax.set_xlabel("arrival rate (req/s)")
        ax.set_ylabel("goodput per GPU (req/s within SLO)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    out = ROOT / "docs" / "img" / "disagg-goodput.png"
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
