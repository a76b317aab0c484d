"""Plots of runs and sweeps: matplotlib functions ``(data, ..., ax=None) -> Axes``.

Used by ``python -m simulator plot`` and importable in notebooks. Nothing here computes a
metric: the data come from the run's tables (requests, steps, timeseries, alerts).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files, not windows; notebooks switch back with %matplotlib inline

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from simulator.io.scenario import read_toml  # noqa: E402

LABELS = {"ttft_s": "TTFT (s)", "tpot_s": "TPOT (s)", "e2e_s": "end-to-end latency (s)"}


def _ax(ax):
    return ax if ax is not None else plt.subplots(figsize=(6, 4))[1]


def cdf(requests: pd.DataFrame, metric: str = "ttft_s", slo: float | None = None,
        ax=None, label: str | None = None):
    """Empirical CDF of a per-request latency, with the SLO as a vertical line."""
    ax = _ax(ax)
    v = np.sort(requests[metric].dropna().to_numpy())
    if len(v):
        ax.plot(v, np.arange(1, len(v) + 1) / len(v), label=label)
    if slo:
        ax.axvline(slo, color="grey", linestyle="--", linewidth=1, label=f"SLO {slo:g} s")
    ax.set_xlabel(LABELS.get(metric, metric))
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.01)
    if len(v) and v[0] > 0 and v[-1] / v[0] > 100:
        ax.set_xscale("log")
    ax.grid(alpha=0.3)
    return ax


def over_time(ts: pd.DataFrame, columns: list[str], alerts: pd.DataFrame | None = None,
              ax=None, ylabel: str = ""):
    """Window columns against time; alert firings as red marks on the time axis."""
    ax = _ax(ax)
    t = ts["window_start_s"].to_numpy()
    for c in columns:
        if c in ts:
            ax.plot(t, ts[c].to_numpy(), label=c, linewidth=1)
    if alerts is not None and not alerts.empty:
        fired = alerts[(alerts["event"] == "fire") & (alerts["replica"].astype(str) == "all")]
        for _, a in fired.iterrows():
            ax.axvline(a["time_s"], color="red", alpha=0.4, linewidth=1)
        if not fired.empty:
            ax.plot([], [], color="red", alpha=0.4, label="alert fired")
    ax.set_xlabel("time (s)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if columns:
        ax.legend(fontsize=7, loc="upper right")
    return ax


def pipeline_gantt(steps: pd.DataFrame, until_s: float | None = None, ax=None,
                   max_replicas: int = 4):
    """Each replica stage as a lane, each step as a bar (prefill darker): the white gaps
    between bars are the pipeline bubbles."""
    ax = _ax(ax)
    if steps.empty:
        return ax
    t0 = steps["start_s"].min()
    until = t0 + (until_s if until_s is not None else 2.0)
    s = steps[(steps["start_s"] < until) & (steps["replica"] < max_replicas)]
    lanes = sorted({(r, st) for r, st in zip(s["replica"], s["stage"], strict=True)})
    for y, (r, st) in enumerate(lanes):
        g = s[(s["replica"] == r) & (s["stage"] == st)]
        spans = list(zip(g["start_s"], g["end_s"] - g["start_s"], strict=True))
        colors = np.where(g["prefill_tokens"] > 0, "tab:orange", "tab:blue")
        ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=colors)
    ax.set_yticks(range(len(lanes)), [f"r{r} s{st}" for r, st in lanes])
    ax.set_xlim(t0, until)
    ax.set_xlabel("time (s)")
    ax.set_title("steps per replica stage (orange: with prefill; gaps: bubbles)")
    return ax


def gpu_heatmap(gpu_ts: pd.DataFrame, value: str = "compute_util", ax=None):
    """Utilization per GPU (rows) over windows (columns)."""
    ax = _ax(ax)
    grid = gpu_ts.pivot_table(index="gpu", columns="window_start_s", values=value)
    im = ax.imshow(grid.to_numpy(), aspect="auto", interpolation="nearest", vmin=0,
                   vmax=max(1e-9, float(np.nanmax(grid.to_numpy()))), cmap="viridis",
                   extent=(grid.columns.min(), grid.columns.max(), len(grid) - 0.5, -0.5))
    ax.figure.colorbar(im, ax=ax, label=value)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("GPU")
    return ax


def sweep_plot(df: pd.DataFrame, x: str, y: str, hue: str | None = None, ax=None):
    """A metric of a sweep against a swept key (one line per value of ``hue``)."""
    ax = _ax(ax)
    ok = df[df["status"] == "ok"] if "status" in df else df
    groups = ok.groupby(hue) if hue else [(None, ok)]
    for key, g in groups:
        g = g.groupby(x, as_index=False)[y].mean().sort_values(x)
        ax.plot(g[x], g[y], marker="o", label=f"{hue}={key}" if hue else None)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.grid(alpha=0.3)
    if hue:
        ax.legend(fontsize=8)
    return ax


def _save(ax, path: Path) -> Path:
    fig = ax.figure if hasattr(ax, "figure") else ax
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_report(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Every plot of a run directory as PNGs in ``out_dir`` (default: the run directory)."""
    run = Path(run_dir)
    out = Path(out_dir) if out_dir else run
    out.mkdir(parents=True, exist_ok=True)
    requests = pd.read_csv(run / "requests.csv")
    slo = read_toml(run / "scenario.toml").get("slo", {}) if (run / "scenario.toml").exists() \
        else {}
    files = []
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    cdf(requests, "ttft_s", slo.get("ttft_s"), axes[0])
    cdf(requests, "tpot_s", slo.get("tpot_s"), axes[1])
    cdf(requests, "e2e_s", None, axes[2])
    for a in axes:
        if a.get_legend_handles_labels()[0]:
            a.legend(fontsize=8)
    files.append(_save(fig, out / "latency_cdf.png"))
    if (run / "timeseries.csv").exists():
        ts = pd.read_csv(run / "timeseries.csv")
        al = pd.read_csv(run / "alerts.csv") if (run / "alerts.csv").exists() else None
        fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
        over_time(ts, ["output_tok_per_s"], al, axes[0], "output tokens/s")
        over_time(ts, ["queue_len", "running"], al, axes[1], "requests")
        kv = [c for c in ts.columns if c.startswith("kv_util_r")][:16]
        over_time(ts, kv, al, axes[2], "KV cache utilization")
        files.append(_save(fig, out / "timeseries.png"))
        if "prefix_hit_rate" in ts and ts["prefix_hit_rate"].fillna(0).gt(0).any():
            fig, ax = plt.subplots(figsize=(10, 3))  # prefix caching (docs/prefix-caching.md)
            over_time(ts, ["prefix_hit_rate"], al, ax, "prefix hit rate (tokens)")
            files.append(_save(fig, out / "prefix_hit_rate.png"))
    if (run / "steps.csv").exists():
        steps = pd.read_csv(run / "steps.csv")
        fig, ax = plt.subplots(figsize=(12, 4))
        pipeline_gantt(steps, 2.0, ax)
        files.append(_save(fig, out / "pipeline_gantt.png"))
    if (run / "gpu_timeseries.csv").exists():
        gts = pd.read_csv(run / "gpu_timeseries.csv")
        fig, ax = plt.subplots(figsize=(10, 5))
        gpu_heatmap(gts, "compute_util", ax)
        files.append(_save(fig, out / "gpu_heatmap.png"))
    return files
