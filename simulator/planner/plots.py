"""Figures of the planner: the Pareto plot of a plan and the latency-vs-rate curve of a
capacity search. matplotlib is imported inside the drawing functions (it costs ~2 s of
start-up that ``plan`` and ``capacity`` without figures should not pay).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from simulator.planner.space import cross_kind


def pareto_front(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Mask of the points no other point beats on both axes (both maximized).

    A point is dominated when some other point has ``x' >= x`` and ``y' >= y`` with one
    of them strictly greater. NaN points are never on the front.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y)
    front = np.zeros(len(x), dtype=bool)
    for i in np.flatnonzero(ok):
        ge = ok & (x >= x[i]) & (y >= y[i])
        gt = (x > x[i]) | (y > y[i])
        front[i] = not np.any(ge & gt)
    return front


def pareto_plot(table: pd.DataFrame, path: str | Path, title: str = "") -> Path:
    """Throughput per GPU, and per dollar when the rows carry ``gpu_hour_usd``, against
    tokens/s per user (1 / TPOT p50) of the simulated candidates; the Pareto front joined,
    SLO misses hollow, the pick and the rule of thumb labelled. Writes a PNG to ``path``."""
    import matplotlib  # noqa: PLC0415 - on use (start-up cost)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    ok = table[table["tok_per_s_per_user"].notna()]  # runs that failed have no speed
    x = ok["tok_per_s_per_user"].to_numpy(dtype=float)
    per_gpu = ok["throughput_tok_per_s_per_gpu"].to_numpy(dtype=float)
    panels = [(per_gpu, "throughput per GPU (output tok/s)")]
    if "gpu_hour_usd" in ok and ok["gpu_hour_usd"].notna().all() and len(ok):
        usd = per_gpu * 3600.0 / ok["gpu_hour_usd"].to_numpy(dtype=float)
        panels.append((usd, "output tokens per dollar"))
    met = ok["slo_met"].to_numpy(dtype=bool)
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 4.5), squeeze=False)
    for ax, (y, ylabel) in zip(axes[0], panels, strict=True):
        front = pareto_front(x, y)
        ax.scatter(x[met], y[met], color="tab:blue", label="meets the SLOs", zorder=3)
        ax.scatter(x[~met], y[~met], facecolors="none", edgecolors="tab:red",
                   label="misses an SLO", zorder=3)
        order = np.argsort(x[front])
        ax.plot(x[front][order], y[front][order], color="tab:blue", alpha=0.5,
                linestyle="--", label="Pareto front")
        drawn: set[str] = set()
        for (_, r), xi, yi in zip(ok.iterrows(), x, y, strict=True):
            text = f"{int(r['tp'])}/{int(r['pp'])}/{int(r['dp'])}"
            if r.get("kind") == "disaggregated":  # prefill pool + decode pool
                text = (f"P{int(r['prefill_tp'])}/{int(r['prefill_pp'])}/"
                        f"{int(r['prefill_dp'])}+D{text}")
            k = r.get("spec_k")
            if k is not None and k == k and int(k) > 0:
                text += f" k{int(k)}"
            if isinstance(r.get("node"), str):  # a cross-kind pair: prefill kind>decode kind
                text = f"{r['node']}{'>' + cross_kind(r) if cross_kind(r) else ''} {text}"
            if r["rank"] == 1 and r["slo_met"]:
                text += " pick"
            if "rule of thumb" in str(r["note"]):
                text += " rule"
            if text in drawn:  # engine-limit variants of a layout: one label
                continue
            drawn.add(text)
            ax.annotate(text, (xi, yi), textcoords="offset points", xytext=(4, 3),
                        fontsize=7)
        ax.set_xlabel("tokens/s per user (1 / TPOT p50); labels: TP/PP/DP "
                      "(P.../D...: prefill/decode pools, k: drafts)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title or "plan: TP/PP/DP of the simulated candidates", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def capacity_plot(curve: pd.DataFrame, path: str | Path, rate_per_s: float,
                  ttft_slo_s: float, tpot_slo_s: float, quantile: float,
                  title: str = "") -> Path:
    """TTFT and TPOT at the SLO quantile against the offered rate, with the SLO targets
    and the capacity found. Writes a PNG to ``path``."""
    import matplotlib  # noqa: PLC0415 - on use (start-up cost)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    c = curve.sort_values("rate_per_s")
    p = f"p{quantile * 100:g}"
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, col, slo, name in ((axes[0], "ttft_slo_q_s", ttft_slo_s, "TTFT"),
                               (axes[1], "tpot_slo_q_s", tpot_slo_s, "TPOT")):
        y = c[col].to_numpy(dtype=float)
        y = np.where(np.isfinite(y), y, np.nan)
        met = c["met"].to_numpy(dtype=bool)
        ax.plot(c["rate_per_s"], y, color="grey", linewidth=1)
        ax.scatter(c["rate_per_s"][met], y[met], color="tab:blue", label="sustained", zorder=3)
        ax.scatter(c["rate_per_s"][~met], y[~met], facecolors="none", edgecolors="tab:red",
                   label="not sustained", zorder=3)
        ax.axhline(slo, color="black", linestyle="--", linewidth=1, label=f"SLO {slo:g} s")
        ax.axvline(rate_per_s, color="tab:green", linewidth=1,
                   label=f"capacity {rate_per_s:.3g} req/s")
        ax.set_xlabel("offered rate (req/s)")
        ax.set_ylabel(f"{name} {p} (s)")
        if np.nanmax(y) / max(np.nanmin(y), 1e-9) > 50:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title or "capacity search")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
